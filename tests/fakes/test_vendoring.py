"""`fakes/` is vendorable: copied under another package name it runs a whole weight-sync cycle in-process,
without this repository on the path and without importing `conformance`, `pytest` or `hypothesis`."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytestmark = pytest.mark.cpu

FAKES = Path(__file__).resolve().parents[2] / "fakes"

SCENARIO = textwrap.dedent(
    """
    import asyncio, json, sys
    import vendored_fakes
    assert not {"uvicorn", "httpx", "torch"} & set(sys.modules), "importing the package stays light"
    from vendored_fakes import FakeEngine, __version__
    from vendored_fakes.server import asgi_client
    from vendored_fakes.weights import encode_tensor_payload, perturbed, tiny_model

    async def main():
        engine = FakeEngine(profile="0.5.23", seed=0)          # manual clock: the scenario steps it
        before = engine.weights.digest()
        new_weights = perturbed(tiny_model(0), step=1)
        async with asgi_client(engine.app) as client:
            gen = asyncio.ensure_future(client.post("/generate", json={
                "text": "vendored", "sampling_params": {"max_new_tokens": 6}}))
            await engine.wait_until(lambda: bool(engine.scheduler.waiting or engine.scheduler.running), 5)
            await engine.step(3)
            calls = [
                ("/pause_generation", {"mode": "retract"}),
                ("/begin_weight_update", {}),
                ("/update_weights_from_tensor", {"serialized_named_tensors": [encode_tensor_payload(new_weights)]}),
                ("/end_weight_update", {}),
                ("/update_weight_version", {"new_version": "1", "abort_all_requests": False}),
                ("/continue_generation", {}),
            ]
            statuses = []
            for path, body in calls:
                resp = await client.post(path, json=body)
                statuses.append([path, resp.status_code, resp.text[:200]])
            await engine.step(12)
            out = (await asyncio.wait_for(gen, 10)).json()
        return {
            "version": __version__, "statuses": statuses, "finish": out["meta_info"]["finish_reason"],
            "weight_version": out["meta_info"]["weight_version"], "label": engine.weight_version,
            "digest_changed": engine.weights.digest() != before,
            "modules": sorted(m for m in sys.modules if m.split(".")[0] in {"conformance", "pytest", "hypothesis",
                                                                              "fakes"}),
        }

    print(json.dumps(asyncio.run(main())))
    """
)


def test_no_absolute_self_imports_inside_fakes() -> None:
    offenders = [f"{path.name}:{n}" for path in sorted(FAKES.rglob("*.py"))
                 for n, line in enumerate(path.read_text().splitlines(), 1)
                 if re.search(r"\b(from fakes\b|import fakes\b)", line)]
    assert offenders == [], "fakes/ must import itself relatively only"
    forbidden = [f"{path.name}:{n}" for path in sorted(FAKES.rglob("*.py"))
                 for n, line in enumerate(path.read_text().splitlines(), 1)
                 if re.match(r"\s*(from|import)\s+(conformance|pytest|hypothesis)\b", line)]
    assert forbidden == []


@pytest.mark.slow  # a second Python process
def test_lazy_exports_resolve_and_importing_the_package_stays_light() -> None:
    code = ("import sys, fakes; light = not {'uvicorn', 'httpx', 'torch'} & set(sys.modules); "
            "names = [n for n in fakes.__all__ if n != '__version__']; [getattr(fakes, n) for n in names]; "
            "print(light, fakes.__version__, len(names))")
    proc = subprocess.run([sys.executable, "-c", code], cwd=FAKES.parent, capture_output=True, text=True, timeout=60,
                          env=dict(os.environ, PYTHONPATH=str(FAKES.parent)))
    assert proc.returncode == 0, proc.stderr[-2000:]
    light, version, count = proc.stdout.split()
    assert light == "True" and version == "0.1.0" and int(count) >= 10


@pytest.mark.slow  # a second Python process
def test_a_vendored_copy_runs_a_weight_sync_cycle(tmp_path: Path) -> None:
    shutil.copytree(FAKES, tmp_path / "vendored_fakes", ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    env = {k: v for k, v in os.environ.items() if k not in {"PYTHONPATH", "PYTEST_ADDOPTS", "PYTEST_PLUGINS"}}
    env["PYTHONPATH"] = str(tmp_path)
    proc = subprocess.run([sys.executable, "-I", "-c", f"import sys; sys.path.insert(0, {str(tmp_path)!r})\n"
                           + SCENARIO], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["version"] == "0.1.0"
    assert [s[1] for s in result["statuses"]] == [200] * 6, result["statuses"]
    assert result["finish"] == {"type": "length", "length": 6}, "retract kept the request; it finished after continue"
    assert result["weight_version"] == "1" and result["label"] == "1" and result["digest_changed"]
    assert result["modules"] == [], f"the vendored copy imported {result['modules']}"
