"""The fake vLLM (``fakes.vllm``): vLLM 0.32.0's pause modes, version labels, aborts, disk reload, weight-transfer
routes, LoRA and errors, each as measured on real vLLM on CPU (``gpu/fidelity/vllm.py``) and read in its source.
The engine runs on a manual clock: tokens come only when a test steps it."""

from __future__ import annotations

import asyncio
import subprocess
from pathlib import Path

import httpx
import pytest

from conformance.situations.waiting import wait_for
from fakes.checkpoints import save_checkpoint, save_lora_adapter
from fakes.facts import VLLM
from fakes.tiny_model import perturbed, tiny_lora, tiny_model
from fakes.server import LoopbackServer
from fakes.vllm import FakeVLLMEngine

pytestmark = pytest.mark.cpu

PROMPT = [5, 6, 7, 8]


def _completion(engine: FakeVLLMEngine, max_tokens: int = 50, **extra: object) -> dict:
    return {"model": engine.served_model_name, "prompt": PROMPT, "max_tokens": max_tokens, "ignore_eos": True,
            "return_token_ids": True, **extra}


def gauge(engine: FakeVLLMEngine, name: str) -> float:
    """One gauge of the engine's ``/metrics``."""
    line = next(line for line in engine.metrics().splitlines() if line.startswith(name + "{"))
    return float(line.rsplit(" ", 1)[1])


async def _running(wire, max_tokens: int = 50) -> asyncio.Task:
    """A completion the engine is decoding (admitted, one token out)."""
    task = wire.spawn("POST", "/v1/completions", json=_completion(wire.engine, max_tokens))
    await wire.wait(lambda: bool(wire.engine.scheduler.live()))
    await wire.engine.step(2)
    assert wire.engine.scheduler.running
    return task


@pytest.mark.asyncio
async def test_the_default_pause_aborts_the_request_in_flight_with_the_tokens_it_had(connect) -> None:
    wire = await connect(FakeVLLMEngine())
    task = await _running(wire)
    assert (await wire.post("/pause")).json() == {"status": "paused"}
    choice = (await wire.result(task)).json()["choices"][0]
    assert choice["finish_reason"] == "abort" and 0 < len(choice["token_ids"]) < 50
    assert (await wire.get("/is_paused")).json() == {"is_paused": True}


@pytest.mark.asyncio
async def test_keep_without_clear_cache_freezes_the_request_and_it_completes_after_resume(connect) -> None:
    wire = await connect(FakeVLLMEngine())
    task = await _running(wire)
    await wire.post("/pause", params={"mode": "keep", "clear_cache": "false"})
    before = len(wire.engine.scheduler.running[0].output_ids)
    await wire.engine.step(10)
    assert len(wire.engine.scheduler.running[0].output_ids) == before  # frozen on its blocks: no token while kept
    assert (await wire.post("/reset_prefix_cache")).json() == {"success": False}  # its blocks are held
    await wire.post("/resume")
    choice = (await wire.step_until_done([task]))[0].json()["choices"][0]
    assert choice["finish_reason"] == "length" and len(choice["token_ids"]) == 50


@pytest.mark.asyncio
async def test_keep_clearing_the_caches_preempts_the_request_and_it_completes_after_resume(connect) -> None:
    """``clear_cache`` (true by default, in every mode: ``EngineCore._finish_pause``, 0.32.0) preempts what runs, so
    a reset while paused succeeds; the request is recomputed on resume and ends as it would have. ``/metrics`` still
    counts it running until the engine steps again (measured: its gauges move only as it steps)."""
    wire = await connect(FakeVLLMEngine())
    task = await _running(wire)
    await wire.post("/pause", params={"mode": "keep"})
    assert not wire.engine.scheduler.running and wire.engine.scheduler.waiting[0].retractions == 1
    assert gauge(wire.engine, "vllm:num_requests_running") == 1.0
    assert (await wire.post("/reset_prefix_cache")).json() == {"success": True}
    await wire.post("/resume")
    choice = (await wire.step_until_done([task]))[0].json()["choices"][0]
    assert choice["finish_reason"] == "length" and len(choice["token_ids"]) == 50


