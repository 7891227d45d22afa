"""Routes and payload forms frameworks use: /release_memory_occupation, /resume_memory_occupation, /v1/models, and
tensor payloads as SGLang's weight_sync helper builds them (LocalSerializedTensor per TP rank, flattened_bucket)."""

from __future__ import annotations

import base64
import sys

import pytest

from fakes import structs
from fakes.engine import FakeEngine
from fakes.weights import (
    encode_flattened_bucket,
    encode_tensor_payload,
    encode_weight_sync_payload,
    perturbed,
    save_lora_adapter,
    tiny_lora,
    tiny_model,
    weights_digest,
)

pytestmark = pytest.mark.cpu

VERSIONS = ("0.5.4", "0.5.10", "0.5.23")


@pytest.mark.parametrize("version", VERSIONS)
def test_routes_are_served_as_the_snapshot_lists_them(version: str) -> None:
    wire = structs.endpoints(version)
    app = FakeEngine(version).app
    for path in ("/release_memory_occupation", "/resume_memory_occupation", "/v1/models", "/v1/models/{model:path}"):
        route = app.router.routes[path]
        assert list(route.methods) == wire[path]["methods"], (version, path)
        assert app.structs[path] == wire[path].get("struct"), (version, path)
    assert wire["/release_memory_occupation"]["body_required"] is True


@pytest.mark.asyncio
@pytest.mark.parametrize("version", VERSIONS)
async def test_release_and_resume_answer_null_and_keep_weights_without_memory_saver(connect, version) -> None:
    wire = await connect(FakeEngine(version))
    before = wire.engine.weights.digest()
    for path in ("/release_memory_occupation", "/resume_memory_occupation"):
        resp = await wire.call("GET", path, json={})  # GET and POST, body required
        assert resp.status_code == 200 and resp.text == "null" and resp.headers["content-type"] == "application/json"
    assert (await wire.post("/release_memory_occupation", json={"tags": ["kv_cache"]})).status_code == 200
    assert wire.engine.snapshot()["released_memory"] == ["kv_cache"]
    assert (await wire.post("/resume_memory_occupation", json={"tags": ["kv_cache"]})).status_code == 200
    assert wire.engine.weights.digest() == before  # the no-op memory saver adapter changes nothing
    assert [e.kind for e in wire.engine.events if e.kind.startswith("memory.")] == ["memory.release", "memory.resume"] * 2
    (await wire.post("/release_memory_occupation", json={}))
    assert wire.engine.snapshot()["released_memory"] == sorted(wire.engine.profile.memory_tags)


@pytest.mark.asyncio
@pytest.mark.parametrize(("cpu_backup", "kept"), [(False, False), (True, True)])
async def test_memory_saver_loses_released_weights_unless_backed_up(connect, cpu_backup, kept) -> None:
    wire = await connect(FakeEngine("0.5.23", enable_memory_saver=True, enable_weights_cpu_backup=cpu_backup))
    before = wire.engine.weights.digest()
    assert (await wire.post("/release_memory_occupation", json={})).status_code == 200
    assert (await wire.post("/resume_memory_occupation", json={})).status_code == 200
    assert (wire.engine.weights.digest() == before) is kept
    if not kept:  # the trainer pushes the weights again: the update loads into the resumed memory
        new = perturbed(tiny_model(0), step=1)
        await wire.post("/begin_weight_update", json={})
        body = {"serialized_named_tensors": [encode_tensor_payload(new)]}
        assert (await wire.post("/update_weights_from_tensor", json=body)).status_code == 200
        assert wire.engine.weights.digest() == weights_digest(new)


@pytest.mark.asyncio
@pytest.mark.parametrize(("version", "crashes"), [("0.5.4", False), ("0.5.10", True), ("0.5.23", True)])
async def test_release_with_a_running_request(connect, version, crashes) -> None:
    wire = await connect(FakeEngine(version))
    (task,) = await wire.start_generates(1, max_new_tokens=50)
    await wire.engine.step(1)
    resp = await wire.post("/release_memory_occupation", json={})
    assert (resp.status_code == 500) is crashes and wire.engine.crashed is crashes
    if crashes:
        assert "should be called only when server is idle" in wire.engine.crash_reason
    else:
        task.cancel()


