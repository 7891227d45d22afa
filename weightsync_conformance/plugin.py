"""The pytest plugin (``pytest11`` entry point ``weightsync_conformance``): options, markers, fixtures, report.

The top floor: it loads the integration once per session and hands its name and capabilities to the report
(``reports.collect``), runs scenarios on the fake backend or on real SGLang (``gpu.suite``). Import-light: the
suite's machinery is imported only when a conformance test runs.
"""

from __future__ import annotations

import importlib.metadata
import os
import platform
from dataclasses import asdict
from pathlib import Path
from typing import Any, Callable

import pytest

from conformance import DEFAULT_INTEGRATION, __version__
from fakes.profiles import DEFAULT_PROFILE, PROFILES  # light: plain data

_RESULTS = pytest.StashKey[dict]()
_COLLECTOR = "weightsync-conformance-result"


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("weightsync-conformance")
    group.addoption("--integration", default=None, metavar="MODULE:ATTR",
                    help="integration under test (default: ini conformance_integration, env WEIGHTSYNC_INTEGRATION, "
                         f"else {DEFAULT_INTEGRATION})")
    group.addoption("--integration-option", action="append", default=[], metavar="KEY=VALUE",
                    help="keyword argument for an integration factory (repeatable; VALUE is read as JSON when it "
                         "parses, else as a string)")
    group.addoption("--isolate-scenarios", action="store_true",
                    help="run each scenario in its own fresh process (fake backend), for adapters with "
                         "process-global state")
    group.addoption("--sglang-profile", default=None, metavar="VERSION",
                    help=f"SGLang release the fake engines behave as: {', '.join(PROFILES)} "
                         f"(default {DEFAULT_PROFILE})")
    group.addoption("--conformance-seed", type=int, default=None, metavar="N",
                    help="seed for workloads and fake engines (default: env WEIGHTSYNC_SEED, else 0)")
    group.addoption("--conformance-report", default=None, metavar="PATH",
                    help="write the conformance result (JSON; Markdown, HTML and the scenarios' histories beside it) "
                         "to PATH")
    group.addoption("--dump-history", default=None, metavar="DIR",
                    help="write each scenario's history (wire log, cycles, batches) as JSON into DIR")
    group.addoption("--nodes", type=int, default=1, metavar="N", help="nodes for the GPU backend (-m gpu)")
    group.addoption("--ray-address", default=None, metavar="ADDR",
                    help="Ray cluster of the GPU backend (default: env RAY_ADDRESS, else Ray on this machine)")
    group.addoption("--model-path", default=None, metavar="DIR",
                    help="model the GPU backend's engines serve, at this path on every node (default: a tiny "
                         "random Llama built here and copied to the nodes)")
    group.addoption("--max-aborted-rate", type=float, default=0.01, metavar="R",
                    help="GPU backend: fail a scenario whose aborted-sample rate exceeds R (default 0.01)")
    parser.addini("conformance_integration", "integration under test (MODULE:ATTR)", default=None)


def pytest_configure(config: pytest.Config) -> None:
    for marker in ("cpu: runs on CPU only (fake engines); every CI",
                   "gpu: needs real SGLang engines on GPUs (Ray cluster)",
                   "xdist_group(name): under pytest-xdist --dist=loadgroup, the cases of one scenario share a worker"):
        config.addinivalue_line("markers", marker)
    profile = sglang_profile(config)
    if profile not in PROFILES:
        raise pytest.UsageError(f"--sglang-profile {profile!r} is not known; choose one of {sorted(PROFILES)}")
    if config.getoption("--nodes") < 1:
        raise pytest.UsageError("--nodes must be >= 1")
    if not 0.0 <= config.getoption("--max-aborted-rate") <= 1.0:
        raise pytest.UsageError("--max-aborted-rate must be between 0 and 1")
    if getattr(config.option, "dist", "no") == "load":
        # pytest-xdist: every case of one scenario to the same worker (xdist_group), so each scenario runs once
        # (xdist's plain load spreads them and reruns a scenario in every worker that got one of its cases).
        config.option.dist = "loadgroup"
    config.stash[_RESULTS] = {}
    report, dump = config.getoption("--conformance-report"), config.getoption("--dump-history")
    if report or dump:
        from reports.collect import ResultCollector

        collector = ResultCollector(config, report and Path(report), dump and Path(dump),
                                    lambda exitstatus: run_metadata(config, exitstatus))
        config.pluginmanager.register(collector, _COLLECTOR)


def integration_spec(config: pytest.Config) -> str:
    return (config.getoption("--integration") or config.getini("conformance_integration")
            or os.environ.get("WEIGHTSYNC_INTEGRATION") or DEFAULT_INTEGRATION)


def conformance_seed(config: pytest.Config) -> int:
    seed = config.getoption("--conformance-seed")
    return int(os.environ.get("WEIGHTSYNC_SEED", "0")) if seed is None else seed


def sglang_profile(config: pytest.Config) -> str:
    return config.getoption("--sglang-profile") or DEFAULT_PROFILE


def integration_options(config: pytest.Config) -> dict[str, Any]:
    from conformance.cases import parse_options

    return parse_options(config.getoption("--integration-option"))


