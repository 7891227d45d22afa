"""Fixtures, Hypothesis profiles and the mutation-table summary for the suite's own tests."""

from __future__ import annotations

import json
import os

import pytest
from hypothesis import HealthCheck, settings

pytest_plugins = ["pytester"]

settings.register_profile("dev", max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("ci", max_examples=25, deadline=None, derandomize=True,
                          suppress_health_check=[HealthCheck.too_slow], print_blob=True)
settings.register_profile("nightly", max_examples=300, stateful_step_count=100, deadline=None)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))  # derandomized unless asked: a commit's verdict
# is the same on every run (a random example once failed CI on a test defect no earlier run had drawn); `dev` draws new
# examples each run, `nightly` many more

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