@pytest.mark.asyncio
async def test_ignore_eos_keeps_the_requests_own_stop_token_ids(connect) -> None:
    """``ignore_eos`` drops only the model's EOS: a stop token the request names still ends it, and ``stop_reason``
    is that token (``check_stop``, ``v1/core/sched/utils.py``, 0.32.0; measured, ``gpu/fidelity/vllm.py``)."""
    wire = await connect(FakeVLLMEngine())
    task = wire.spawn("POST", "/v1/completions", json=_completion(wire.engine, 8, stop_token_ids=list(range(320))))
    choice = (await wire.step_until_done([task]))[0].json()["choices"][0]
    assert choice["finish_reason"] == "stop" and len(choice["token_ids"]) == 1
    assert choice["stop_reason"] == choice["token_ids"][0]


@pytest.mark.asyncio
async def test_the_generated_tokens_counter_moves_only_as_tokens_are_decoded(connect) -> None:
    """``vllm:generation_tokens_total`` counts every token decoded (``v1/metrics/loggers.py``, 0.32.0): it stands
    still while a pause keeps the request, where the running gauge still shows a request the pause preempted."""
    wire = await connect(FakeVLLMEngine())
    assert gauge(wire.engine, "vllm:generation_tokens_total") == 0.0
    task = await _running(wire, max_tokens=8)
    decoded = gauge(wire.engine, "vllm:generation_tokens_total")
    assert decoded == len(wire.engine.scheduler.running[0].output_ids) > 0
    await wire.post("/pause", params={"mode": "keep"})
    assert gauge(wire.engine, "vllm:num_requests_running") == 1.0  # preempted, the gauge not stepped since
    await wire.engine.step(5)
    assert gauge(wire.engine, "vllm:generation_tokens_total") == decoded
    await wire.post("/resume")
    await wire.step_until_done([task])
    assert gauge(wire.engine, "vllm:generation_tokens_total") == 8.0


@pytest.mark.asyncio
async def test_wait_answers_once_the_batch_drained_and_holds_new_requests(connect) -> None:
    wire = await connect(FakeVLLMEngine())
    task = await _running(wire)
    pause = wire.spawn("POST", "/pause", params={"mode": "wait"})
    await wire.engine.step(5)
    assert not pause.done()  # still decoding: the pause has not answered
    late = wire.spawn("POST", "/v1/completions", json=_completion(wire.engine, 4))
    done = await wire.step_until_done([task, pause])
    assert done[0].json()["choices"][0]["finish_reason"] == "length" and done[1].json() == {"status": "paused"}
    await wire.engine.step(20)
    assert not late.done() and wire.engine.scheduler.waiting  # queued, not refused, not run
    await wire.post("/resume")
    assert (await wire.step_until_done([late]))[0].json()["choices"][0]["finish_reason"] == "length"


@pytest.mark.asyncio
async def test_a_bad_pause_mode_is_a_400_and_changes_nothing(connect) -> None:
    wire = await connect(FakeVLLMEngine())
    answer = await wire.post("/pause", params={"mode": "nope"})
    assert answer.status_code == 400 and "validation error" in answer.json()["error"]["message"]
    assert (await wire.get("/is_paused")).json() == {"is_paused": False}


@pytest.mark.asyncio
async def test_a_relabel_aborts_nothing_and_the_spans_show_both_versions(connect) -> None:
    wire = await connect(FakeVLLMEngine(enable_scale_out=True))
    assert (await wire.get("/weight_info")).json() == {"weight_version": VLLM.fact("initial_weight_version",
                                                                                   VLLM.default_release)}
    task = wire.spawn("POST", "/inference/v1/generate",
                      json={"token_ids": PROMPT, "sampling_params": {"max_tokens": 20, "ignore_eos": True}})
    await wire.wait(lambda: bool(wire.engine.scheduler.live()))
    await wire.engine.step(5)
    assert (await wire.post("/update_weight_version", json={"new_version": "v1"})).json() == {
        "success": True, "new_version": "v1"}
    choice = (await wire.step_until_done([task]))[0].json()["choices"][0]
    assert choice["finish_reason"] == "length" and len(choice["token_ids"]) == 20
    assert [s["version"] for s in choice["weight_versions"]] == ["default", "v1"]
    assert choice["weight_versions"][-1]["end"] == 20