@pytest.mark.asyncio
async def test_release_while_paused_with_retracted_requests_is_allowed_on_0523(connect) -> None:
    wire = await connect(FakeEngine("0.5.23"))
    tasks = await wire.start_generates(2, max_new_tokens=50)
    await wire.engine.step(1)
    assert (await wire.post("/pause_generation", json={"mode": "retract"})).status_code == 200
    assert (await wire.post("/release_memory_occupation", json={})).status_code == 200  # ignore_waiting while paused
    assert (await wire.post("/resume_memory_occupation", json={})).status_code == 200
    assert (await wire.post("/continue_generation", json={})).status_code == 200
    assert all(r.status_code == 200 for r in await wire.step_until_done(tasks))


@pytest.mark.asyncio
async def test_generating_on_released_memory_or_resuming_what_was_not_released_crashes(connect) -> None:
    wire = await connect(FakeEngine("0.5.23", enable_memory_saver=True))
    assert (await wire.post("/release_memory_occupation", json={"tags": ["kv_cache"]})).status_code == 200
    task = wire.spawn_generate("r0")
    await wire.wait(lambda: bool(wire.engine.scheduler.waiting))
    await wire.engine.step(1)
    assert wire.engine.crashed and "illegal memory access" in wire.engine.crash_reason
    assert (await wire.result(task)).status_code == 500
    other = await connect(FakeEngine("0.5.10"))
    assert (await other.post("/resume_memory_occupation", json={"tags": ["weights"]})).status_code == 500
    assert other.engine.crash_reason.startswith("KeyError: 'weights'")


@pytest.mark.asyncio
@pytest.mark.parametrize(("version", "lists_loras"), [("0.5.4", False), ("0.5.10", True), ("0.5.23", True)])
async def test_v1_models_lists_the_served_model_and_loaded_adapters(connect, tmp_path, version, lists_loras) -> None:
    wire = await connect(FakeEngine(version, enable_lora=True, served_model_name="policy"))
    save_lora_adapter(str(tmp_path), tiny_lora(0))
    resp = await wire.post("/load_lora_adapter", json={"lora_name": "a", "lora_path": str(tmp_path)})
    assert resp.status_code == 200, resp.text
    listing = (await wire.get("/v1/models")).json()
    assert listing["object"] == "list" and listing["data"][0]["id"] == "policy"
    assert listing["data"][0]["max_model_len"] == 256  # config.json max_position_embeddings
    adapters = [(c["id"], c["root"], c["parent"]) for c in listing["data"][1:]]
    assert adapters == ([("a", str(tmp_path), "policy")] if lists_loras else [])
    assert (await wire.get("/v1/models/policy")).json()["id"] == "policy"
    missing = await wire.get("/v1/models/a")
    assert missing.status_code == 404 and missing.json()["error"]["code"] == "model_not_found"


# -- payload forms -------------------------------------------------------------------------------------------


async def _push(wire, items, load_format=None):
    await wire.post("/begin_weight_update", json={})
    body = {"serialized_named_tensors": items}
    if load_format is not None:
        body["load_format"] = load_format
    resp = await wire.post("/update_weights_from_tensor", json=body)
    if not wire.engine.crashed:
        await wire.post("/end_weight_update", json={})
    return resp


