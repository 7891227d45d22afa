"""Pause modes, aborts, locks and flushes at the wire — including the seed-000 regression (miles #2372)."""

from __future__ import annotations

import asyncio

import pytest

from fakes import weights as W
from fakes.engine import FLUSH_AFTER_UPDATE_ERROR, FakeEngine

pytestmark = pytest.mark.cpu

ABORTED = {"type": "abort", "message": "Aborted", "status_code": None, "err_type": None}
DECODED_BEFORE_PAUSE = 3


def ckpt_v2_body(tmp_path) -> dict:
    return {"model_path": str(tmp_path / "ckpt"), "weight_version": "2"}


async def decoding(wire, n: int = 8, max_new_tokens: int = 16) -> list[asyncio.Task]:
    """``n`` requests that have each decoded ``DECODED_BEFORE_PAUSE`` tokens."""
    tasks = await wire.start_generates(n, max_new_tokens=max_new_tokens)
    await wire.engine.step(DECODED_BEFORE_PAUSE)
    assert len(wire.engine.scheduler.running) == n
    return tasks


async def tensor_update(wire, step: int, **fields) -> None:
    """A complete tensor update (inside a begin/end session where the profile requires one)."""
    payload = W.encode_tensor_payload(W.perturbed(W.tiny_model(0), step))
    sessions = wire.engine.profile.weight_update_sessions
    if sessions:
        assert (await wire.post("/begin_weight_update", json={})).status_code == 200
    resp = await wire.post("/update_weights_from_tensor", json={"serialized_named_tensors": [payload], **fields})
    assert resp.status_code == 200, resp.text
    if sessions:
        assert (await wire.post("/end_weight_update", json={})).status_code == 200


# -- seed 000: update_weight_version's default abort_all_requests=True ----------------------------------------


@pytest.mark.asyncio
@pytest.mark.parametrize("profile", ["0.5.10", "0.5.23"])
@pytest.mark.parametrize("transport", ["tensor", "disk"])
async def test_seed_000_version_bump_aborts_everything_in_place_preserved(connect, tmp_path, profile, transport):
    wire = await connect(FakeEngine(profile))
    tasks = await decoding(wire)
    assert (await wire.post("/pause_generation", json={"mode": "in_place"})).status_code == 200
    if transport == "tensor":
        await tensor_update(wire, 1, flush_cache=False)
    else:
        W.save_checkpoint(str(tmp_path / "ckpt"), W.perturbed(W.tiny_model(0), 1))
        body = {"model_path": str(tmp_path / "ckpt"), "flush_cache": False}
        resp = await wire.post("/update_weights_from_disk", json=body)
        assert resp.status_code == 200, resp.text
    bump = await wire.post("/update_weight_version", json={"new_version": "2"})  # what the wrapper posted
    assert bump.status_code == 200
    assert not any(t.done() for t in tasks)  # in_place: the abort is emitted only after continue + one step
    await wire.post("/continue_generation", json={})
    responses = await wire.step_until_done(tasks)
    for resp in responses:
        body = resp.json()
        meta = body["meta_info"]
        assert resp.status_code == 200 and meta["finish_reason"] == ABORTED
        assert len(body["output_ids"]) == DECODED_BEFORE_PAUSE + 1  # partial output incl. one extra decode step
        assert meta["weight_version"] == "2"
        if profile == "0.5.23":
            assert meta["weight_versions"] == [
                {"version": "default", "start": 0, "end": DECODED_BEFORE_PAUSE},
                {"version": "2", "start": DECODED_BEFORE_PAUSE, "end": DECODED_BEFORE_PAUSE + 1},
            ]
    finishes = wire.engine.events.of_kind("request.finish")
    assert len(finishes) == 8 and all(e.fields["finish_reason"]["type"] == "abort" for e in finishes)


