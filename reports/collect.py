"""Gathering the conformance result inside pytest, also under xdist.

Every process that runs a case stores its scenario's history itself (one file per scenario run) and attaches the
case — verdict, witness, metrics, the history's file name — to the test's report as a user property, which
xdist carries to the controller. The controller alone collects those from ``pytest_runtest_logreport`` and
writes the result. A case test that broke before its verdict existed still gets a case (``error``, or
``skipped`` with the reason).
"""

from __future__ import annotations

import datetime
import importlib.metadata
import json
import platform
from dataclasses import asdict
from pathlib import Path
from typing import Any, Iterator

import pytest

from .result import build_result, histories_dir, history_file_name, write_history

PROPERTY = "weightsync_conformance_case"
"""The user property carrying a case (JSON) from the process that ran it to the controller."""


class ResultCollector:
    """Pytest plugin object: registered by ``conformance.plugin`` when a report or a history dump is asked for."""

    def __init__(self, config: pytest.Config, report: Path | None, dump_dir: Path | None) -> None:
        self.report, self.dump_dir = report, dump_dir
        workerinput = getattr(config, "workerinput", None)
        self.controller = workerinput is None
        self.worker: str | None = None if workerinput is None else workerinput.get("workerid")
        self.cases: dict[str, dict[str, Any]] = {}
        self._pending: dict[str, dict[str, Any]] = {}
        self._stored: dict[tuple[str, str], str | None] = {}

    # -- in the process that runs the case ------------------------------------------------------------------

    def record(self, nodeid: str, case: dict[str, Any], history: Any | None) -> None:
        """Keep ``case`` for the test's report; store ``history`` (once per scenario run in this process)."""
        key = (case["scenario"], case["backend"])
        if history is not None and key not in self._stored:
            self._stored[key] = self._store(*key, history.to_json())
        self._pending[nodeid] = {**case, "history": self._stored.get(key), "worker": self.worker}

    def _store(self, scenario: str, backend: str, history_json: str) -> str | None:
        if self.dump_dir is not None:
            write_history(self.dump_dir / history_file_name(scenario, backend, self.worker, compress=False),
                          history_json)
        if self.report is None:
            return None
        folder = histories_dir(self.report)
        name = history_file_name(scenario, backend, self.worker, compress=True)
        write_history(folder / name, history_json)
        return f"{folder.name}/{name}"

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_makereport(self, item: pytest.Item, call: pytest.CallInfo) -> Iterator[None]:
        report = yield
        if report.when == "call" or (report.when == "setup" and not report.passed):
            case = self._pending.pop(item.nodeid, None) or _case_without_verdict(item, report, self.worker)
            if case is not None:
                report.user_properties.append((PROPERTY, json.dumps(case, default=str)))
        return report

    # -- on the controller --------------------------------------------------------------------------------

    def pytest_sessionstart(self, session: pytest.Session) -> None:
        """Remove the histories of an earlier run (only ours: ``*.json.gz`` in this result's folder)."""
        if self.controller and self.report is not None and histories_dir(self.report).is_dir():
            for old in histories_dir(self.report).glob("*.json.gz"):
                old.unlink()

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if not self.controller:
            return
        for key, value in report.user_properties:
            if key == PROPERTY:
                self.cases[report.nodeid] = {"nodeid": report.nodeid, **json.loads(value), "outcome": report.outcome,
                                             "duration_s": round(report.duration, 4)}

    def pytest_sessionfinish(self, session: pytest.Session, exitstatus: int) -> None:
        if self.controller and self.report is not None:
            from .render import write_report

            created = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
            result = build_result(run_metadata(session.config, exitstatus), list(self.cases.values()), created)
            write_report(self.report, result)


def run_metadata(config: pytest.Config, exitstatus: int) -> dict[str, Any]:
    """What was run, where, and with which versions (the result's ``run``)."""
    from conformance import __version__
    from conformance.cases import load_integration, parse_options
    from conformance.plugin import conformance_seed, integration_spec

    spec, pairs = integration_spec(config), config.getoption("--integration-option") or []
    options: dict[str, Any] = {"raw": pairs}
    name = caps = None
    try:  # best effort: the run's metadata must never cost the result (the cases said what broke)
        options = parse_options(pairs)
        integration = load_integration(spec, options)
        name, caps = integration.name, {k: sorted(v) if isinstance(v, frozenset) else v
                                        for k, v in asdict(integration.capabilities).items()}
    except Exception:
        pass
    return {"integration": {"spec": spec, "name": name, "options": options, "capabilities": caps},
            "sglang_profile": config.getoption("--sglang-profile") or "0.5.23", "nodes": config.getoption("--nodes"),
            "seed": conformance_seed(config), "markers": config.getoption("-m") or None,
            "workers": getattr(config.option, "numprocesses", None) or 0, "exit_status": int(exitstatus),
            "versions": {"suite": __version__, "python": platform.python_version(),
                         "pytest": pytest.__version__, "sglang": _sglang_version()}}


def _sglang_version() -> str | None:
    try:
        return importlib.metadata.version("sglang")
    except importlib.metadata.PackageNotFoundError:
        return None


def _case_without_verdict(item: pytest.Item, report: pytest.TestReport, worker: str | None) -> dict[str, Any] | None:
    """A case test that ended before ``record_verdict`` (a setup error, a crash, a skip before the run)."""
    params = getattr(getattr(item, "callspec", None), "params", {})
    case = params.get("case")
    if not all(hasattr(case, a) for a in ("id", "scenario", "check")):
        return None
    reason = _skip_reason(report) if report.skipped else None
    witness = [] if report.skipped else report.longreprtext.strip().splitlines()[-5:]
    return {"case": case.id, "scenario": case.scenario, "invariant": case.check, "backend": params.get("backend", ""),
            "status": "skipped" if report.skipped else "error", "reason": reason, "witness": witness,
            "metrics": {}, "details": {}, "history": None, "worker": worker}


def _skip_reason(report: pytest.TestReport) -> str:
    longrepr = report.longrepr
    text = longrepr[2] if isinstance(longrepr, tuple) and len(longrepr) == 3 else str(longrepr)
    return text.removeprefix("Skipped: ")
