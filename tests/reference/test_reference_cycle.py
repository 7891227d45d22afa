"""The reference updater against fake SGLang engines in real-time mode: whole update cycles."""

from __future__ import annotations

import asyncio

import pytest

from conformance.interface import LoraAdapter, Manager, Updater
from conformance.reference.protocols import WeightSyncClient
from conformance.reference import EngineError
from fakes.faults import Fault, FaultPlan
from fakes.weights import tiny_lora

from reference_rig import Rig, control_endpoints, digest, finish_reasons, trainer_weights, within

pytestmark = pytest.mark.cpu

TRANSFER = {"disk": "/update_weights_from_disk", "tensor": "/update_weights_from_tensor",
            "distributed": "/update_weights_from_distributed"}
LORA_CONFIG = {"peft_type": "LORA", "r": 4, "lora_alpha": 8, "target_modules": ["q_proj", "v_proj"]}


def expected_cycle(transport: str, pause_mode: str) -> list[str]:
    """P1 order on one engine; flush only under retract (C2), a session only around full in-body/broadcast loads."""
    session = transport != "disk"
    return (["/pause_generation"] + ["/flush_cache"] * (pause_mode == "retract")
            + ["/begin_weight_update"] * session + [TRANSFER[transport], "/update_weight_version"]
            + ["/end_weight_update"] * session + ["/continue_generation"])


def control_payloads(engine, endpoint: str) -> list[dict]:
    return [e.fields["payload"] for e in engine.events.of_kind("control") if e.fields["endpoint"] == endpoint]


async def finished(rig: Rig, rids: set[str]) -> None:
    """Wait until every rid in ``rids`` finished on its engine."""
    def done(engine) -> bool:
        mine = rids & {e.fields["rid"] for e in engine.events.of_kind("request.submit")}
        return mine <= {e.fields["rid"] for e in engine.events.of_kind("request.finish")}
    await within(asyncio.gather(*(e.wait_until(lambda e=e: done(e), 10.0) for e in rig.engines)))


async def adapter_in_use(rig: Rig, name: str) -> None:
    """Wait until every engine decodes a request that names adapter ``name``."""
    await within(asyncio.gather(*(e.wait_until(lambda e=e: any(r.lora == name for r in e.scheduler.running), 10.0)
                                  for e in rig.engines)))


@pytest.mark.asyncio
@pytest.mark.parametrize("pause_mode", ["retract", "in_place"])
@pytest.mark.parametrize("transport", ["disk", "tensor", "distributed"])
async def test_update_cycle_keeps_in_flight_requests_and_lands_on_every_engine(rig: Rig, transport: str,
                                                                               pause_mode: str) -> None:
    engines = rig.start_engines()
    roles = await rig.build(pause_mode=pause_mode, turns=2)
    await within(roles.manager.start())
    await rig.running_everywhere()
    in_flight = {r.rid for e in engines for r in e.scheduler.running}
    weights = trainer_weights(engines[0], step=1)
    updater = roles.new_updater()

    assert await within(updater.update(weights, transport=transport)) == 1

    assert (updater.version, roles.manager.weight_version) == (1, 1)
    assert [e.weight_version for e in engines] == ["1", "1"]
    assert [e.weights.digest() for e in engines] == [digest(weights)] * 2
    assert not any(e.paused or e.session_open for e in engines)
    for engine in engines:
        cycle = [p for p in control_endpoints(engine) if p != "/init_weights_update_group"]
        assert cycle == expected_cycle(transport, pause_mode)
        assert control_payloads(engine, "/update_weight_version") == [{"new_version": "1",
                                                                       "abort_all_requests": False}]
        transfer = control_payloads(engine, TRANSFER[transport])[0]
        assert "weight_version" not in transfer and transfer["flush_cache"] is False  # V2: bump is separate
    await finished(rig, in_flight)
    assert "abort" not in finish_reasons(engines)  # I1/I2
    batch = await within(roles.manager.next_batch())
    assert batch.weight_version == 1 and all(g.staleness in (0, 1) for g in batch.groups)