@pytest.mark.asyncio
@pytest.mark.parametrize("profile", ["0.5.10", "0.5.23"])
async def test_seed_000_fix_relabel_only_keeps_every_request(connect, profile) -> None:
    wire = await connect(FakeEngine(profile))
    tasks = await decoding(wire, max_new_tokens=8)
    await wire.post("/pause_generation", json={"mode": "in_place"})
    await tensor_update(wire, 1, flush_cache=False)
    resp = await wire.post("/update_weight_version", json={"new_version": "2", "abort_all_requests": False})
    assert resp.status_code == 200
    await wire.post("/continue_generation", json={})
    for resp in await wire.step_until_done(tasks):
        meta = resp.json()["meta_info"]
        assert meta["finish_reason"] == {"type": "length", "length": 8} and meta["weight_version"] == "2"
        if profile == "0.5.23":
            assert meta["weight_versions"] == [
                {"version": "default", "start": 0, "end": DECODED_BEFORE_PAUSE},
                {"version": "2", "start": DECODED_BEFORE_PAUSE, "end": 8},
            ]
        else:
            assert "weight_versions" not in meta


@pytest.mark.asyncio
async def test_0_5_4_pause_ignores_the_mode_and_aborts(connect) -> None:
    wire = await connect(FakeEngine("0.5.4", max_running_requests=4))
    tasks = await decoding(wire, n=4)
    queued = await wire.start_generates(1, prefix="q")
    resp = await wire.post("/pause_generation", json={"mode": "in_place"})
    assert resp.status_code == 200 and wire.engine.pause_mode == "abort"
    before_prefill = (await wire.result(queued[0])).json()
    assert before_prefill == {
        "text": "",
        "meta_info": {
            "id": "q0",
            "finish_reason": {"type": "abort", "message": "Abort before prefill"},
            "prompt_tokens": 0,
            "completion_tokens": 0,
        },
    }
    for resp in await wire.step_until_done(tasks):
        assert resp.json()["meta_info"]["finish_reason"] == ABORTED


# -- pause(abort) waits for the in-flight requests (≥0.5.6) ---------------------------------------------------------


@pytest.mark.asyncio
@pytest.mark.parametrize("profile", ["0.5.10", "0.5.23"])
async def test_pause_abort_returns_after_every_reader_released(connect, profile) -> None:
    wire = await connect(FakeEngine(profile))
    tasks = await decoding(wire, n=3)
    pause = wire.spawn("POST", "/pause_generation", json={})
    await wire.wait(lambda: wire.engine.paused)
    assert not pause.done() and wire.engine.update_lock.readers == 3
    await wire.engine.step()
    assert (await wire.result(pause)).status_code == 200
    for resp in await wire.results(tasks):
        assert resp.json()["meta_info"]["finish_reason"] == ABORTED


# -- retract --------------------------------------------------------------------------------------------------


@pytest.mark.asyncio
@pytest.mark.parametrize(("profile", "flush_ok"), [("0.5.10", False), ("0.5.23", True)])
async def test_retract_keeps_tokens_reprefills_and_counts(connect, profile, flush_ok) -> None:
    wire = await connect(FakeEngine(profile))
    reference = await connect(FakeEngine(profile))
    tasks = await decoding(wire, n=2, max_new_tokens=6)
    ref_tasks = await decoding(reference, n=2, max_new_tokens=6)
    await wire.post("/pause_generation", json={"mode": "retract"})
    snap = wire.engine.snapshot()
    assert snap["running"] == [] and snap["waiting"] == ["r0", "r1"]
    flush = await wire.post("/flush_cache")  # retracted requests sit in the waiting queue (spec §7.1)
    assert flush.status_code == (200 if flush_ok else 400)
    await wire.engine.step(5)
    assert not any(t.done() for t in tasks)  # paused: no decoding
    await wire.post("/continue_generation", json={})
    got, want = await wire.step_until_done(tasks), await reference.step_until_done(ref_tasks)
    key = wire.engine.profile.retraction_key
    for g, w in zip(got, want):
        assert g.json()["output_ids"] == w.json()["output_ids"]  # seamless continuation
        assert g.json()["meta_info"][key] == 1 and w.json()["meta_info"][key] == 0
    admits = [e for e in wire.engine.events.of_kind("request.admit") if e.fields["rid"] == "r0"]
    assert [e.fields["prefill_tokens"] for e in admits] == [8, 8 + DECODED_BEFORE_PAUSE]


