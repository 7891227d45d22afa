"""The fake vLLM's native weight transfer with ``--weight-transfer-config '{"backend": "gloo"}'``
(``fakes/vllm/weight_transfer.py``): a real gloo group with a trainer on 127.0.0.1, vLLM 0.32.0's session rules
(``v1/worker/gpu_worker.py``), a version published only by a finish that succeeded."""

from __future__ import annotations

import asyncio
import socket

import pytest

from fakes.distributed import distributed_metadata, trainer_group
from fakes.tiny_model import perturbed, tiny_model
from fakes.vllm import FakeVLLMEngine
from fakes.vllm.weight_transfer import GROUP_NAME, parse_config

pytestmark = pytest.mark.cpu

dist = pytest.importorskip("torch.distributed")
if not (dist.is_available() and dist.is_gloo_available()):
    pytest.skip("torch.distributed with gloo is not available", allow_module_level=True)

GLOO = '{"backend": "gloo"}'


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _update_info(named: dict) -> dict:
    meta = distributed_metadata(named)
    return {"names": meta["names"], "dtype_names": meta["dtypes"], "shapes": meta["shapes"]}


def _message(answer) -> str:
    assert answer.status_code == 500, answer.text
    message = answer.json()["error"]["message"]
    assert message.startswith("Call to collective_rpc method failed: Worker failed with error '")
    return message


async def _joined(wire, timeout_s: float = 10.0):
    """The trainer (rank 0) and the engine (rank 1) in one group: the init route and the trainer's join together."""
    port = _free_port()
    init = wire.spawn("POST", "/init_weight_transfer_engine", json={"init_info": {
        "master_address": "127.0.0.1", "master_port": port, "rank_offset": 1, "world_size": 2}})
    trainer = await asyncio.to_thread(trainer_group, "127.0.0.1", port, 2, GROUP_NAME, timeout_s)
    answer = await wire.result(init)
    assert answer.status_code == 200 and answer.json() == {"message": "Weight transfer initialized"}
    return trainer


async def _send(wire, trainer, named: dict) -> object:
    update = wire.spawn("POST", "/update_weights", json={"update_info": _update_info(named)})
    await asyncio.to_thread(trainer.send, named)
    return await wire.result(update)


@pytest.mark.asyncio
async def test_a_full_cycle_moves_the_weights_over_gloo_and_the_finish_publishes_the_version(connect) -> None:
    wire = await connect(FakeVLLMEngine(weight_transfer_config=GLOO))
    trainer = await _joined(wire)
    try:
        new = perturbed(tiny_model(), 0)
        assert (await wire.post("/start_weight_update")).json() == {"message": "Weight update started"}
        answer = await _send(wire, trainer, new)
        assert answer.status_code == 200 and answer.json() == {"message": "Weights updated"}
        assert (await wire.get("/weight_info")).json() == {"weight_version": "default"}  # not before the finish
        done = await wire.post("/finish_weight_update", json={"weight_version": "v1"})
        assert done.json() == {"message": "Weight update finished"}
        assert (await wire.get("/weight_info")).json() == {"weight_version": "v1"}
        assert all(wire.engine.weights[name] == blob for name, blob in new.items())
        # a second cycle on the same group; a finish without a version keeps the label
        await wire.post("/start_weight_update")
        assert (await _send(wire, trainer, perturbed(tiny_model(), 1))).status_code == 200
        assert (await wire.post("/finish_weight_update")).status_code == 200
        assert (await wire.get("/weight_info")).json() == {"weight_version": "v1"}
        assert wire.engine.weights.digest() != wire.engine.model.weights.updated(new).digest()
        shut = await wire.post("/shutdown_weight_transfer_engine")
        assert shut.json() == {"message": "Weight transfer shut down"} and wire.engine.weight_transfer.group is None
    finally:
        trainer.destroy()


