"""Gathering the conformance result inside pytest, also under xdist.

Every process that runs a case stores its scenario's history itself (one file per scenario run) and attaches the
case — verdict, witness, metrics, the history's file name — to the test's report as a user property, which
xdist carries to the controller. The controller alone collects those from ``pytest_runtest_logreport`` and
writes the result. A case test that broke before its verdict existed still gets a case (``error``, or
``skipped`` with the reason).
"""

from __future__ import annotations

import datetime
import json
from dataclasses import asdict
from pathlib import Path
from typing import Any, Callable, Iterator

import pytest

from .result import build_result, histories_dir, history_file_name, write_history

PROPERTY = "weightsync_conformance_case"
"""The user property carrying a case (JSON) from the process that ran it to the controller."""


def case_entry(case: Any, backend: str, result: Any) -> dict[str, Any]:
    """A case of the result: ``case`` (a ``conformance.cases.Case``) judged in ``result`` (a ``ScenarioResult``)."""
    v = result.verdicts.get(case.check) if result.history else None
    details = ({k: val for k, val in asdict(v).items()
                if k not in ("check", "status", "witness", "metrics", "anomalies")} if v else {})
    return {"case": case.id, "scenario": case.scenario, "invariant": case.check, "backend": backend,
            "status": "skipped" if result.skip_reason(case.check) else v.status if v else "error",
            "reason": result.skip_reason(case.check), "witness": v.witness if v else [],
            "anomalies": [a.to_json() for a in v.anomalies] if v else [], "metrics": v.metrics if v else {},
            "details": details, **({"undeclared": result.undeclared} if result.undeclared else {})}


class ResultCollector:
    """Pytest plugin object: registered by the plugin (``weightsync_conformance.plugin``) when a report or a
    history dump is asked for. ``run_metadata(exitstatus)`` is the result's ``run`` and ``preflight()`` its
    preflight findings (the plugin knows the integration; the report only writes what it is given)."""

    def __init__(self, config: pytest.Config, report: Path | None, dump_dir: Path | None,
                 run_metadata: Callable[[int], dict[str, Any]],
                 preflight: Callable[[], list[dict[str, Any]]] = list) -> None:
        self.report, self.dump_dir, self.run_metadata = report, dump_dir, run_metadata
        self.preflight = preflight
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
            result = build_result(self.run_metadata(exitstatus), list(self.cases.values()), created,
                                  self.preflight())
            write_report(self.report, result)


def _case_without_verdict(item: pytest.Item, report: pytest.TestReport, worker: str | None) -> dict[str, Any] | None:
    """A case test that ended before ``conformance_record`` (a setup error, a crash, a skip before the run)."""
    params = getattr(getattr(item, "callspec", None), "params", {})
    case = params.get("case")
    if not all(hasattr(case, a) for a in ("id", "scenario", "check")):
        return None
    reason = _skip_reason(report) if report.skipped else None
    witness = [] if report.skipped else report.longreprtext.strip().splitlines()[-5:]
    return {"case": case.id, "scenario": case.scenario, "invariant": case.check, "backend": params.get("backend", ""),
            "status": "skipped" if report.skipped else "error", "reason": reason, "witness": witness,
            "anomalies": [{"kind": "note", "text": w} for w in witness],
            "metrics": {}, "details": {}, "history": None, "worker": worker}


def _skip_reason(report: pytest.TestReport) -> str:
    longrepr = report.longrepr
    text = longrepr[2] if isinstance(longrepr, tuple) and len(longrepr) == 3 else str(longrepr)
    return text.removeprefix("Skipped: ")