@pytest.mark.asyncio
async def test_abort_of_retracted_requests_is_a_waiting_queue_abort(connect) -> None:
    wire = await connect(FakeEngine("0.5.23"))
    tasks = await decoding(wire, n=2)
    await wire.post("/pause_generation", json={"mode": "retract"})
    await wire.post("/update_weight_version", json={"new_version": "9"})
    for resp in await wire.results(tasks):
        body = resp.json()
        assert body["meta_info"]["finish_reason"] == {"type": "abort", "message": "Abort in waiting queue"}
        assert "prompt_tokens" not in body["meta_info"] and len(body["output_ids"]) == DECODED_BEFORE_PAUSE


@pytest.mark.asyncio
async def test_waiting_queue_aborts_report_the_new_version_on_0_5_10(connect) -> None:
    wire = await connect(FakeEngine("0.5.10"))
    tasks = await decoding(wire, n=1)
    await wire.post("/pause_generation", json={"mode": "retract"})
    await wire.post("/update_weight_version", json={"new_version": "new"})
    (resp,) = await wire.results(tasks)
    assert resp.json()["meta_info"]["weight_version"] == "new"  # abort is async: built after the version is set


# -- the pause gate ---------------------------------------------------------------------------------------------


@pytest.mark.asyncio
@pytest.mark.parametrize("mode", ["in_place", "retract"])
async def test_parked_requests_survive_abort_all_and_run_after_continue(connect, mode) -> None:
    wire = await connect(FakeEngine("0.5.23"))
    await wire.post("/pause_generation", json={"mode": mode})
    parked = [wire.spawn_generate(f"p{i}", 2) for i in range(2)]
    await wire.wait(lambda: wire.engine.snapshot()["parked"] == ["p0", "p1"])
    assert wire.engine.scheduler.live() == []
    # abort_all: the parked requests are not in the scheduler, so nothing is aborted
    await wire.post("/update_weight_version", json={"new_version": "2"})
    await wire.post("/abort_request", json={"abort_all": True})
    await wire.post("/continue_generation", json={})
    for resp in await wire.step_until_done(parked):
        meta = resp.json()["meta_info"]
        assert meta["finish_reason"]["type"] == "length" and meta["weight_version"] == "2"
    assert [e.fields["rid"] for e in wire.engine.events.of_kind("request.parked")] == ["p0", "p1"]


# -- flush after an update under in_place ------------------------------------------------------------------------


@pytest.mark.asyncio
@pytest.mark.parametrize("profile", ["0.5.10", "0.5.23"])
async def test_flush_under_in_place_with_resident_requests(connect, profile) -> None:
    wire = await connect(FakeEngine(profile))
    tasks = await decoding(wire, n=2)
    await wire.post("/pause_generation", json={"mode": "in_place"})
    flush = await wire.post("/flush_cache")
    assert (flush.status_code, flush.text) == (400, "Flush cache failed.\n")
    payload = W.encode_tensor_payload(W.perturbed(W.tiny_model(0), 1))
    digest = W.WeightStore(W.perturbed(W.tiny_model(0), 1)).digest()
    if profile == "0.5.23":
        await wire.post("/begin_weight_update", json={})
    body = {"serialized_named_tensors": [payload], "weight_version": "2"}
    resp = await wire.post("/update_weights_from_tensor", json=body)
    if profile == "0.5.10":  # assert flush_cache_success → the scheduler process dies
        assert resp.status_code == 500 and wire.engine.crashed
        assert (await wire.get("/health")).status_code == 503
        assert (await wire.post("/continue_generation", json={})).status_code == 500
        assert all(r.status_code == 500 for r in await wire.results(tasks))
        assert wire.engine.events.of_kind("engine.crash")[0].fields["reason"].startswith("AssertionError")
    else:  # 0.5.23: an error although the weights changed; the tokenizer-side version is not stamped
        assert (resp.status_code, resp.json()) == (400, {"success": False, "message": FLUSH_AFTER_UPDATE_ERROR})
        assert wire.engine.weights.digest() == digest
        assert (await wire.get("/model_info")).json()["weight_version"] == "default"
        assert wire.engine.scheduler.version == "2"  # scheduler-side version recorded (code-read, spec §3.3.3)
        await wire.post("/end_weight_update", json={})
        await wire.post("/continue_generation", json={})
        for r in await wire.step_until_done(tasks):
            assert r.json()["meta_info"]["weight_versions"][-1]["version"] == "2"


