"""The pytest plugin (``pytest11`` entry point ``weightsync_conformance``): options, markers, collection, the report.

Hooks only: it reads its options into a :class:`conformance.session.SessionOptions` and hands the session that runs
the cases (:class:`conformance.session.ConformanceSession`: the integration, the backends' set-up from
:mod:`conformance.backend_table`, each scenario run once) to the suite as the ``conformance_session`` fixture; it
registers the backends' markers, checks the options once a case was collected, writes the header line and the
report (``reports.collect``).

It stays out of the way of every pytest run that collects no conformance case: it registers its options (all
``--conformance-*``), its ini keys and markers, and nothing else — no header line, no xdist change, no import of the
suite's machinery. Under ``-n N --dist load`` the cases of one scenario go to one worker (each scenario runs once);
everything else is scheduled exactly as xdist's ``load`` does.
"""

from __future__ import annotations

import argparse
import functools
import importlib.metadata
import json
import os
import platform
from dataclasses import asdict
from pathlib import Path
from typing import Any, Callable, Sequence

import pytest

from conformance import DEFAULT_INTEGRATION, __version__
from conformance.families import DEFAULT_FAMILY, FAMILIES, family

_STATE = pytest.StashKey["_PluginState"]()
_COLLECTOR = "weightsync-conformance-result"
_CASE_PROPERTY = "weightsync_conformance_integration"
"""A user property on every conformance case's report: the spec of the integration it ran (the controller, also
under xdist, names it in the summary line and the result)."""
_UNDECLARED_PROPERTY = "weightsync_conformance_undeclared"
"""A user property on a case whose history shows capabilities the integration does not declare (JSON: the scenario
and ``ScenarioResult.undeclared``), for the terminal summary (also under xdist)."""
"""Appended (xdist ``load`` only, on the workers) to a case's node id: ``…@weightsync-conformance:<scenario>``."""


def _options() -> list[tuple[str, dict[str, Any]]]:
    from fakes.facts import SGLANG  # light: plain data
    from fakes.profiles import DEFAULT_PROFILE, PROFILES

    return [
        ("--conformance-integration", dict(default=None, metavar="MODULE:ATTR", help=(
            "integration under test (default: ini conformance_integration, env WEIGHTSYNC_INTEGRATION, "
            f"else {DEFAULT_INTEGRATION}; with another --conformance-engine, that family's reference: "
            f"{', '.join(f'{f.name}: {f.reference}' for f in FAMILIES.values())})"))),
        ("--conformance-integration-option", dict(action="append", default=[], metavar="KEY=VALUE", help=(
            "keyword argument for an integration factory (repeatable; VALUE is read as JSON when it parses, else "
            "as a string)"))),
        ("--conformance-expectations", dict(default=None, metavar="FILE", help=(
            "known failures (TOML; default: ini conformance_expectations): each listed case runs as a strict "
            "expected failure"))),
        ("--conformance-isolate-scenarios", dict(action="store_true", default=False, help=(
            "run each scenario in its own fresh process (fake backend), for adapters with process-global state"))),
        ("--conformance-engine", dict(default=DEFAULT_FAMILY, choices=list(FAMILIES), help=(
            f"engine family the fake backend fakes and the GPU backend runs: {', '.join(FAMILIES)} (default "
            f"{DEFAULT_FAMILY}; sglang as --conformance-sglang-profile, the others as their newest release, "
            f"through their dialect)"))),
        ("--conformance-sglang-profile", dict(default=None, metavar="VERSION", help=(
            f"SGLang release the fake engines behave as: {', '.join(PROFILES)} (default {DEFAULT_PROFILE})"))),
        ("--conformance-seed", dict(type=int, default=None, metavar="N", help=(
            "seed for workloads and fake engines (default: env WEIGHTSYNC_SEED, else 0)"))),
        ("--conformance-report", dict(default=None, metavar="PATH", help=(
            "write the conformance result (JSON; Markdown, HTML and the scenarios' histories beside it) to PATH"))),
        ("--conformance-dump-history", dict(default=None, metavar="DIR", help=(
            "write each scenario's history (wire log, cycles, batches) as JSON into DIR"))),
        ("--conformance-max-aborted-rate", dict(type=float, default=0.01, metavar="R", help=(
            "real engines: fail a scenario whose aborted-sample rate exceeds R (default 0.01)"))),
        *backend_options(),
    ]