@pytest.mark.asyncio
async def test_generate_needs_scale_out_and_completions_carry_no_version(connect) -> None:
    wire = await connect(FakeVLLMEngine())
    answer = await wire.post("/inference/v1/generate", json={"token_ids": PROMPT, "sampling_params": {}})
    assert answer.status_code == 403 and answer.json()["error"]["type"] == "PermissionDeniedError"
    task = wire.spawn("POST", "/v1/completions", json=_completion(wire.engine, 4))
    choice = (await wire.step_until_done([task]))[0].json()["choices"][0]
    assert "weight_versions" not in choice


@pytest.mark.asyncio
async def test_abort_requests_without_ids_aborts_what_is_in_flight_and_with_ids_counts_them(connect) -> None:
    """Measured on 0.32.0 with the request running in the engine (its ``/metrics``): ``{}`` aborts it, answering
    aborted 1; ids are counted as given, found or not."""
    wire = await connect(FakeVLLMEngine())
    task = await _running(wire)
    assert (await wire.post("/abort_requests", json={})).json() == {"status": "aborted", "aborted": 1}
    assert (await wire.result(task)).json()["choices"][0]["finish_reason"] == "abort"
    task = await _running(wire)
    rid = wire.engine.scheduler.running[0].rid
    assert (await wire.post("/abort_requests", json={"request_ids": [rid, "nope"]})).json()["aborted"] == 2
    assert (await wire.result(task)).json()["choices"][0]["finish_reason"] == "abort"
    assert (await wire.post("/abort_requests", content=b"not json")).json()["error"]["message"] == \
        "Invalid JSON format"


@pytest.mark.asyncio
async def test_a_request_is_known_by_its_routes_prefix_and_an_abort_by_the_bare_request_id_aborts_nothing(
        connect) -> None:
    """Measured on 0.32.0 (``gpu/fidelity/vllm.py``, the aborts by id): ``/inference/v1/generate`` knows the body's
    ``request_id`` r as ``generate-tokens-r`` (its answer says so), ``/v1/completions`` as ``cmpl-r``; an abort naming
    r leaves it decoding."""
    wire = await connect(FakeVLLMEngine(enable_scale_out=True))
    task = wire.spawn("POST", "/inference/v1/generate", json={
        "token_ids": PROMPT, "request_id": "r1", "sampling_params": {"max_tokens": 50, "ignore_eos": True}})
    await wire.wait(lambda: bool(wire.engine.scheduler.live()))
    await wire.engine.step(2)
    assert (await wire.post("/abort_requests", json={"request_ids": ["r1"]})).json()["aborted"] == 1
    assert wire.engine.scheduler.running and not task.done()
    assert (await wire.post("/abort_requests", json={"request_ids": ["generate-tokens-r1"]})).status_code == 200
    answer = (await wire.result(task)).json()
    assert answer["request_id"] == "generate-tokens-r1" and answer["choices"][0]["finish_reason"] == "abort"
    task = wire.spawn("POST", "/v1/completions", json=_completion(wire.engine, 4, request_id="c1"))
    assert (await wire.step_until_done([task]))[0].json()["id"] == "cmpl-c1"


@pytest.mark.asyncio
async def test_reload_weights_reads_the_served_directory_again(connect, tmp_path: Path) -> None:
    save_checkpoint(str(tmp_path), tiny_model(0))
    engine = FakeVLLMEngine(model_path=str(tmp_path))
    wire = await connect(engine)
    before = engine.weights.digest()
    save_checkpoint(str(tmp_path), perturbed(tiny_model(0), step=3))  # the trainer writes the new weights there
    answer = await wire.post("/collective_rpc", json={"method": "reload_weights"})
    assert answer.json() == {"results": [None]} and engine.weights.digest() != before
    assert (await wire.post("/collective_rpc", json={})).status_code == 400
    assert (await wire.post("/collective_rpc", json={"method": "nope"})).status_code == 500