def loaded_integration(config: pytest.Config) -> Any:
    """The integration under test, loaded once per session (``IntegrationError`` when it cannot be)."""
    if "integration" not in config.stash[_RESULTS]:
        from conformance.cases import load_integration

        config.stash[_RESULTS]["integration"] = load_integration(integration_spec(config), integration_options(config))
    return config.stash[_RESULTS]["integration"]


def pytest_report_header(config: pytest.Config) -> list[str]:
    return [f"weightsync-conformance: integration={integration_spec(config)} "
            f"sglang-profile={sglang_profile(config)} seed={conformance_seed(config)} "
            f"(rerun with --conformance-seed N)"]


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if any("conformance_run" in getattr(item, "fixturenames", ()) for item in items):
        from conformance.cases import IntegrationError

        try:
            loaded_integration(config)
        except IntegrationError as exc:
            raise pytest.UsageError(f"weightsync-conformance: {exc}") from None


@pytest.fixture(scope="session")
def conformance_integration(pytestconfig: pytest.Config) -> Any:
    """The Integration under test."""
    return loaded_integration(pytestconfig)


@pytest.fixture(scope="session")
def conformance_run(pytestconfig: pytest.Config, conformance_integration: Any) -> Callable[[str, str], Any]:
    """``run(scenario, backend)`` → ScenarioResult, each scenario run once per session and backend."""
    from conformance.cases import fake_backend_factory, run_isolated, run_one

    cache: dict[tuple[str, str], Any] = {}
    profile = sglang_profile(pytestconfig)
    seed = conformance_seed(pytestconfig)

    gpu: list[Any] = []

    def gpu_factory() -> Any:
        """Real SGLang on Ray (``gpu.suite``), set up at the first gpu case; skips with its reason where it cannot
        run."""
        if not gpu:
            from gpu.suite import GpuSuite

            gpu.append(GpuSuite(nodes=pytestconfig.getoption("--nodes"), profile=profile, seed=seed,
                                ray_address=pytestconfig.getoption("--ray-address"),
                                model_path=pytestconfig.getoption("--model-path")))
            pytestconfig.add_cleanup(gpu[0].close)
        reason = gpu[0].skip_reason()
        if reason:
            pytest.skip(reason)
        return gpu[0].backend_factory()

    def run(scenario: str, backend: str) -> Any:
        if (scenario, backend) in cache:
            pass
        elif backend == "gpu":
            try:
                cache[(scenario, backend)] = run_one(scenario, conformance_integration, gpu_factory(), seed)
            except Exception as exc:  # the backend broke (an engine lost, never healthy): every case of it fails
                cache[(scenario, backend)] = exc
        elif pytestconfig.getoption("--isolate-scenarios"):
            cache[(scenario, backend)] = run_isolated(scenario, integration_spec(pytestconfig),
                                                      integration_options(pytestconfig), profile, seed)
        else:
            cache[(scenario, backend)] = run_one(scenario, conformance_integration,
                                                 fake_backend_factory(profile, seed), seed)
        if isinstance(cache[(scenario, backend)], Exception):
            pytest.fail(f"{scenario} on the {backend} backend: {cache[(scenario, backend)]}", pytrace=False)
        return cache[(scenario, backend)]
    return run


@pytest.fixture
def conformance_record(request: pytest.FixtureRequest) -> Callable[[Any, str, Any], None]:
    """``record(case, backend, result)``: keep this case's verdict, and its scenario's history, for the report
    (``reports.collect``; works under xdist). Does nothing when no report or history dump was asked for."""
    def record(case: Any, backend: str, result: Any) -> None:
        collector = request.config.pluginmanager.get_plugin(_COLLECTOR)
        if collector is not None:
            from reports.collect import case_entry

            collector.record(request.node.nodeid, case_entry(case, backend, result), result.history)
    return record


def run_metadata(config: pytest.Config, exitstatus: int) -> dict[str, Any]:
    """What was run, where, and with which versions (the result's ``run``)."""
    spec, pairs = integration_spec(config), config.getoption("--integration-option") or []
    options: dict[str, Any] = {"raw": pairs}
    name = caps = None
    try:  # best effort: the run's metadata must never cost the result (the cases said what broke)
        options = integration_options(config)
        integration = loaded_integration(config)
        name, caps = integration.name, {k: sorted(v) if isinstance(v, frozenset) else v
                                        for k, v in asdict(integration.capabilities).items()}
    except Exception:
        pass
    return {"integration": {"spec": spec, "name": name, "options": options, "capabilities": caps},
            "sglang_profile": sglang_profile(config), "nodes": config.getoption("--nodes"),
            "seed": conformance_seed(config), "markers": config.getoption("-m") or None,
            "workers": getattr(config.option, "numprocesses", None) or 0, "exit_status": int(exitstatus),
            "versions": {"suite": __version__, "python": platform.python_version(),
                         "pytest": pytest.__version__, "sglang": _sglang_version()}}


def _sglang_version() -> str | None:
    try:
        return importlib.metadata.version("sglang")
    except importlib.metadata.PackageNotFoundError:
        return None