def backend_options() -> list[tuple[str, dict[str, Any]]]:
    """The options each backend declares for itself (``BackendRow.own``), as ``addoption`` arguments: a value not
    given is the option's default (None: the backend's set-up applies its own); a check runs as the value is
    parsed."""
    from conformance.backend_table import BACKENDS  # light: plain data

    found: dict[str, dict[str, Any]] = {}
    for row in BACKENDS.values():
        for option in row.own:
            if option.kind == "flag":
                found[option.flag] = dict(action="store_true", default=False, help=option.help)
                continue
            kind = int if option.kind == "int" else str
            found[option.flag] = dict(type=_checked(kind, option.flag, option.check), default=option.default,
                                      metavar=option.metavar, help=option.help)
    return list(found.items())


def _checked(kind: type, flag: str, check: str | None) -> Callable[[str], Any]:
    """``kind``, then ``check`` (``module:function``, imported only when the option is given), as an argparse type:
    a bad value is a usage error naming the option."""
    def parse(raw: str) -> Any:
        try:
            value = kind(raw)
            if check is not None:
                from conformance.families import load

                value = load(check)(value)
        except Exception as exc:
            raise argparse.ArgumentTypeError(f"{flag} {raw}: {exc}") from None
        return value
    return parse


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("weightsync-conformance")
    for name, kwargs in _options():
        group.addoption(name, **kwargs)
    parser.addini("conformance_integration", "integration under test (MODULE:ATTR)", default=None)
    parser.addini("conformance_expectations", "known failures of the integration (TOML file)", default=None)


def pytest_configure(config: pytest.Config) -> None:
    from conformance.backend_table import BACKENDS  # light: plain data

    markers: dict[str, str] = {}
    for row in BACKENDS.values():  # a marker shared by rows: the first row's help
        markers.setdefault(row.marker, row.about)
    for marker, about in markers.items():
        config.addinivalue_line("markers", f"{marker}: {about}")
    config.stash[_STATE] = _PluginState()
    config.pluginmanager.register(config.stash[_STATE], "weightsync-conformance-state")
    if getattr(config.option, "numprocesses", None) and getattr(config, "workerinput", None) is None and (
            expectations_path(config) or integration_spec(config) != family(engine(config)).reference):
        activate(config)  # the xdist controller collects nothing: what was asked for, checked once
    report, dump = config.getoption("conformance_report"), config.getoption("conformance_dump_history")
    if report or dump:
        from reports.collect import ResultCollector

        collector = ResultCollector(config, report and Path(report), dump and Path(dump),
                                    lambda exitstatus: run_metadata(config, exitstatus),
                                    lambda: [f.to_json() for f in _findings(config)])
        config.pluginmanager.register(collector, _COLLECTOR)


# -- option values -----------------------------------------------------------------------------------------------

def integration_spec(config: pytest.Config) -> str:
    return (config.getoption("conformance_integration") or config.getini("conformance_integration")
            or os.environ.get("WEIGHTSYNC_INTEGRATION") or family(engine(config)).reference)


def engine(config: pytest.Config) -> str:
    """``--conformance-engine``: the engine family the fake backend fakes."""
    return config.getoption("conformance_engine") or DEFAULT_FAMILY


def engine_label(config: pytest.Config) -> str:
    """The engines the fake backend behaves as: ``SGLang 0.5.23``, ``vLLM 0.32.0``."""
    return family(engine(config)).engine_label(sglang_profile(config))


def conformance_seed(config: pytest.Config) -> int:
    seed = config.getoption("conformance_seed")
    return int(os.environ.get("WEIGHTSYNC_SEED", "0")) if seed is None else seed


def sglang_profile(config: pytest.Config) -> str:
    from fakes.profiles import DEFAULT_PROFILE

    return config.getoption("conformance_sglang_profile") or DEFAULT_PROFILE


def integration_options(config: pytest.Config) -> dict[str, Any]:
    from conformance.cases import parse_options

    return parse_options(config.getoption("conformance_integration_option"))


def expectations_path(config: pytest.Config) -> Path | None:
    cli, ini = config.getoption("conformance_expectations"), config.getini("conformance_expectations")
    if cli:
        return Path(cli)
    return config.rootpath / ini if ini else None