@pytest.mark.asyncio
@pytest.mark.parametrize("fmt", ["pickle", "torch"])
async def test_weight_sync_helper_payload_local_serialized_tensor_per_rank(connect, fmt) -> None:
    wire = await connect(FakeEngine("0.5.23"))
    new = perturbed(tiny_model(0), step=5)
    items = encode_weight_sync_payload(new, tp_size=2, fmt=fmt)  # one item per TP rank, as the helper sends
    raw = base64.b64decode(items[0])
    assert b"sglang.srt.model_executor.model_runner_components.weight_updater" in raw and b"LocalSerializedTensor" in raw
    resp = await _push(wire, items)
    assert resp.status_code == 200, resp.text
    assert wire.engine.weights.digest() == weights_digest(new)
    assert "sglang" not in sys.modules  # decoded without importing sglang


@pytest.mark.asyncio
@pytest.mark.parametrize(("engine", "trainer"), [("0.5.15", "0.5.23"), ("0.5.23", "0.5.15")])
async def test_a_local_serialized_tensor_pickled_by_another_release_kills_the_engine(connect, engine, trainer) -> None:
    """SafeUnpickler resolves LocalSerializedTensor only in the module it lives in, in the engine's release (0.5.15:
    model_runner; 0.5.23: model_runner_components.weight_updater); any other path raises in the TP worker, outside
    any try: the server exits (measured on real 0.5.15 with the 0.5.23 path)."""
    new = perturbed(tiny_model(0), step=5)
    own = await connect(FakeEngine(engine))
    assert (await _push(own, encode_weight_sync_payload(new, fmt="pickle", release=engine))).status_code == 200
    wire = await connect(FakeEngine(engine))
    assert (await _push(wire, encode_weight_sync_payload(new, fmt="pickle", release=trainer))).status_code == 500
    assert "LocalSerializedTensor" in wire.engine.crash_reason, wire.engine.crash_reason


@pytest.mark.asyncio
async def test_flattened_bucket_payload(connect) -> None:
    wire = await connect(FakeEngine("0.5.23"))
    new = perturbed(tiny_model(0), step=6)
    resp = await _push(wire, [encode_flattened_bucket(new, fmt="pickle")], load_format="flattened_bucket")
    assert resp.status_code == 200, resp.text
    assert wire.engine.weights.digest() == weights_digest(new)
    # the bucket without its load_format is a dict where SGLang iterates (name, tensor) pairs: the scheduler dies
    other = await connect(FakeEngine("0.5.23"))
    assert (await _push(other, [encode_flattened_bucket(new, fmt="pickle")])).status_code == 500
    third = await connect(FakeEngine("0.5.23"))
    assert (await _push(third, [encode_tensor_payload(new)], load_format="bogus")).status_code == 500
    assert "Unknown load_format=bogus" in third.engine.crash_reason


@pytest.mark.asyncio
@pytest.mark.parametrize(("limits", "fits"), [({"max_lora_rank": 8}, True), ({"max_lora_rank": 2}, False),
                                              ({"lora_target_modules": ["q_proj", "v_proj"]}, True),
                                              ({"lora_target_modules": ["q_proj"]}, False),
                                              ({"lora_target_modules": ["all"]}, True)])
async def test_lora_adapter_must_fit_max_rank_and_target_modules(connect, tmp_path, limits, fits) -> None:
    wire = await connect(FakeEngine("0.5.23", enable_lora=True, **limits))
    save_lora_adapter(str(tmp_path), tiny_lora(0, r=4))  # rank 4 on q_proj, v_proj
    body = (await wire.post("/load_lora_adapter", json={"lora_name": "a", "lora_path": str(tmp_path)})).json()
    assert body["success"] is fits, body
    if not fits:
        assert body["error_message"].startswith("LoRA adapter a with rank 4 is incompatible with the current LoRA "
                                                "memory pool configuration.")


# -- tensor parallelism (--tp-size): every TP rank takes part in the weight sync -----------------------------


