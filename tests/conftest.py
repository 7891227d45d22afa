"""Fixtures and the mutation-table summary for the suite's own tests."""

from __future__ import annotations

import json

import pytest

pytest_plugins = ["pytester"]

_MUTATION_ROWS: list[dict] = []


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if report.when == "call":
        for key, value in report.user_properties:
            if key == "mutation":
                _MUTATION_ROWS.append({**json.loads(value), "outcome": report.outcome})


def pytest_terminal_summary(terminalreporter, exitstatus, config) -> None:
    if not _MUTATION_ROWS:
        return
    tr = terminalreporter
    tr.section("mutation table (mutant -> conformance cases that killed it)")
    for row in sorted(_MUTATION_ROWS, key=lambda r: r["mutant"]):
        killers = ", ".join(row["killed_by"]) or "SURVIVED"
        tr.write_line(f"{row['mutant']:<28} {row['outcome']:<7} {killers}")
