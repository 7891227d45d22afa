"""Profiles 0.5.10 → 0.5.15 → 0.5.23 on the wire: each switch that changes between them, seen as a client sees it.

0.5.15 is read from the 0.5.15.post1 wheel (the build a major framework pins); its snapshots are committed."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fakes import structs
from fakes.engine import FakeEngine
from fakes.profiles import PROFILES
from fakes.weights import encode_tensor_payload, perturbed, tiny_model

pytestmark = [pytest.mark.cpu, pytest.mark.asyncio]

SNAPSHOTS = Path(__file__).resolve().parents[2] / "fakes" / "snapshots"
STEPS = ("0.5.10", "0.5.15", "0.5.23")


async def test_every_profile_has_its_snapshots() -> None:
    for version in PROFILES:
        for kind in ("io_struct", "server_args"):
            data = json.loads((SNAPSHOTS / f"{kind}-{version}.json").read_text())
            assert data["label"] == version and data["wheel"].startswith(f"sglang-{data['sglang_version']}-")
    assert json.loads((SNAPSHOTS / "io_struct-0.5.15.json").read_text())["sglang_version"] == "0.5.15.post1"


@pytest.mark.parametrize("version", STEPS)
async def test_what_changes_from_0510_to_0515_to_0523(connect, version: str) -> None:
    wire = await connect(FakeEngine(version))
    after_0510, is_0523 = version != "0.5.10", version == "0.5.23"
    # continue_generation grew torch_empty_cache in 0.5.15 (the snapshot says so, the fake takes it)
    assert ("torch_empty_cache" in structs.struct_fields("ContinueGenerationReqInput", version)) is after_0510
    # weight-update sessions only on 0.5.23: before, the routes are absent and a tensor update needs none
    assert ((await wire.post("/begin_weight_update", json={})).status_code == 200) is is_0523
    body = {"serialized_named_tensors": [encode_tensor_payload(perturbed(tiny_model(0), 1))]}
    assert (await wire.post("/update_weights_from_tensor", json=body)).status_code == 200
    if is_0523:
        await wire.post("/end_weight_update", json={})
    # /get_weight_version: the 404 deprecation body up to 0.5.16, gone on 0.5.23
    deprecated = await wire.get("/get_weight_version")
    assert deprecated.status_code == 404 and ("deprecated" in deprecated.text) is not is_0523
    # a retract pause puts running requests back in the waiting queue: the flush succeeds only where the idle
    # predicate ignores the waiting queue while paused (0.5.23)
    tasks = await wire.start_generates(2, max_new_tokens=40)
    await wire.engine.step(2)
    await wire.post("/pause_generation", json={"mode": "retract"})
    assert ((await wire.post("/flush_cache")).status_code == 200) is is_0523
    await wire.post("/continue_generation", json={"torch_empty_cache": True} if after_0510 else {})
    done = await wire.step_until_done(tasks)
    meta = done[0].json()["meta_info"]
    assert meta[PROFILES[version].retraction_key] == 1 and ("num_retractions" in meta) is after_0510


@pytest.mark.parametrize("version", STEPS)
async def test_a_failed_post_update_flush(connect, tmp_path, version: str) -> None:
    """≤0.5.16 the scheduler asserts (the server dies); 0.5.23 answers 400 with the weights loaded."""
    from fakes.weights import save_checkpoint

    wire = await connect(FakeEngine(version))
    tasks = await wire.start_generates(1, max_new_tokens=40)
    await wire.engine.step(1)
    save_checkpoint(str(tmp_path), perturbed(tiny_model(0), 2))
    await wire.post("/pause_generation", json={"mode": "in_place"})
    resp = await wire.post("/update_weights_from_disk", json={"model_path": str(tmp_path)})
    if version == "0.5.23":
        assert resp.status_code == 400 and "cache was not flushed" in resp.json()["message"]
        await wire.post("/continue_generation", json={})
        await wire.step_until_done(tasks)
    else:
        assert resp.status_code == 500 and wire.engine.crashed
        assert "Cache flush failed after updating weights" in wire.engine.crash_reason