def _validate(config: pytest.Config) -> None:
    """The options' values; only once a conformance case was collected (a run without one pays nothing). Each
    backend's own options were checked as they were parsed."""
    from conformance.backend_table import BACKENDS
    from fakes.profiles import PROFILES

    profile = sglang_profile(config)
    if profile not in PROFILES:
        raise pytest.UsageError(f"--conformance-sglang-profile {profile!r} is not known; choose one of "
                                f"{sorted(PROFILES)}")
    if not 0.0 <= config.getoption("conformance_max_aborted_rate") <= 1.0:
        raise pytest.UsageError("--conformance-max-aborted-rate must be between 0 and 1")
    for option in (o for row in BACKENDS.values() for o in row.own if o.excludes is not None):
        other, why = option.excludes  # type: ignore[misc]
        if _given(config, option.flag) and _given(config, other):
            raise pytest.UsageError(f"{option.flag} {why}")


def _given(config: pytest.Config, flag: str) -> bool:
    return config.getoption(flag.lstrip("-").replace("-", "_")) not in (None, False)


def backend_values(config: pytest.Config) -> dict[str, Any]:
    """Each backend's own options that were given, by their set-up's keyword."""
    from conformance.backend_table import BACKENDS

    return {o.key: config.getoption(o.flag.lstrip("-").replace("-", "_"))
            for row in BACKENDS.values() for o in row.own if _given(config, o.flag)}


def session_options(config: pytest.Config) -> Any:
    """The session's choices (:class:`conformance.session.SessionOptions`) from the options."""
    from conformance.session import SessionOptions

    cfg = config.getoption
    return SessionOptions(
        integration=integration_spec(config), integration_options=integration_options(config),
        expectations=expectations_path(config), profile=sglang_profile(config), seed=conformance_seed(config),
        engine=engine(config),
        isolate=cfg("conformance_isolate_scenarios"), backend=backend_values(config),
        stops_session=getattr(config, "workerinput", None) is None)


class _PluginState:
    """The plugin's per-run state (registered as a plugin object): the conformance session (built at the first
    case) and the integrations whose cases ran (as the controller saw their reports; ordered)."""

    def __init__(self) -> None:
        self.session: Any = None
        self.ran: dict[str, None] = {}
        self.undeclared: list[tuple[str, dict[str, Any]]] = []

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        for key, value in report.user_properties:
            if key == _CASE_PROPERTY:
                self.ran.setdefault(value, None)
            elif key == _UNDECLARED_PROPERTY:
                scenario, shown = json.loads(value)
                self.undeclared += [(scenario, u) for u in shown]


def activate(config: pytest.Config) -> Any:
    """A conformance case was collected: check the options, build the session, load the integration and the
    expectations file, each error once, as a usage error that says what to fix. The session (built once)."""
    state = config.stash[_STATE]
    if state.session is not None:
        return state.session
    from conformance.cases import IntegrationError
    from conformance.expectations import ExpectationsError
    from conformance.session import ConformanceSession

    _validate(config)
    try:
        session = ConformanceSession(session_options(config))
        session.integration()
        session.expectations()
    except (IntegrationError, ExpectationsError) as exc:
        raise pytest.UsageError(f"weightsync-conformance: {exc}") from None
    config.add_cleanup(session.close)
    state.session = session
    return session


def _findings(config: pytest.Config) -> list[Any]:
    session = config.stash[_STATE].session
    return session.findings if session is not None else []


def record(request: pytest.FixtureRequest, case: Any, backend: str, result: Any,
           expected: dict[str, Any] | None = None) -> None:
    """Keep this case's verdict, and its scenario's history, for the report (``reports.collect``; works under
    xdist). Does nothing when no report or history dump was asked for."""
    request.node.user_properties.append((_CASE_PROPERTY, _class_spec(request.node)))
    if result.undeclared:
        request.node.user_properties.append((_UNDECLARED_PROPERTY, json.dumps([case.scenario, result.undeclared])))
    collector = request.config.pluginmanager.get_plugin(_COLLECTOR)
    if collector is not None:
        from reports.collect import case_entry

        entry = case_entry(case, backend, result)
        if expected is not None:
            entry["expected"] = expected
        collector.record(request.node.nodeid, entry, result.history)


def _class_spec(item: pytest.Item) -> str:
    cls = getattr(item, "cls", None)
    chosen = getattr(cls, "integration", None)
    if chosen is None and not (cls is not None and "conformance_integration" in vars(cls)):
        return integration_spec(item.config)
    return chosen if isinstance(chosen, str) else f"{cls.__module__}:{cls.__qualname__}"


