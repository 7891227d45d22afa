"""The conformance suite as data: (scenario, invariant) cases, run once per scenario and checked together.

The pytest suite (``conformance/suite``) and the mutation tests (``tests/test_mutants.py``) both run these
cases through :func:`run_cases`, so "the suite fails on a mutant" means exactly what a user would see.
"""

from __future__ import annotations

import functools
import importlib
import json
import multiprocessing
import threading
import time
from concurrent.futures import Future, ProcessPoolExecutor, ThreadPoolExecutor, as_completed
from dataclasses import dataclass, field, replace
from multiprocessing.connection import Connection
from typing import Any, Callable, Iterable, Iterator, Mapping, Sequence

from fakes.profiles import DEFAULT_PROFILE

from . import DEFAULT_INTEGRATION
from .anomaly import Anomaly, note
from .backends import Backend, FakeBackend, FakeBackendConfig
from .checks import CHECKS, REGISTRY, Verdict
from .families import DEFAULT_FAMILY
from .situations.registry import missing
from .history import Breakage, History
from .interface import Integration
from .loop import run_abandonable
from .scenarios import DEADLINES, SCENARIOS, Deadlines, Unsupported, open_calls, run_scenario
from .scenarios.capabilities import skips_shown, undeclared_shown

def scenario_bound_s(deadlines: Deadlines = DEADLINES) -> float:
    """The last-resort bound on one scenario's run: its script's deadline plus the teardown margin."""
    return deadlines.script_s + deadlines.teardown_s


@dataclass(frozen=True)
class Case:
    """One conformance test: an invariant checked on a scenario's history."""

    scenario: str
    check: str

    @property
    def id(self) -> str:
        return f"{self.check}-{self.scenario}"


CASES: list[Case] = [Case(s.name, c) for s in SCENARIOS.values() for c in s.checks]


def case_table() -> str:
    """The catalogue as the README shows it (``python -m conformance --case-table``): per scenario the situations
    it builds and the checks that judge it, every one whose needs it builds."""
    rows = [f"| `{s.name}` | {', '.join(sorted(s.situations - {'cycle', 'consumed'})) or '—'} | "
            f"{' '.join(REGISTRY[c].label for c in s.checks)} |" for s in SCENARIOS.values()]
    return "\n".join(["| scenario | builds (besides update cycles and consumed batches) | judged by |",
                      "|---|---|---|", *rows])


class IntegrationError(Exception):
    """The integration could not be loaded; the message says what to fix."""


def parse_options(pairs: Sequence[str]) -> dict[str, Any]:
    """``["k=v", ...]`` (``--integration-option``) → keyword arguments; a value is read as JSON when it parses
    (``3``, ``true``, ``"x"``, ``[1, 2]``), else kept as the string."""
    options: dict[str, Any] = {}
    for pair in pairs:
        key, sep, raw = pair.partition("=")
        if not sep or not key.isidentifier():
            raise IntegrationError(f"integration option {pair!r} must be KEY=VALUE with KEY a Python identifier")
        try:
            options[key] = json.loads(raw)
        except ValueError:
            options[key] = raw
    return options


def load_integration(spec: str, options: Mapping[str, Any] | None = None) -> Integration:
    """Import ``module:attribute`` and return the Integration it names. A callable that is not an Integration
    (a factory) is called, with ``options`` as keyword arguments (``--integration-option``)."""
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise IntegrationError(f"integration {spec!r} must be 'module:attribute', e.g. {DEFAULT_INTEGRATION!r}")
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:
        raise IntegrationError(f"cannot import integration module {module_name!r} ({type(exc).__name__}: {exc}); "
                               f"is it installed or on sys.path?") from exc
    try:
        obj = getattr(module, attr)
    except AttributeError:
        raise IntegrationError(f"module {module_name!r} has no attribute {attr!r} (integration {spec!r})") from None
    options = dict(options or {})
    if callable(obj) and not hasattr(obj, "build"):
        try:
            obj = obj(**options)
        except TypeError as exc:
            raise IntegrationError(f"integration factory {spec!r} does not take the options {sorted(options)} "
                                   f"({exc})") from None
        except Exception as exc:
            raise IntegrationError(f"integration factory {spec!r} raised {type(exc).__name__}: {exc}") from None
    elif options:
        raise IntegrationError(f"{spec!r} is an Integration, not a factory: it takes no options "
                               f"(got {sorted(options)}); point --integration at a callable that builds one")
    missing = [name for name in ("name", "capabilities", "build") if not hasattr(obj, name)]
    if missing:
        raise IntegrationError(f"{spec!r} is not an Integration: it lacks {missing} "
                               f"(see conformance.interface.Integration)")
    return obj


