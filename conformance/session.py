"""Running the conformance cases of one pytest session: the integration loaded once, each backend set up once (from
its row of :mod:`conformance.backend_table`), each scenario run once per integration and backend.

The pytest plugin (``weightsync_conformance.plugin``) turns its options into :class:`SessionOptions` and hands the
:class:`ConformanceSession` to the suite (``conformance.suite``) as the ``conformance_session`` fixture; nothing here
reads pytest's configuration. A backend that cannot run here skips its cases (``pytest.skip``) with its reason.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping, Protocol, Sequence

import pytest

from .backend_table import BACKENDS, BackendRow, row
from .cases import (CASES, BackendFactory, IntegrationError, RunAhead, ScenarioResult, batch_in_child, load_integration,
                    longest_first, run_isolated, run_one)
from .expectations import Expectations, load_expectations
from .families import DEFAULT_FAMILY, load
from .interface import Integration
from .preflight import Finding, release_check
from .scenarios import DEADLINES, Deadlines


class ScenarioRunError(Exception):
    """A scenario's run raised before any verdict existed (an engine lost, never healthy): every case of it fails
    with this message."""


class BackendSetup(Protocol):
    """What a backend row's factory builds, once per session. Optional, with these defaults when absent:
    ``deadlines() -> DEADLINES``, ``why_not(scenario) -> None`` (a scenario it cannot run: its cases skip with the
    reason), ``summary() -> []`` (lines for the terminal summary)."""

    def skip_reason(self) -> str | None:
        """Why this backend's cases cannot run here (one line), or None."""

    def backend_factory(self) -> BackendFactory:
        """A zero-argument factory of the engines of one scenario (``conformance.backends.Backend``)."""

    def close(self) -> None:
        """Release what the session held (engines, clusters, built models)."""


@dataclass(frozen=True)
class SessionOptions:
    """The session's choices, as the plugin read them from its options (``--conformance-*``)."""

    integration: str
    """``module:attribute`` of the session's integration."""
    integration_options: Mapping[str, Any] = field(default_factory=dict)
    expectations: Path | None = None
    profile: str = ""
    """The SGLang release the fake engines behave as."""
    engine: str = DEFAULT_FAMILY
    """The engine family the fake backend fakes and the GPU backend runs (:mod:`conformance.families`)."""
    seed: int = 0
    isolate: bool = False
    backend: Mapping[str, Any] = field(default_factory=dict)
    """The backends' own options that were given (``BackendRow.own``), by their set-up's keyword."""
    stops_session: bool = True
    """A failed preflight ends the pytest session (False in an xdist worker: it fails each case instead)."""


def _ask(setup: Any, method: str, default: Any, *args: Any) -> Any:
    """``setup.method(*args)``, or ``default`` where the set-up does without it (see :class:`BackendSetup`)."""
    found = getattr(setup, method, None)
    return default if found is None else found(*args)


