"""The pytest plugin (``pytest11`` entry point ``weightsync_conformance``): options, markers, fixtures, report.

Import-light: the suite's machinery is imported only when a conformance test runs.
"""

from __future__ import annotations

import os
from dataclasses import asdict
from pathlib import Path
from typing import Any, Callable

import pytest

from . import DEFAULT_INTEGRATION

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
    from fakes.profiles import DEFAULT_PROFILE, PROFILES  # light: plain data

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
    from fakes.profiles import PROFILES  # light: plain data

    profile = config.getoption("--sglang-profile") or "0.5.23"
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

        config.pluginmanager.register(ResultCollector(config, report and Path(report), dump and Path(dump)),
                                      _COLLECTOR)


def integration_spec(config: pytest.Config) -> str:
    return (config.getoption("--integration") or config.getini("conformance_integration")
            or os.environ.get("WEIGHTSYNC_INTEGRATION") or DEFAULT_INTEGRATION)


def conformance_seed(config: pytest.Config) -> int:
    seed = config.getoption("--conformance-seed")
    return int(os.environ.get("WEIGHTSYNC_SEED", "0")) if seed is None else seed


def pytest_report_header(config: pytest.Config) -> list[str]:
    return [f"weightsync-conformance: integration={integration_spec(config)} "
            f"sglang-profile={config.getoption('--sglang-profile') or '0.5.23'} seed={conformance_seed(config)} "
            f"(rerun with --conformance-seed N)"]


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if any("conformance_run" in getattr(item, "fixturenames", ()) for item in items):
        from .cases import IntegrationError, load_integration, parse_options

        try:
            options = parse_options(config.getoption("--integration-option"))
            config.stash[_RESULTS]["integration"] = load_integration(integration_spec(config), options)
        except IntegrationError as exc:
            raise pytest.UsageError(f"weightsync-conformance: {exc}") from None
        config.stash[_RESULTS]["options"] = options


@pytest.fixture(scope="session")
def conformance_integration(pytestconfig: pytest.Config) -> Any:
    """The Integration under test."""
    from .cases import load_integration, parse_options

    return pytestconfig.stash[_RESULTS].get("integration") or load_integration(
        integration_spec(pytestconfig), parse_options(pytestconfig.getoption("--integration-option")))


@pytest.fixture(scope="session")
def conformance_run(pytestconfig: pytest.Config, conformance_integration: Any) -> Callable[[str, str], Any]:
    """``run(scenario, backend)`` → ScenarioResult, each scenario run once per session and backend."""
    from .cases import fake_backend_factory, parse_options, run_isolated, run_one

    cache: dict[tuple[str, str], Any] = {}
    profile = pytestconfig.getoption("--sglang-profile") or "0.5.23"
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
                                                      parse_options(pytestconfig.getoption("--integration-option")),
                                                      profile, seed)
        else:
            cache[(scenario, backend)] = run_one(scenario, conformance_integration,
                                                 fake_backend_factory(profile, seed), seed)
        if isinstance(cache[(scenario, backend)], Exception):
            pytest.fail(f"{scenario} on the {backend} backend: {cache[(scenario, backend)]}", pytrace=False)
        return cache[(scenario, backend)]
    return run


def record_verdict(config: pytest.Config, nodeid: str, case: Any, backend: str, result: Any) -> None:
    """Keep a case's verdict, and its scenario's history, for the report (``reports.collect``; works under xdist)."""
    collector = config.pluginmanager.get_plugin(_COLLECTOR)
    if collector is None:
        return
    v = result.verdicts.get(case.check) if result.history else None
    details = ({k: val for k, val in asdict(v).items() if k not in ("check", "status", "witness", "metrics")}
               if v else {})
    collector.record(nodeid, {
        "case": case.id, "scenario": case.scenario, "invariant": case.check, "backend": backend,
        "status": "skipped" if result.skip_reason(case.check) else v.status if v else "error",
        "reason": result.skip_reason(case.check),
        "witness": v.witness if v else [], "metrics": v.metrics if v else {}, "details": details}, result.history)