def _is_case(item: pytest.Item) -> bool:
    return "conformance_session" in getattr(item, "fixturenames", ())


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(session: pytest.Session, config: pytest.Config, items: list[pytest.Item]) -> None:
    cases = [item for item in items if _is_case(item)]
    if not cases:
        return
    session = activate(config)
    if getattr(config, "workerinput", None) is None:  # a test class's own integration: its error once, up front
        from conformance.cases import IntegrationError

        chosen_by_class = {id(c): c for c in (getattr(item.cls, "integration", None) for item in cases)
                           if c is not None}
        for chosen in chosen_by_class.values():
            try:
                session.resolve(chosen)
            except IntegrationError as exc:
                raise pytest.UsageError(f"weightsync-conformance: {exc}") from None
    _budget_timeouts(session, config, cases)
    reporter = config.pluginmanager.get_plugin("terminalreporter")
    if reporter is not None and getattr(config, "workerinput", None) is None:
        reporter.write_line(header_line(config, sorted({_class_spec(item) for item in cases})))


def _budget_timeouts(session: Any, config: pytest.Config, cases: list[pytest.Item]) -> None:
    """A case of an integration that declares ``Capabilities.update_budget_s`` gets pytest-timeout's bound for that
    budget (the collected bound is for the suite's own deadlines)."""
    from conformance.cases import IntegrationError
    from conformance.suite import case_timeout_s

    for item in cases:
        chosen = getattr(item.cls, "integration", None)
        try:
            integration = session.integration() if chosen is None else session.resolve(chosen)
        except IntegrationError:
            continue  # said once, as a usage error, by the controller
        budget = integration.capabilities.update_budget_s
        if budget:
            item.add_marker(pytest.mark.timeout(case_timeout_s(config, budget)), append=False)


def header_line(config: pytest.Config, integrations: Sequence[str] | None = None) -> str:
    engines = f"sglang-profile={sglang_profile(config)}" if family(engine(config)).profiles else \
        f"engine={engine(config)}"
    return (f"weightsync-conformance: integration={','.join(integrations or [integration_spec(config)])} "
            f"{engines} seed={conformance_seed(config)} (rerun with --conformance-seed N)")


def pytest_terminal_summary(terminalreporter: Any, exitstatus: int, config: pytest.Config) -> None:
    """Under xdist (the controller collects nothing): the header line at the end, once a case ran. What the real
    SGLang engines cost (-m sglang), when they ran. The capabilities the run showed but the integration did not
    declare."""
    state = config.stash[_STATE]
    for line in state.session.summary() if state.session is not None else []:
        terminalreporter.write_line(line)
    if state.undeclared:
        from reports.result import undeclared_capabilities, undeclared_line

        for u in undeclared_capabilities(state.undeclared):
            terminalreporter.write_line(f"weightsync-conformance: {undeclared_line(u)}", yellow=True)
    ran = list(state.ran)
    if getattr(config.option, "numprocesses", None) and ran:
        terminalreporter.write_line(header_line(config, ran))