@pytest.mark.asyncio
async def test_tp_ranks_each_need_their_tensor_payload_item(connect) -> None:
    new = perturbed(tiny_model(0), step=7)
    wire = await connect(FakeEngine("0.5.10", tp_size=2))
    body = {"serialized_named_tensors": encode_weight_sync_payload(new, tp_size=2, fmt="pickle", release="0.5.10")}
    assert (await wire.post("/update_weights_from_tensor", json=body)).status_code == 200
    assert wire.engine.weights.digest() == weights_digest(new)
    one_item = {"serialized_named_tensors": [encode_tensor_payload(new)]}  # tp rank 1 has no item: IndexError
    assert (await wire.post("/update_weights_from_tensor", json=one_item)).status_code == 500
    assert wire.engine.crash_reason.startswith("IndexError")


@pytest.mark.asyncio
async def test_tp_ranks_each_join_the_weight_update_group(connect) -> None:
    import socket
    import threading

    from fakes.weights import distributed_metadata, trainer_group

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    wire = await connect(FakeEngine("0.5.10", tp_size=2, group_timeout_s=10.0))
    trainer: dict = {}
    joining = threading.Thread(target=lambda: trainer.setdefault("g", trainer_group("127.0.0.1", port, 3, "g", 10.0)))
    joining.start()
    init = {"master_address": "127.0.0.1", "master_port": port, "rank_offset": 1, "world_size": 3,
            "group_name": "g", "backend": "nccl"}  # world = trainer + 2 TP ranks of this engine
    resp = await wire.post("/init_weights_update_group", json=init, timeout=15.0)
    joining.join(15.0)
    assert resp.status_code == 200 and "g" in trainer, resp.text
    try:
        new = perturbed(tiny_model(0), step=8)
        sent = {**new, "model.layers.0.self_attn.q_norm.weight": new["model.norm.weight"]}  # a name it lacks: skipped
        sending = threading.Thread(target=trainer["g"].send, args=(sent,))
        sending.start()
        body = {**distributed_metadata(sent), "group_name": "g"}
        resp = await wire.post("/update_weights_from_distributed", json=body, timeout=15.0)
        sending.join(15.0)
        assert resp.status_code == 200 and not sending.is_alive(), resp.text
        assert wire.engine.weights.digest() == weights_digest(new)
        assert [e.fields["name"] for e in wire.engine.events.of_kind("weights.skipped")] == [
            "model.layers.0.self_attn.q_norm.weight"]
        # load_format "flattened_bucket" (what frameworks send): one broadcast of the bucket's bytes per TP rank
        bucket = perturbed(tiny_model(0), step=9)
        sending = threading.Thread(target=trainer["g"].send, args=(bucket,), kwargs={"load_format": "flattened_bucket"})
        sending.start()
        body = {**distributed_metadata(bucket), "group_name": "g", "load_format": "flattened_bucket"}
        resp = await wire.post("/update_weights_from_distributed", json=body, timeout=15.0)
        sending.join(15.0)
        assert resp.status_code == 200 and not sending.is_alive(), resp.text
        assert resp.json()["message"] == "Succeeded to update parameter online."
        assert wire.engine.weights.digest() == weights_digest(bucket)
        assert (await wire.post("/destroy_weights_update_group", json={"group_name": "g"})).status_code == 200
    finally:
        trainer["g"].destroy()


@pytest.mark.asyncio
async def test_api_key_guards_every_route_but_the_probes(connect) -> None:
    wire = await connect(FakeEngine("0.5.23", api_key="s3cret"))
    for path, method in (("/model_info", "GET"), ("/pause_generation", "POST"), ("/no/such/route", "GET")):
        resp = await wire.call(method, path, json={"mode": "abort"} if method == "POST" else None)
        assert (resp.status_code, resp.json()) == (401, {"error": "Unauthorized"}), path
        wrong = await wire.call(method, path, headers={"Authorization": "Bearer nope"})
        assert wrong.status_code == 401, path
    ok = await wire.get("/model_info", headers={"Authorization": "bearer s3cret"})
    assert ok.status_code == 200
    assert (await wire.get("/ready")).status_code == 200  # probes need no key
    (health,) = await wire.step_until_done([wire.spawn("GET", "/health")])
    assert health.status_code == 200