@pytest.mark.asyncio
async def test_lora_updates_are_stamped_versioned_and_retired(rig: Rig) -> None:
    engines = rig.start_engines()
    roles = await rig.build()
    await within(roles.manager.start())
    await rig.running_everywhere()
    updater = roles.new_updater()
    first = LoraAdapter("policy", LORA_CONFIG, {n: b.to_torch() for n, b in tiny_lora(0).items()})
    second = LoraAdapter("policy", LORA_CONFIG, {n: b.to_torch() for n, b in tiny_lora(1).items()})

    assert await within(updater.update(lora=first)) == 1
    assert [e.weight_version for e in engines] == ["1", "1"]  # V1: a LoRA update bumps the shared counter
    assert roles.manager.weight_version == 1 and roles.manager.lora_adapter == "policy-v1"
    await adapter_in_use(rig, "policy-v1")  # P7: new requests name the current adapter
    assert await within(updater.update(lora=second)) == 2
    await adapter_in_use(rig, "policy-v2")
    await within(updater.close())  # waits for policy-v1 to be unloaded once its requests finished

    assert [e.weight_version for e in engines] == ["2", "2"]
    assert [sorted(e.snapshot()["loras"]) for e in engines] == [["policy-v2"]] * 2
    assert not any(e.fields["endpoint"] == "/begin_weight_update" for en in engines
                   for e in en.events.of_kind("control"))  # P2: a LoRA-only sync opens no session
    assert "abort" not in finish_reasons(engines)


@pytest.mark.asyncio
async def test_failover_cell_continues_the_published_version(rig: Rig) -> None:
    engines = rig.start_engines()
    roles = await rig.build()
    first_cell = roles.new_updater()
    assert isinstance(first_cell, Updater) and isinstance(roles.manager, Manager)
    assert all(isinstance(client, WeightSyncClient) for client in roles.engines)
    for step in (1, 2):
        await within(first_cell.update(trainer_weights(engines[0], step), transport="tensor"))

    second_cell = roles.new_updater()
    assert second_cell.version == 2  # F1/V4: not 0
    assert await within(second_cell.update(trainer_weights(engines[0], 3), transport="distributed")) == 3
    assert roles.manager.weight_version == 3 and [e.weight_version for e in engines] == ["3", "3"]


@pytest.mark.asyncio
@pytest.mark.parametrize("transport", ["disk", "tensor", "distributed"])
async def test_failed_transfer_raises_keeps_engines_out_of_service_and_keeps_the_version(rig: Rig,
                                                                                         transport: str) -> None:
    """Engine 0 loaded the weights the cycle then did not publish: every engine the cycle sent weights to stays
    paused (P8), its session closed (I6), until the next cycle loads whole weights and continues them."""
    refusal = Fault(TRANSFER[transport], "error", status=400, body={"success": False, "message": "disk full"},
                    times=1)
    engines = rig.start_engines(faults={1: FaultPlan([refusal])})
    roles = await rig.build()
    await within(roles.manager.start())
    await rig.running_everywhere()
    updater = roles.new_updater()

    with pytest.raises(EngineError) as failure:
        await within(updater.update(trainer_weights(engines[0], 1), transport=transport))

    assert "http://engine1" in str(failure.value) and TRANSFER[transport] in str(failure.value)  # P5 witness
    assert any("stay paused" in note for note in failure.value.__notes__)
    assert [(e.paused, e.session_open) for e in engines] == [(True, False)] * 2  # out of service, sessions closed
    assert (updater.version, roles.manager.weight_version) == (0, None)  # V2
    assert [e.weight_version for e in engines] == ["default", "default"]
    assert "/update_weight_version" not in control_endpoints(engines[0])
    weights = trainer_weights(engines[0], 2)
    assert await within(updater.update(weights, transport=transport)) == 1  # the next cycle works
    assert [e.weights.digest() for e in engines] == [digest(weights)] * 2
    assert not any(e.paused for e in engines) and updater.out_of_service == []


@pytest.mark.asyncio
async def test_a_cycle_that_fails_before_its_transfer_continues_every_engine(rig: Rig) -> None:
    """Their weights are whole: a pause never leaks (I6)."""
    refusal = Fault("/pause_generation", "error", status=500, body={"error": "boom"}, times=1)
    engines = rig.start_engines(faults={1: FaultPlan([refusal])})
    roles = await rig.build()
    await within(roles.manager.start())
    await rig.running_everywhere()
    updater = roles.new_updater()

    with pytest.raises(EngineError):
        await within(updater.update(trainer_weights(engines[0], 1), transport="disk"))

    assert not any(e.paused for e in engines) and updater.out_of_service == []
    assert not any(TRANSFER["disk"] in control_endpoints(e) for e in engines)


@pytest.mark.asyncio
async def test_disk_checkpoints_are_renamed_into_place_and_superseded_ones_removed(rig: Rig) -> None:
    engines = rig.start_engines()
    roles = await rig.build()
    updater = roles.new_updater()
    for step in (1, 2):
        await within(updater.update(trainer_weights(engines[0], step), transport="disk"))

    root = rig.tmp_path / "checkpoints"
    assert sorted(p.name for p in root.iterdir()) == ["v2"]  # v1 removed after every engine loaded v2 (F3)
    assert sorted(p.name for p in (root / "v2").iterdir()) == ["config.json", "model.safetensors"]
    assert [e.model_path for e in engines] == [str(root / "v2")] * 2