# -- the model-update lock ----------------------------------------------------------------------------------------


@pytest.mark.asyncio
@pytest.mark.parametrize("profile", ["0.5.4", "0.5.23"])
async def test_update_while_serving_waits_for_readers_and_blocks_new_ones(connect, tmp_path, profile) -> None:
    wire = await connect(FakeEngine(profile))
    W.save_checkpoint(str(tmp_path / "ckpt"), W.perturbed(W.tiny_model(0), 2))
    first = await wire.start_generates(1, max_new_tokens=3)
    update = wire.spawn("POST", "/update_weights_from_disk", json=ckpt_v2_body(tmp_path))
    await wire.wait(lambda: wire.engine.update_lock.writers_waiting == 1)
    late = wire.spawn_generate("late", 1)
    await wire.wait(lambda: wire.engine.update_lock.readers_waiting == 1)
    await wire.engine.step(2)
    assert not update.done()
    assert [r.rid for r in wire.engine.scheduler.live()] == ["r0"]  # "late" queues behind the waiting writer
    (done,) = await wire.step_until_done(first)
    assert done.json()["meta_info"]["weight_version"] == "default"
    assert (await wire.result(update)).status_code == 200
    (late_resp,) = await wire.step_until_done([late])
    assert late_resp.json()["meta_info"]["weight_version"] == "2"


@pytest.mark.asyncio
async def test_update_while_paused_skips_the_lock(connect, tmp_path) -> None:
    wire = await connect(FakeEngine("0.5.23"))
    W.save_checkpoint(str(tmp_path / "ckpt"), W.perturbed(W.tiny_model(0), 2))
    tasks = await decoding(wire, n=2)
    await wire.post("/pause_generation", json={"mode": "retract"})
    resp = await wire.post("/update_weights_from_disk", json=ckpt_v2_body(tmp_path))
    assert resp.status_code == 200  # 0.5.23 flush ignores the waiting queue while paused
    await wire.post("/continue_generation", json={})
    for r in await wire.step_until_done(tasks):
        spans = r.json()["meta_info"]["weight_versions"]
        assert [s["version"] for s in spans] == ["default", "2"]


@pytest.mark.asyncio
@pytest.mark.parametrize("path", ["/begin_weight_update", "/end_weight_update"])
async def test_a_session_call_waits_for_readers_unless_paused(connect, path: str) -> None:
    """0.5.23's session calls take the writer side of the model-update lock unless paused
    (``tokenizer_control_mixin.py`` ``_weight_update_session_call``): with a request decoding they answer once it
    ended, even an ``end`` with no session open (found by the fidelity state matrix: the fake answered at once)."""
    wire = await connect(FakeEngine("0.5.23"))
    if path == "/end_weight_update":
        await wire.post("/begin_weight_update", json={})
    (first,) = await wire.start_generates(1, max_new_tokens=3)
    call = wire.spawn("POST", path, json={})
    await wire.wait(lambda: wire.engine.update_lock.writers_waiting == 1)
    await wire.step_until_done([first])
    assert (await wire.result(call)).json() == {"success": True, "message": "Success"}
    tasks = await decoding(wire, n=1)
    await wire.post("/pause_generation", json={"mode": "in_place"})
    again = await wire.post(path, json={})  # paused: no lock, answered at once
    assert again.status_code == 400 and wire.engine.update_lock.writers_waiting == 0
    await wire.post("/continue_generation", json={})
    await wire.step_until_done(tasks)


# -- LoRA unload waits for its users ------------------------------------------------------------------------------


