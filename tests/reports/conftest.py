"""Shared by the report tests: the recorded result (fixtures/) and how to run the suite as a user does."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
RECORDED = Path(__file__).parent / "fixtures" / "version_bump_aborts" / "conformance-result.json"
"""``python -m conformance --integration conformance.mutants:version_bump_aborts --out
tests/reports/fixtures/version_bump_aborts -k "steady-tensor-in_place or answers-while-paused"`` (then the .md and .html
removed): one failing case (I1-I2, the seed-000 version bump) among passes, with both histories."""
BASELINE = ROOT / "reports" / "baselines" / "fake.json"


def run_python(*args: str, cwd: Path, timeout_s: float = 120) -> subprocess.CompletedProcess:
    """``python ARGS`` in a subprocess with the repository importable, as a user runs it."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    env.pop("PYTEST_XDIST_WORKER", None)
    env.pop("PYTEST_ADDOPTS", None)
    return subprocess.run([sys.executable, *args], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=timeout_s)


@pytest.fixture
def recorded() -> dict:
    return json.loads(RECORDED.read_text())