BackendFactory = Callable[[], Backend]


def fake_backend_factory(profile: str = DEFAULT_PROFILE, seed: int = 0, engines: int = 2,
                         engine: str = DEFAULT_FAMILY) -> BackendFactory:
    return lambda: FakeBackend(FakeBackendConfig(engines=engines, profile=profile, seed=seed, engine=engine))


@dataclass
class ScenarioResult:
    """A scenario's history, or why it could not run."""

    history: History | None = None
    skipped: str | None = None
    verdicts: dict[str, Verdict] = field(default_factory=dict)
    skipped_checks: dict[str, str] = field(default_factory=dict)
    """Checks of the scenario that cannot apply to the integration, with the reason (skipped, never passed)."""
    undeclared: list[dict[str, Any]] = field(default_factory=list)
    """Capabilities the history shows that the integration does not declare: ``capability``, ``evidence`` and the
    scenarios declaring it would run (``unlocks``)."""

    def skip_reason(self, check: str) -> str | None:
        """Why the case (this scenario, ``check``) is skipped, or None when it ran."""
        return self.skipped or self.skipped_checks.get(check)


def run_one(scenario: str, integration: Integration, backend_factory: BackendFactory, seed: int = 0,
            deadlines: Deadlines = DEADLINES) -> ScenarioResult:
    """Run one scenario on a fresh backend and check every invariant it is registered for (under ``deadlines``
    extended by the integration's declared update budget)."""
    s = SCENARIOS[scenario]
    deadlines = deadlines.with_update_budget(integration.capabilities.update_budget_s)
    try:
        s.resolve(integration)
    except Unsupported as exc:
        return ScenarioResult(skipped=str(exc))
    backend = backend_factory()
    skipped_checks = s.skipped_checks(integration, backend.profile)
    backend.start()
    bound = scenario_bound_s(deadlines)
    history: History | None = None
    try:
        outcome = run_abandonable(run_scenario(s, integration, backend, seed, deadlines), bound, f"scenario {s.name}")
        if isinstance(outcome.error, Unsupported):
            return ScenarioResult(skipped=str(outcome.error))
        if outcome.finished and outcome.error is not None:
            raise outcome.error
        history = outcome.result if outcome.finished else _hung(s.name, integration, backend, seed, str(outcome.error))
        if outcome.abandoned:
            history.breaks.append(Breakage(
                "hang", f"the integration left {len(outcome.abandoned)} task(s) running that did not stop when "
                f"cancelled ({', '.join(outcome.abandoned)}): they were abandoned with the scenario's event loop",
                max((c.t_end or c.t_start for c in history.wire), default=0.0)))
    finally:
        try:
            backend.stop()
        except Exception as exc:  # an engine died in the run (real SGLang exits) or cannot be reset: the run broke
            if history is None:
                raise
            history.breaks.append(Breakage("error", f"the backend failed when the scenario ended: {exc}",
                                           max((c.t_end or c.t_start for c in history.wire), default=0.0)))
    if not history.breaks:  # a broken run fails every case; otherwise what the wire shows can rule a check out
        skipped_checks.update(skips_shown([c for c in s.checks if c not in skipped_checks], history))
    return ScenarioResult(history, verdicts={check: evaluate(check, history) for check in s.checks
                                             if check not in skipped_checks}, skipped_checks=skipped_checks,
                          undeclared=undeclared(history, integration))


def undeclared(history: History, integration: Integration) -> list[dict[str, Any]]:
    """What ``history`` shows that ``integration`` does not declare (``ScenarioResult.undeclared``)."""
    return [{"capability": u.capability, "evidence": u.evidence,
             "unlocks": [s.name for s in SCENARIOS.values() if getattr(s.needs, u.capability, False)]}
            for u in undeclared_shown(history, integration.capabilities)]