@pytest.mark.asyncio
async def test_reload_weights_from_a_given_path_makes_it_the_served_one(connect, tmp_path: Path) -> None:
    """``kwargs.weights_path`` is read in place and becomes the served path, also when reading it fails: the next
    plain reload fails on it again (``model_loader/reload/inplace.py``, 0.32.0)."""
    engine = FakeVLLMEngine()
    wire = await connect(engine)
    save_checkpoint(str(tmp_path / "step3"), perturbed(tiny_model(0), step=3))
    answer = await wire.post("/collective_rpc", json={"method": "reload_weights",
                                                      "kwargs": {"weights_path": str(tmp_path / "step3")}})
    step3 = engine.weights.digest()
    assert answer.json() == {"results": [None]} and engine.weights_path == str(tmp_path / "step3")
    gone = {"method": "reload_weights", "kwargs": {"weights_path": str(tmp_path / "gone")}}
    answer = await wire.post("/collective_rpc", json=gone)
    assert answer.status_code == 500 and "Repo id must be in the form" in answer.json()["error"]["message"]
    assert (await wire.post("/collective_rpc", json={"method": "reload_weights"})).status_code == 500
    checked = await wire.post("/weight_checker", json={"action": "checksum"})
    assert checked.status_code == 500 and "meta tensor" in checked.json()["error"]["message"]
    answer = await wire.post("/collective_rpc", json={"method": "reload_weights",
                                                      "kwargs": {"weights_path": str(tmp_path / "step3")}})
    assert answer.status_code == 200 and engine.weights.digest() == step3
    assert (await wire.post("/weight_checker", json={"action": "checksum"})).status_code == 200


@pytest.mark.asyncio
async def test_a_forward_pass_after_a_failed_reload_kills_the_engine(connect, tmp_path: Path) -> None:
    """Measured on 0.32.0: a reload that failed left the layers on the meta device; the next completion ends the
    engine core (500 ``EngineDeadError``) and ``/health`` answers 503."""
    wire = await connect(FakeVLLMEngine())
    ended: list[str] = []
    wire.engine.app.on_engine_dead = lambda: ended.append("terminate_if_errored")
    gone = {"method": "reload_weights", "kwargs": {"weights_path": str(tmp_path / "gone")}}
    assert (await wire.post("/collective_rpc", json=gone)).status_code == 500
    assert ended == []  # the engine lives on until a forward pass
    task = wire.spawn("POST", "/v1/completions", json=_completion(wire.engine, 4))
    answer = (await wire.step_until_done([task]))[0]
    assert answer.status_code == 500 and answer.json()["error"]["message"].startswith("EngineCore encountered")
    assert ended == ["terminate_if_errored"]  # the API server is told to shut down (fact engine_death_ends_server)
    assert (await wire.get("/health")).status_code == 503
    assert ended == ["terminate_if_errored"]  # /health catches EngineDeadError itself: it ends nothing


@pytest.mark.asyncio
async def test_the_drop_in_servers_watchdog_ends_the_server_once_the_engine_died() -> None:
    """vLLM's ``watchdog_loop``: a death no request met (a streamed answer's) still ends the server, at its next
    look."""
    from fakes.vllm.launch_server import watch

    engine, stop = FakeVLLMEngine(), asyncio.Event()
    watching = asyncio.ensure_future(watch(engine, stop, every_s=0.01))
    try:
        await engine.step(1)
        assert not stop.is_set() and not watching.done()
        engine.crash("a forward pass on meta tensors")
        await asyncio.wait_for(stop.wait(), 10.0)
    finally:
        watching.cancel()
        await engine.aclose()


@pytest.mark.slow  # a second Python process
def test_the_drop_in_server_exits_once_a_completion_met_the_dead_engine(tmp_path: Path) -> None:
    """Real vLLM 0.32.0's API server shuts down once a request met a dead engine core (``terminate_if_errored``):
    its clients see the port close, not a server answering 503 for ever (measured: ``gpu/fidelity/vllm.py``, the
    LoRA lifetime's last step)."""
    from gpu.engine import EngineProcess

    engine = EngineProcess(None, ("-m", "fakes.vllm.launch_server"), name="fake-vllm-death",
                           args=lambda host, port: ["--host", host, "--port", str(port),
                                                    "--fake-tokens-per-second", "8000"])
    try:
        url = engine.start(60.0)
        gone = {"method": "reload_weights", "kwargs": {"weights_path": str(tmp_path / "gone")}}
        with httpx.Client(timeout=30.0) as client:
            assert client.post(url + "/collective_rpc", json=gone).status_code == 500
            assert client.get(url + "/health").status_code == 200
            model = client.get(url + "/v1/models").json()["data"][0]["id"]
            answer = client.post(url + "/v1/completions", json={"model": model, "prompt": PROMPT, "max_tokens": 2})
            assert answer.status_code == 500, answer.text
        try:
            engine.process.wait(30.0)
        except subprocess.TimeoutExpired:
            pytest.fail(f"the server still runs 30 s after a completion met its dead engine\n{engine.log_tail()}")
    finally:
        engine.stop()