class ConformanceSession:
    """What one pytest session knows about the conformance run: the integration under test (loaded once), the
    expectations file, each backend's set-up, and each scenario's result (run once per integration, scenario and
    backend)."""

    def __init__(self, options: SessionOptions) -> None:
        self.options = options
        self._integration: Integration | None = None
        self._expectations: Expectations | None = None
        self._cache: dict[tuple[int, str, str], ScenarioResult | Exception] = {}
        self._keep: dict[Any, Any] = {}
        self._setups: dict[str, Any] = {}
        self._release: dict[int, Finding | None] = {}
        self._ahead: RunAhead | None = None
        self.findings: list[Finding] = []
        """The preflight findings that stopped or failed this run."""

    # -- what is under test ----------------------------------------------------------------------------------------

    def integration(self) -> Integration:
        """The session's integration (``--conformance-integration``), loaded once."""
        if self._integration is None:
            self._integration = load_integration(self.options.integration, self.options.integration_options)
        return self._integration

    def expectations(self) -> Expectations | None:
        """The loaded expectations file, or None when none is configured."""
        if self.options.expectations is not None and self._expectations is None:
            self._expectations = load_expectations(self.options.expectations, [c.id for c in CASES])
        return self._expectations

    def resolve(self, integration: Any) -> Integration:
        """An adopter's class attribute (an Integration, a factory, or ``"module:attr"``) → the Integration."""
        key = integration if isinstance(integration, str) else id(integration)
        if key not in self._keep:
            if isinstance(integration, str):
                built = load_integration(integration)
            elif callable(integration) and not hasattr(integration, "build"):
                try:
                    built = integration()
                except Exception as exc:
                    raise IntegrationError(f"integration factory {getattr(integration, '__qualname__', integration)} "
                                           f"raised {type(exc).__name__}: {exc}") from None
            else:
                built = integration
            self._keep[key] = built
        return self._keep[key]

    # -- backends --------------------------------------------------------------------------------------------------

    def setup(self, backend: str) -> Any:
        """``backend``'s set-up (built at its first case from its table row); skips with its reason where it cannot
        run here."""
        entry = self._row(backend)
        if backend not in self._setups:
            factory: Callable[..., Any] = load(entry.setup)
            own = {o.key: self.options.backend[o.key] for o in entry.own if o.key in self.options.backend}
            self._setups[backend] = factory(**{name: getattr(self.options, name) for name in entry.options}, **own)
        reason = self._setups[backend].skip_reason()
        if reason:
            pytest.skip(reason)
        return self._setups[backend]

    def backend_factory(self, backend: str) -> BackendFactory:
        """The engines of ``backend``, one set per scenario."""
        return self.setup(backend).backend_factory()

    def _row(self, backend: str) -> BackendRow:
        try:
            return row(backend)
        except KeyError as exc:
            raise pytest.UsageError(f"weightsync-conformance: {exc.args[0]}") from None

    # -- running ---------------------------------------------------------------------------------------------------

    def run(self, integration: Integration, scenario: str, backend: str,
            ahead: Sequence[str] = ()) -> ScenarioResult:
        """``scenario`` against ``integration`` on ``backend`` → its ScenarioResult (each run once per session).
        On a backend whose row allows it, the scenarios ``ahead`` (those of the cases collected with this one) are
        started too, up to ``run_ahead`` at once, in a session that runs every case itself (not an xdist worker).
        Raises :class:`ScenarioRunError` when the run broke before any verdict."""
        entry = self._row(backend)
        key = (id(integration), scenario, backend)
        self._keep.setdefault(id(integration), integration)
        if key not in self._cache:
            self.setup(backend)  # its skip is raised here, never in a scenario's thread
            if self._ahead is None and entry.run_ahead and self.options.stops_session \
                    and not (entry.isolates and self.options.isolate):
                self._ahead = RunAhead(entry.run_ahead)
            if self._ahead is not None:  # started before the release check, which runs meanwhile
                self._start_ahead(integration, scenario, ahead, entry)
        if entry.preflight:
            self.check_release(integration, backend)
        if key not in self._cache:
            try:
                if self._ahead is None:
                    self._cache[key] = self._run(integration, scenario, entry)
                else:
                    self._cache[key] = self._ahead.result(key)
            except (pytest.UsageError, pytest.skip.Exception):
                raise
            except Exception as exc:  # the backend broke (an engine lost, never healthy): every case of it fails
                self._cache[key] = exc
        found = self._cache[key]
        if isinstance(found, Exception):
            raise ScenarioRunError(f"{scenario} on the {backend} backend: {found}")
        return found

    def _start_ahead(self, integration: Integration, scenario: str, ahead: Sequence[str], entry: BackendRow) -> None:
        """Start ``scenario`` and the scenarios ``ahead`` not started yet, longest first: where the integration can be
        loaded in another process (the session's own, on a backend whose row isolates scenarios), every second one
        in the helper process, the others in threads here."""
        assert self._ahead is not None

        def key(name: str) -> tuple[int, str, str]:
            return id(integration), name, entry.name
        order = [n for n in dict.fromkeys((scenario, *longest_first(ahead))) if not self._ahead.started(key(n))]
        there = order[1::2] if entry.isolates and integration is self._integration and len(order) > 2 else []
        if there:
            o = self.options
            deadlines: Deadlines = _ask(self.setup(entry.name), "deadlines", DEADLINES)
            self._ahead.submit_batch([key(n) for n in there], functools.partial(
                batch_in_child, there, o.integration, dict(o.integration_options), o.profile, o.seed, deadlines,
                entry.run_ahead, o.engine))
        for name in order:
            if name not in there:
                self._ahead.submit(key(name), functools.partial(self._run, integration, name, entry))

    def _run(self, integration: Integration, scenario: str, entry: BackendRow) -> ScenarioResult:
        o = self.options
        if entry.isolates and o.isolate:
            if integration is not self._integration:
                raise pytest.UsageError("--conformance-isolate-scenarios runs the integration named by "
                                        "--conformance-integration (a class attribute cannot be re-imported in a "
                                        "fresh process)")
            return run_isolated(scenario, o.integration, o.integration_options, o.profile, o.seed, engine=o.engine)
        if entry.family not in (None, o.engine):
            runs = [r.name for r in BACKENDS.values() if r.family in (None, o.engine)]
            return ScenarioResult(skipped=f"the {entry.name} backend runs {entry.family} engines; "
                                          f"--conformance-engine {o.engine} runs on {' and '.join(runs)}")
        setup = self.setup(entry.name)
        why = _ask(setup, "why_not", None, scenario)
        if why:
            return ScenarioResult(skipped=why)
        adapted = load(entry.adapt)(integration) if entry.adapt else integration
        factory = setup.backend_factory()
        deadlines: Deadlines = _ask(setup, "deadlines", DEADLINES)
        return run_one(scenario, adapted, factory, o.seed, deadlines)

    def check_release(self, integration: Integration, backend: str) -> None:
        """Before the integration's first scenario on ``backend``: the release check (:mod:`conformance.preflight`).
        Its message stops the run, once; where the session cannot be stopped (an xdist worker) it fails each of the
        integration's cases instead. Either way the finding is kept for the report (:attr:`findings`)."""
        if id(integration) not in self._release:
            self._release[id(integration)] = release_check(integration, self.backend_factory(backend),
                                                           self.options.seed)
        finding = self._release[id(integration)]
        if finding is None:
            return
        if finding not in self.findings:
            self.findings.append(finding)
        if not self.options.stops_session:
            pytest.fail(f"release check: {finding.message}", pytrace=False)
        pytest.exit(f"weightsync-conformance: {finding.message}", returncode=pytest.ExitCode.USAGE_ERROR)

    # -- the end ---------------------------------------------------------------------------------------------------

    def summary(self) -> list[str]:
        """What the backends cost (engines started, resets), for the terminal summary."""
        return [line for setup in self._setups.values() for line in _ask(setup, "summary", [])]

    def close(self) -> None:
        """Stop running ahead (runs not started are dropped), then close every backend's set-up, the last built
        first."""
        if self._ahead is not None:
            self._ahead.close()
            self._ahead = None
        setups, self._setups = list(self._setups.values()), {}
        errors = []
        for setup in reversed(setups):
            try:
                setup.close()
            except Exception as exc:  # the others still close
                errors.append(exc)
        if errors:
            raise errors[0]