def _hung(scenario: str, integration: Integration, backend: Backend, seed: int, message: str) -> History:
    """The history of a scenario whose run did not come back: the wire so far and a hang naming what was open."""
    wire = backend.wire.frozen()
    history = History(scenario, integration.name, backend.name, backend.profile, seed, wire=wire, breaks=[
        Breakage("hang", f"{message}; the scenario was abandoned", time.monotonic(), open_calls(backend.wire))])
    history.rebase(min((c.t_start for c in wire), default=history.breaks[0].t))
    return history


def run_isolated(scenario: str, spec: str, options: Mapping[str, Any], profile: str = DEFAULT_PROFILE,
                 seed: int = 0, deadlines: Deadlines = DEADLINES, engine: str = DEFAULT_FAMILY) -> ScenarioResult:
    """:func:`run_one` on the fake backend in a fresh (spawned) process that loads the integration from its spec:
    for adapters with process-global state that must not meet another scenario's."""
    context = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(max_workers=1, mp_context=context) as pool:
        return pool.submit(_run_in_child, scenario, spec, dict(options), profile, seed, deadlines, engine).result()


def _run_in_child(scenario: str, spec: str, options: dict[str, Any], profile: str, seed: int,
                  deadlines: Deadlines, engine: str) -> ScenarioResult:
    return run_one(scenario, load_integration(spec, options), fake_backend_factory(profile, seed, engine=engine), seed,
                   deadlines)


def batch_in_child(scenarios: list[str], spec: str, options: dict[str, Any], profile: str, seed: int,
                   deadlines: Deadlines, parallel: int,
                   engine: str = DEFAULT_FAMILY) -> Iterator[tuple[int, ScenarioResult | Exception]]:
    """Each of ``scenarios`` on the fake backend for the integration ``spec`` names, ``parallel`` at once, as each
    ends: (its index, its result or the exception its run raised). What the helper process of :class:`RunAhead`
    runs."""
    integration, factory = load_integration(spec, options), fake_backend_factory(profile, seed, engine=engine)
    with ThreadPoolExecutor(max_workers=max(1, parallel), thread_name_prefix="scenario") as pool:
        runs = {pool.submit(run_one, name, integration, factory, seed, deadlines): i for i, name in enumerate(scenarios)}
        for done in as_completed(runs):
            yield runs[done], done.exception() or done.result()


def _serve_batch(conn: Connection, job: Callable[[], Iterable[tuple[int, Any]]]) -> None:
    """The helper process: send each (index, result) of ``job`` as it comes; (None, exception) when it fails."""
    try:
        for index, result in job():
            try:
                conn.send((index, result))
            except Exception as exc:  # a result that cannot be pickled
                conn.send((index, RuntimeError(f"the helper process could not send its result: {exc!r}")))
    except Exception as exc:
        conn.send((None, exc))
    finally:
        conn.close()


def evaluate(check: str, history: History) -> Verdict:
    """Run one checker; a checker that raises answers unknown with the error (never a pass), and so does one that
    passed on a situation the scenario could not build (``History.unmet``) or the history does not hold
    (``situations.missing``). When the run broke (an unexpected
    failure, a hang, a timeout) the case fails, with the breakage first in the witness."""
    try:
        v = CHECKS[check](history)
    except Exception as exc:
        v = Verdict(check, "unknown", [f"checker raised {type(exc).__name__}: {exc}"])
    unmet = [u.reason for u in history.unmet if u.concerns(check)] + missing(REGISTRY[check].needs, history)
    if unmet and v.status == "pass":  # a failure found stands; a pass on a situation never built does not
        v = Verdict(v.check, "unknown", metrics=v.metrics,
                    anomalies=[note("the scenario could not build the situation this check needs:"),
                               *(Anomaly("unmet", f"  {reason}") for reason in unmet)])
    if history.breaks:
        broke = [a for b in history.breaks for a in b.anomalies()]
        own = [note(f"the checker alone answered {v.status}" + (":" if v.anomalies else "")),
               *(replace(a, text=f"  {a.text}") for a in v.anomalies)]
        v = Verdict(v.check, "fail", metrics=v.metrics, run_broke=True, checker_status=v.status,
                    anomalies=[note("the run broke, so this case cannot pass:"), *broke, *own])
    return v