@pytest.mark.asyncio
async def test_generate_names_an_adapter_or_the_base_model(connect, tmp_path: Path) -> None:
    """``/inference/v1/generate`` takes ``model`` (``GenerateRequest.model``): a loaded adapter's name runs the request
    on it, an unknown name is the 404 of ``_check_model``."""
    engine = FakeVLLMEngine(enable_lora=True, enable_scale_out=True)
    wire = await connect(engine)
    save_lora_adapter(str(tmp_path / "a1"), tiny_lora(0))
    assert (await wire.post("/v1/load_lora_adapter", json={"lora_name": "a1",
                                                           "lora_path": str(tmp_path / "a1")})).status_code == 200
    body = {"token_ids": PROMPT, "sampling_params": {"max_tokens": 2}, "model": "a1"}
    task = wire.spawn("POST", "/inference/v1/generate", json=body)
    await wire.wait(lambda: bool(wire.engine.scheduler.live()))
    assert [r.lora for r in engine.scheduler.live()] == ["a1"]
    assert (await wire.step_until_done([task]))[0].json()["model"] == "a1"
    answer = await wire.post("/inference/v1/generate", json={**body, "model": "nope"})
    assert answer.status_code == 404 and answer.json()["error"]["type"] == "NotFoundError"


@pytest.mark.asyncio
async def test_weight_transfer_without_a_config_fails_and_publishes_no_version(connect) -> None:
    wire = await connect(FakeVLLMEngine())
    for path, body in (("/start_weight_update", None), ("/update_weights", {"update_info": {}}),
                       ("/finish_weight_update", {"weight_version": "v9"})):
        answer = await wire.post(path, json=body)
        assert answer.status_code == 500 and "Weight transfer not configured" in answer.json()["error"]["message"]
    assert (await wire.get("/weight_info")).json()["weight_version"] != "v9"
    assert (await wire.post("/shutdown_weight_transfer_engine")).json() == {"message": "Weight transfer shut down"}


@pytest.mark.asyncio
async def test_lora_needs_enable_lora_refuses_a_second_load_and_names_an_unknown_unload(connect, tmp_path) -> None:
    save_lora_adapter(str(tmp_path), tiny_lora(0))
    body = {"lora_name": "a", "lora_path": str(tmp_path)}
    off = await connect(FakeVLLMEngine())
    answer = await off.post("/v1/load_lora_adapter", json=body)
    assert answer.status_code == 500 and "LoRA is not enabled" in answer.json()["error"]["message"]
    wire = await connect(FakeVLLMEngine(enable_lora=True))
    assert (await wire.post("/v1/load_lora_adapter", json=body)).text == \
        "Success: LoRA adapter 'a' added successfully."
    assert (await wire.post("/v1/load_lora_adapter", json=body)).status_code == 400
    assert (await wire.post("/v1/load_lora_adapter", json={**body, "load_inplace": True})).status_code == 200
    assert [m["id"] for m in (await wire.get("/v1/models")).json()["data"]][1:] == ["a"]
    assert (await wire.post("/v1/unload_lora_adapter", json={"lora_name": "b"})).status_code == 404


@pytest.mark.asyncio
async def test_an_adapter_above_max_lora_rank_or_not_on_disk_is_refused_and_not_listed(connect, tmp_path) -> None:
    """As real vLLM 0.32.0 on CPU answered (``gpu/fidelity/vllm.py``'s LoRA lifetime): the worker's rank check is a
    500 quoting its error; a path without an adapter a 404."""
    save_lora_adapter(str(tmp_path / "big"), tiny_lora(0, r=16), {"r": 16, "lora_alpha": 32,
                                                                  "target_modules": ["q_proj", "v_proj"]})
    wire = await connect(FakeVLLMEngine(enable_lora=True, max_lora_rank=8))
    big = await wire.post("/v1/load_lora_adapter", json={"lora_name": "big", "lora_path": str(tmp_path / "big")})
    assert big.status_code == 500 and big.json()["error"]["message"] == (
        "Call to add_lora method failed: Worker failed with error 'LoRA rank 16 is greater than max_lora_rank 8.', "
        "please check the stack trace above for the root cause")
    gone = await wire.post("/v1/load_lora_adapter", json={"lora_name": "gone", "lora_path": str(tmp_path / "gone")})
    assert gone.status_code == 404 and gone.json()["error"]["message"] == \
        f"Loading lora gone failed: No adapter found for {tmp_path / 'gone'}"
    assert [m["id"] for m in (await wire.get("/v1/models")).json()["data"]][1:] == []