@pytest.mark.asyncio
async def test_calls_out_of_order_answer_the_workers_errors_and_a_failed_finish_publishes_nothing(connect) -> None:
    wire = await connect(FakeVLLMEngine(weight_transfer_config=GLOO))
    assert "start_weight_update must be called before update_weights." in _message(
        await wire.post("/update_weights", json={"update_info": {"names": [], "dtype_names": [], "shapes": []}}))
    assert "finish_weight_update called without a matching start_weight_update." in _message(
        await wire.post("/finish_weight_update", json={"weight_version": "v9"}))
    assert (await wire.get("/weight_info")).json() == {"weight_version": "default"}
    assert "no draft model is configured" in _message(await wire.post("/start_draft_weight_update"))
    assert (await wire.post("/start_weight_update")).status_code == 200
    assert "already active. Call finish_weight_update first." in _message(await wire.post("/start_weight_update"))
    assert "Cannot release a trainer connection during a weight update" in _message(
        await wire.post("/shutdown_weight_transfer_engine"))
    # an update before the engine joined a group raises in the engine: the session ends
    assert "Gloo weight transfer not initialized" in _message(await wire.post(
        "/update_weights", json={"update_info": {"names": [], "dtype_names": [], "shapes": []}}))
    assert "without a matching start_weight_update" in _message(await wire.post("/finish_weight_update"))
    assert (await wire.post("/shutdown_weight_transfer_engine")).status_code == 200


@pytest.mark.asyncio
async def test_a_failed_update_ends_the_session_and_leaves_no_weights_until_a_session_finishes(connect) -> None:
    wire = await connect(FakeVLLMEngine(weight_transfer_config=GLOO))
    await wire.post("/start_weight_update")
    message = _message(await wire.post("/update_weights", json={"update_info": {"names": ["a"], "dtype_names": []}}))
    assert "Invalid update_info for GlooWeightTransferEngine" in message and "'shapes'" in message
    assert wire.engine.weights_gone and (await wire.post("/weight_checker", json={"action": "checksum"})).status_code \
        == 500
    await wire.post("/start_weight_update")
    assert "`dtype_names` should be of the same size as `names`: got 0 and 1" in _message(await wire.post(
        "/update_weights", json={"update_info": {"names": ["a"], "dtype_names": [], "shapes": []}}))
    assert "without a matching start_weight_update" in _message(
        await wire.post("/finish_weight_update", json={"weight_version": "v2"}))
    assert (await wire.get("/weight_info")).json() == {"weight_version": "default"}
    await wire.post("/start_weight_update")  # a session that finishes gives the layers their tensors back
    assert (await wire.post("/finish_weight_update", json={"weight_version": "v3"})).status_code == 200
    assert not wire.engine.weights_gone and (await wire.get("/weight_info")).json() == {"weight_version": "v3"}


@pytest.mark.asyncio
async def test_an_unknown_parameter_received_fails_the_update_as_vllms_loader_does(connect) -> None:
    wire = await connect(FakeVLLMEngine(weight_transfer_config=GLOO))
    trainer = await _joined(wire)
    try:
        await wire.post("/start_weight_update")
        name, blob = next(iter(tiny_model().items()))
        message = _message(await _send(wire, trainer, {"nope." + name: blob}))
        assert "There is no module or parameter named 'nope' in LlamaForCausalLM." in message
        assert wire.engine.weights_gone
    finally:
        trainer.destroy()


@pytest.mark.asyncio
async def test_an_init_nobody_joins_times_out_and_a_bad_init_info_names_the_field(connect) -> None:
    wire = await connect(FakeVLLMEngine(weight_transfer_config=GLOO))
    wire.engine.weight_transfer.timeout_s = 0.5
    message = _message(await wire.post("/init_weight_transfer_engine", json={"init_info": {
        "master_address": "127.0.0.1", "master_port": _free_port(), "rank_offset": 1, "world_size": 2}}))
    assert "Timed out after 0.5s joining weight update group" in message
    message = _message(await wire.post("/init_weight_transfer_engine", json={"init_info": {"master_port": 1}}))
    assert "Invalid init_info for GlooWeightTransferEngine" in message and "missing 3 required" in message


def test_the_config_names_gloo_and_refuses_what_the_fake_cannot_serve() -> None:
    assert parse_config(None) is None and parse_config(GLOO) == "gloo"
    with pytest.raises(ValueError, match="needs CUDA"):
        parse_config("{}")  # vLLM's default backend: nccl
    with pytest.raises(ValueError, match=r"Invalid weight transfer backend: x\. Available engines: \[.*'gloo'\]"):
        FakeVLLMEngine(weight_transfer_config='{"backend": "x"}')