class RunAhead:
    """Scenario runs started ahead of the cases that read them: scenarios are independent (each has its own engines
    and event loop) and mostly wait on real time, so up to ``parallel`` run at once in threads while the first case
    waits on its own. Threads share one interpreter lock, which the fake engines, the HTTP stack and the checks keep
    busy: :meth:`submit_batch` runs a batch of scenarios in a spawned helper process, on another core.
    :meth:`result` of a key never submitted runs it now (and caches it)."""

    def __init__(self, parallel: int = 8) -> None:
        self._pool = ThreadPoolExecutor(max_workers=max(1, parallel), thread_name_prefix="scenario")
        self._futures: dict[Any, Future[Any]] = {}
        self._helpers: list[multiprocessing.process.BaseProcess] = []

    def submit(self, key: Any, run: Callable[[], Any]) -> None:
        """Start ``run`` for ``key`` unless it was started already."""
        if key not in self._futures:
            self._futures[key] = self._pool.submit(run)

    def started(self, key: Any) -> bool:
        """Whether ``key``'s run was started (submitted)."""
        return key in self._futures

    def submit_batch(self, keys: Sequence[Any], job: Callable[[], Iterable[tuple[int, Any]]]) -> None:
        """Run ``job`` (picklable; it yields (index into ``keys``, result or exception) as each run ends, e.g.
        :func:`batch_in_child`) in a helper process (spawned); each key's result comes as it is sent. A key the
        process never answered for (it failed or died) gets the reason. Every key must be new."""
        if any(key in self._futures for key in keys):
            raise ValueError(f"submit_batch: {[k for k in keys if k in self._futures]} started already")
        context = multiprocessing.get_context("spawn")
        inbox, outbox = context.Pipe(duplex=False)
        process = context.Process(target=_serve_batch, args=(outbox, job), name="conformance-helper")
        process.start()
        outbox.close()
        self._helpers.append(process)
        mine: list[Future[Any]] = [Future() for _ in keys]
        self._futures.update(zip(keys, mine))
        threading.Thread(target=_settle, args=(inbox, process, mine), name="conformance-helper-inbox",
                         daemon=True).start()

    def result(self, key: Any, run: Callable[[], Any] | None = None) -> Any:
        """The result of ``key``'s run (``run`` started now unless one was submitted); its exception is raised."""
        if run is not None:
            self.submit(key, run)
        return self._futures[key].result()

    def close(self) -> None:
        """Drop the runs not started; wait for those running (each is bounded by its own deadlines)."""
        self._pool.shutdown(wait=True, cancel_futures=True)
        for process in self._helpers:  # every result it sent was read, or nobody waits for it any more
            if process.is_alive():
                process.terminate()
            process.join(5.0)


def longest_first(names: Sequence[str]) -> list[str]:
    """``names`` with the scenarios marked ``long`` first (otherwise in order): the order to start them in."""
    return sorted(names, key=lambda n: not SCENARIOS[n].long)


def _settle(inbox: Connection, process: multiprocessing.process.BaseProcess, futures: list[Future[Any]]) -> None:
    """Set each future as the helper process sends its result; once it stops sending, those left get the reason."""
    try:
        while True:
            index, result = inbox.recv()
            for future in futures if index is None else [futures[index]]:
                if not future.done():
                    (future.set_exception if isinstance(result, BaseException) else future.set_result)(result)
    except (EOFError, OSError):
        pass
    finally:
        inbox.close()
        process.join(5.0)
        for future in futures:
            if not future.done():
                future.set_exception(RuntimeError(f"the helper process ended (exit code {process.exitcode}) before "
                                                  f"this scenario's result"))


def run_cases(integration: Integration, backend_factory: BackendFactory, seed: int = 0,
              scenarios: list[str] | None = None, parallel: int = 4,
              deadlines: Deadlines = DEADLINES) -> dict[str, ScenarioResult]:
    """Every scenario (or the named ones) → its result. Scenarios are independent (each has its own engines
    and event loop) and mostly wait on real time, so ``parallel`` of them run at once in threads."""
    names = list(scenarios or SCENARIOS)
    ahead = RunAhead(parallel)
    try:
        for name in longest_first(names):
            ahead.submit(name, functools.partial(run_one, name, integration, backend_factory, seed, deadlines))
        return {name: ahead.result(name) for name in names}
    finally:
        ahead.close()