@pytest.mark.asyncio
@pytest.mark.parametrize("profile", ["0.5.15", "0.5.23"])
async def test_lora_unload_waits_for_in_flight_users(connect, tmp_path, profile: str) -> None:
    """The unload unregisters the adapter, then waits for its users. A request naming it meanwhile is refused
    before 0.5.23; on 0.5.23 it reloads the adapter (fact ``lora_implicit_reload``), which waits for the unload to
    finish first (both hold the LoRA update lock)."""
    wire = await connect(FakeEngine(profile, enable_lora=True))
    W.save_lora_adapter(str(tmp_path / "ad"), W.tiny_lora(0))
    await wire.post("/load_lora_adapter", json={"lora_name": "ad", "lora_path": str(tmp_path / "ad")})
    users = await wire.start_generates(2, max_new_tokens=4, lora_path="ad")
    unload = wire.spawn("POST", "/unload_lora_adapter", json={"lora_name": "ad"})
    await wire.wait(lambda: wire.engine.snapshot()["loras"] == {})  # unregistered first
    reloads = wire.engine.profile.lora_implicit_reload
    late = wire.spawn_generate(None, 2, lora_path="ad")
    if not reloads:
        assert (await wire.result(late)).status_code == 400
    await wire.engine.step(2)
    assert not unload.done()  # waits, does not fail
    await wire.step_until_done(users)
    resp = await wire.result(unload)
    assert (resp.status_code, resp.json()["success"]) == (200, True)
    if reloads:
        (answer,) = await wire.step_until_done([late])
        assert answer.status_code == 200
    kinds = [e.kind for e in wire.engine.events if e.kind in ("request.finish", "lora.unload", "lora.load")]
    assert kinds[:4] == ["lora.load", "request.finish", "request.finish", "lora.unload"]
    assert kinds[4:] == (["lora.load", "request.finish"] if reloads else [])


# -- rejected requests change nothing ------------------------------------------------------------------------------

REJECTED = [
    ("/pause_generation", {"mode": "freeze"}),
    ("/pause_generation", b"{broken"),
    ("/update_weight_version", {"new_version": 2}),
    ("/update_weight_version", {}),
    ("/update_weights_from_disk", {"weight_version": "3"}),
    ("/update_weights_from_tensor", {"serialized_named_tensors": "x"}),
    ("/init_weights_update_group", {"master_address": "h"}),
    ("/abort_request", {"abort_all": "maybe"}),
    ("/generate", {"text": 5}),
    ("/generate", {"sampling_params": {}}),
    ("/load_lora_adapter", {"lora_name": "x"}),
]


@pytest.mark.asyncio
async def test_rejected_requests_change_nothing(connect, profile_version: str) -> None:
    wire = await connect(FakeEngine(profile_version, enable_lora=True))
    tasks = await decoding(wire, n=2)
    await wire.post("/update_weight_version", json={"new_version": "1", "abort_all_requests": False})
    before = wire.engine.snapshot()
    for path, body in REJECTED:
        if profile_version == "0.5.4" and path == "/pause_generation":
            continue  # 0.5.4 pause takes no body: any body is a valid pause (test_0_5_4_pause_ignores_the_mode...)
        if isinstance(body, bytes):
            resp = await wire.post(path, content=body, headers={"content-type": "application/json"})
        else:
            resp = await wire.post(path, json=body)
        assert resp.status_code == 400, (path, body, resp.text)
        assert wire.engine.snapshot() == before, (path, body)
    assert not any(t.done() for t in tasks)


# -- abort_all_requests on weight updates; crash on an undecodable tensor payload -------------------------------------


@pytest.mark.asyncio
async def test_update_with_abort_all_requests_aborts_in_flight_then_updates(connect) -> None:
    wire = await connect(FakeEngine("0.5.10"))
    tasks = await decoding(wire, n=2)
    payload = W.encode_tensor_payload(W.perturbed(W.tiny_model(0), 1))
    update = wire.spawn("POST", "/update_weights_from_tensor",
                        json={"serialized_named_tensors": [payload], "abort_all_requests": True, "weight_version": "2"})
    await wire.wait(lambda: wire.engine.update_lock.writers_waiting == 1)  # not paused: waits for the readers
    responses = await wire.step_until_done(tasks)  # the aborts finish on the next step, then the update runs
    assert [r.json()["meta_info"]["finish_reason"] for r in responses] == [ABORTED, ABORTED]
    assert (await wire.result(update)).json()["message"] == "Success Weight version updated to 2."


@pytest.mark.asyncio
async def test_undecodable_tensor_payload_kills_the_engine(connect) -> None:
    wire = await connect(FakeEngine("0.5.10"))
    resp = await wire.post("/update_weights_from_tensor", json={"serialized_named_tensors": ["bm90IGEgcGF5bG9hZA=="]})
    assert resp.status_code == 500 and wire.engine.crashed  # model_runner has no try/except here
    assert (await wire.get("/health")).status_code == 503