@pytest.mark.asyncio
async def test_an_unknown_model_is_a_404_naming_the_served_one(connect) -> None:
    wire = await connect(FakeVLLMEngine())
    error = (await wire.post("/v1/completions", json={**_completion(wire.engine), "model": "nope"})).json()["error"]
    assert error == {"message": f"The model `nope` does not exist. Valid aliases: {wire.engine.served_model_name}.",
                     "type": "NotFoundError", "param": "model", "code": 404}


@pytest.mark.asyncio
async def test_sleep_pauses_and_wake_up_resumes(connect) -> None:
    wire = await connect(FakeVLLMEngine())
    task = await _running(wire)
    assert (await wire.post("/sleep", params={"level": "1"})).json() == {"status": "sleeping", "level": 1}
    assert (await wire.result(task)).json()["choices"][0]["finish_reason"] == "abort"  # its pause mode: abort
    assert (await wire.get("/is_sleeping")).json() == {"is_sleeping": True}
    assert (await wire.post("/wake_up")).json() == {"status": "awake", "tags": None}
    assert (await wire.get("/is_paused")).json() == {"is_paused": False}


@pytest.mark.asyncio
async def test_a_partial_wake_leaves_the_scheduler_paused_until_nothing_sleeps(connect) -> None:
    """``EngineCore.wake_up`` (0.32.0) resumes scheduling only once every tag is awake: waking the weights first (to
    load new ones) keeps the engine paused; /is_sleeping is true while the scheduler is paused, also by /pause alone."""
    wire = await connect(FakeVLLMEngine())
    await wire.post("/sleep", params={"level": "1", "mode": "keep"})
    assert (await wire.post("/wake_up", params={"tags": "weights"})).json() == {"status": "sleeping",
                                                                                 "tags": ["weights"]}
    assert (await wire.get("/is_paused")).json() == {"is_paused": True}
    assert (await wire.post("/wake_up?tags=weights")).json()["status"] == "sleeping"  # not asleep: nothing woken
    assert (await wire.post("/wake_up?tags=kv_cache&tags=scheduling")).json() == {
        "status": "awake", "tags": ["kv_cache", "scheduling"]}
    assert (await wire.get("/is_paused")).json() == {"is_paused": False}
    await wire.post("/pause", params={"mode": "keep"})
    assert (await wire.get("/is_sleeping")).json() == {"is_sleeping": True}
    assert (await wire.post("/wake_up")).json() == {"status": "awake", "tags": None}  # level 0: scheduling only


@pytest.mark.parametrize("path", ["/v1/completions", "/inference/v1/generate"])
def test_a_client_leaving_aborts_its_request(path: str) -> None:
    """Both generation routes are wrapped in ``with_cancellation`` (``entrypoints/utils.py``, 0.32.0): over real HTTP,
    the handler is cancelled when the client goes, and its request is aborted with the tokens it had."""
    engine = FakeVLLMEngine(enable_scale_out=True)
    body = _completion(engine, 100) if path == "/v1/completions" else \
        {"token_ids": PROMPT, "sampling_params": {"max_tokens": 100, "ignore_eos": True}}

    async def leave(url: str) -> None:
        async with httpx.AsyncClient(base_url=url, timeout=10) as client:
            task = asyncio.ensure_future(client.post(path, json=body))
            await wait_for(lambda: bool(engine.scheduler.live()), 5, "the request submitted")
            await asyncio.to_thread(engine.step_threadsafe, 2)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
        await wait_for(lambda: not engine.scheduler.live(), 5, "the request aborted")

    with LoopbackServer(engine.app) as server:
        asyncio.run(leave(server.url))
    finish = engine.events.of_kind("request.finish")[-1]
    assert finish.fields["finish_reason"]["type"] == "abort" and finish.fields["completion_tokens"] == 2
