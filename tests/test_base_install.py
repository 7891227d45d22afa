"""The base install (pyproject's ``dependencies``, no extra) runs the main job, ``python -m conformance``, on the fake
backend: nothing on its path imports torch, and the reference passes its scenarios with the extras' packages
absent (each run in a subprocess where they cannot be imported, as in a venv without them)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
EXTRAS_ONLY = ("torch", "safetensors", "numpy", "aiohttp", "respx", "uvloop")
"""Packages only the extras install (``[torch]``, ``[http]``); what the base install must run without."""
MAIN_JOB_MODULES = ("weightsync_conformance.cli", "weightsync_conformance.plugin", "conformance.suite",
                    "conformance.cases", "conformance.reference", "conformance.mutants", "reports.collect")

pytestmark = pytest.mark.cpu


def _python(code: str) -> str:
    """Run ``code`` in a fresh interpreter at the repository root; its last line of output."""
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=100, cwd=REPO)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout.strip().splitlines()[-1]


@pytest.mark.slow  # a second Python process
def test_main_job_modules_import_no_extra() -> None:
    """Importing the main job's modules imports no package of an extra (torch is imported where it is used)."""
    loaded = json.loads(_python(
        f"import importlib, json, sys\n"
        f"for m in {MAIN_JOB_MODULES!r}: importlib.import_module(m)\n"
        f"print(json.dumps(sorted(m for m in {EXTRAS_ONLY!r} if m in sys.modules)))"))
    assert loaded == []


_WITHOUT_EXTRAS = f"""
import json, sys
for name in {EXTRAS_ONLY!r}:
    sys.modules[name] = None  # as if not installed: import raises ModuleNotFoundError, find_spec gives None
from conformance.cases import fake_backend_factory, run_one
from conformance.reference import integration
out = {{}}
for scenario in ("steady-disk-retract", "steady-tensor-in_place", "lora", "steady-distributed-retract"):
    r = run_one(scenario, integration, fake_backend_factory())
    out[scenario] = r.skipped or {{check: v.status for check, v in r.verdicts.items()}}
print(json.dumps(out))
"""


@pytest.mark.slow  # a second Python process
def test_reference_passes_on_the_fake_without_extras() -> None:
    """Disk and LoRA updates (adapters loaded from disk) pass every check without torch; the distributed and tensor
    transports, which need it (SGLang reads tensor payloads as torch pickles), are not declared, so their scenarios
    are skipped with the reason."""
    results = json.loads(_python(_WITHOUT_EXTRAS))
    for scenario, transport in (("steady-distributed-retract", "distributed"), ("steady-tensor-in_place", "tensor")):
        skipped = results.pop(scenario)
        assert isinstance(skipped, str) and f"'{transport}'" in skipped, (scenario, skipped)
        assert "torch, which is not installed (pip install 'weightsync-conformance[torch]')" in skipped
    for scenario, verdicts in results.items():
        assert isinstance(verdicts, dict) and verdicts, (scenario, verdicts)
        assert set(verdicts.values()) == {"pass"}, (scenario, verdicts)