@pytest.hookimpl(tryfirst=True, optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    if config.getvalue("dist") in ("load", "loadgroup"):
        return _ScenarioScheduling(config, log)
    return None


@functools.cache
def _case_groups() -> dict[str, str]:
    """A case test's parameter id (``<invariant>-<scenario>-<backend>``) → its group (``<scenario>.<backend>``)."""
    from conformance.backend_table import BACKENDS
    from conformance.cases import CASES

    return {f"{c.id}-{b}": f"{c.scenario}.{b}" for c in CASES for b in BACKENDS}


def case_group(nodeid: str) -> str | None:
    """The worker group of a conformance case's node id (its test class, scenario and backend: the cases that share
    one scenario run), or None for any other test. Read off the node id, the only thing xdist's scheduler sees."""
    head, sep, param = nodeid.rpartition("::test_case[")
    group = _case_groups().get(param[:-1]) if sep and param.endswith("]") else None
    return None if group is None else f"{head}::{group}"


class _ScenarioScheduling:
    """xdist's ``load`` or ``loadgroup``, unchanged for a collection without conformance cases; with them,
    ``loadgroup`` where every case of one scenario (per test class and backend, :func:`case_group`) goes to one
    worker, so each scenario runs once. Decided at the first collection. (Grouped by node id here: pytest 9
    ignores the renamed node ids that xdist's own ``xdist_group`` marks rely on.)"""

    def __init__(self, config: pytest.Config, log: Any) -> None:
        self.config, self.log = config, log
        self._impl: Any = None
        self._early: list[Any] = []

    def _choose(self, collection: Sequence[str]) -> None:
        from xdist.scheduler import LoadGroupScheduling, LoadScheduling

        class ByScenario(LoadGroupScheduling):
            def _split_scope(self, nodeid: str) -> str:
                return case_group(nodeid) or super()._split_scope(nodeid)

        grouped = any(case_group(nodeid) for nodeid in collection)
        default = LoadGroupScheduling if self.config.getvalue("dist") == "loadgroup" else LoadScheduling
        self._impl = (ByScenario if grouped else default)(self.config, self.log)
        for node in self._early:
            self._impl.add_node(node)

    def add_node(self, node: Any) -> None:
        if self._impl is None:
            self._early.append(node)
        else:
            self._impl.add_node(node)

    def add_node_collection(self, node: Any, collection: Sequence[str]) -> None:
        if self._impl is None:
            self._choose(collection)
        self._impl.add_node_collection(node, collection)

    def remove_node(self, node: Any) -> Any:
        if self._impl is None:
            self._early.remove(node)
            return None
        return self._impl.remove_node(node)

    @property
    def nodes(self) -> list[Any]:
        return self._impl.nodes if self._impl else list(self._early)

    @property
    def collection_is_completed(self) -> bool:
        return bool(self._impl and self._impl.collection_is_completed)

    @property
    def tests_finished(self) -> bool:
        return bool(self._impl and self._impl.tests_finished)

    @property
    def has_pending(self) -> bool:
        return bool(self._impl and self._impl.has_pending)

    def __getattr__(self, name: str) -> Any:  # mark_test_complete, schedule, ...: after the first collection
        if name.startswith("_") or self.__dict__.get("_impl") is None:
            raise AttributeError(name)
        return getattr(self._impl, name)


_ScenarioScheduling.__name__ = _ScenarioScheduling.__qualname__ = "LoadScheduling"  # xdist prints the name


# -- fixtures ----------------------------------------------------------------------------------------------------

@pytest.fixture(scope="session")
def conformance_session(pytestconfig: pytest.Config) -> Any:
    """The session's :class:`conformance.session.ConformanceSession`: ``integration()``, ``expectations()``,
    ``run(integration, scenario, backend)``, ``setup(backend)``."""
    return activate(pytestconfig)


@pytest.fixture(scope="session")
def conformance_integration(conformance_session: Any) -> Any:
    """The Integration under test (``--conformance-integration``)."""
    return conformance_session.integration()


@pytest.fixture(scope="session")
def conformance_run(conformance_session: Any, conformance_integration: Any) -> Callable[[str, str], Any]:
    """``run(scenario, backend)`` → ScenarioResult of the session's integration, each scenario run once."""
    return lambda scenario, backend: conformance_session.run(conformance_integration, scenario, backend)


@pytest.fixture
def conformance_record(request: pytest.FixtureRequest) -> Callable[..., None]:
    """``record(case, backend, result, expected=None)``: keep this case's verdict for the report."""
    return lambda case, backend, result, expected=None: record(request, case, backend, result, expected)


# -- the result's metadata -----------------------------------------------------------------------------------------

def run_metadata(config: pytest.Config, exitstatus: int) -> dict[str, Any]:
    """What was run, where, and with which versions (the result's ``run``)."""
    spec, pairs = integration_spec(config), config.getoption("conformance_integration_option") or []
    ran = list(config.stash[_STATE].ran)
    if ran and ran != [spec]:  # an adopter's test class: its own integration (several: named together)
        spec, pairs = ",".join(ran), []
    options: dict[str, Any] = {"raw": pairs}
    name = caps = None
    try:  # best effort: the run's metadata must never cost the result (the cases said what broke)
        options = integration_options(config) if pairs else {}
        session = activate(config)
        integration = session.integration() if spec == integration_spec(config) else session.resolve(spec)
        name, caps = integration.name, {k: sorted(v) if isinstance(v, frozenset) else v
                                        for k, v in asdict(integration.capabilities).items()}
    except Exception:
        pass
    return {"integration": {"spec": spec, "name": name, "options": options, "capabilities": caps},
            "engine": engine_label(config), "sglang_profile": sglang_profile(config),
            "nodes": config.getoption("conformance_nodes"),
            "seed": conformance_seed(config), "markers": config.getoption("-m") or None,
            "workers": getattr(config.option, "numprocesses", None) or 0, "exit_status": int(exitstatus),
            "versions": {"suite": __version__, "python": platform.python_version(),
                         "pytest": pytest.__version__, "sglang": _sglang_version()}}


def _sglang_version() -> str | None:
    try:
        return importlib.metadata.version("sglang")
    except importlib.metadata.PackageNotFoundError:
        return None
