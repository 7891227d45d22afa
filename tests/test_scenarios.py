"""The scenario driver's own waits: they reach the state they promise on a correct integration, or fail in
seconds with what they saw."""

from __future__ import annotations

import asyncio
from dataclasses import replace

import pytest

from conformance import DEFAULT_INTEGRATION
from conformance.cases import fake_backend_factory, load_integration
from conformance.scenarios import SCENARIOS, Run, run_scenario
from conformance.situations.producer import until_next_call, until_producer_blocked
from conformance.situations.resident import holds_any, holds_young, keep_resident
from conformance.situations.waiting import wait_for

pytestmark = pytest.mark.cpu


def _run(script) -> list[str]:
    """Run ``script`` as the mixed-versions scenario (two groups in flight, a buffer of two, batches of one) on
    the reference integration; the scenario's errors."""
    scenario = replace(SCENARIOS["mixed-versions"], name="driver-test", script=script)
    backend = fake_backend_factory()()
    backend.start()
    try:
        history = asyncio.run(asyncio.wait_for(
            run_scenario(scenario, load_integration(DEFAULT_INTEGRATION), backend), 40))
    finally:
        backend.stop()
    return [b.message for b in history.breaks] + [c.error for c in history.cycles if c.error] + \
        [u.reason for u in history.unmet]


def test_update_waits_for_every_engine_even_from_a_full_buffer() -> None:
    """Regression (CI flake): from a full buffer, consuming one batch frees one group at a time, on alternating
    engines, so "drain only when nothing is in flight" never had both engines decoding at once (livelock until
    the 10 s timeout). The wait must keep consuming until every engine holds a request still decoding."""

    async def script(run: Run) -> None:
        await run.start()
        await until_producer_blocked(run)
        for _ in range(3):
            await run.update(resident=True)
            await until_producer_blocked(run)

    assert _run(script) == []


def test_waiting_for_the_next_call_consumes_batches_when_the_producer_blocked() -> None:
    """Regression (real vLLM, 2 runs of 3 of mixed-versions for one mutant): an engine slower than the other let the
    other fill the buffer before each had finished a call and sent the next, and the wait timed out. It consumes
    batches while an engine has none of the integration's calls open, as a trainer would."""
    consumed: list[int] = []

    async def script(run: Run) -> None:
        await run.start()
        await until_producer_blocked(run)
        # blocked for certain once the reference's buffer is full: a starved worker can show a quiet wire while the
        # producer is only between turns (seen once in the README command's run)
        manager = run.roles.manager
        await wait_for(lambda: manager.buffered_groups >= run.rollout.buffer_capacity, 10.0, "a full buffer")
        await until_next_call(run)
        consumed.append(len(run.history.batches))

    assert _run(script) == [] and consumed and consumed[0] >= 1


def test_a_cycle_s_first_pause_waits_for_a_request_resident_on_its_engine(monkeypatch: pytest.MonkeyPatch) -> None:
    """Regression (real vLLM in CI, I1-I2 unknown): on a starved machine the suite's long-lived request ended on its
    own and the pause reached the engine before the request was sent again, so nothing was resident. The first
    pause of every cycle waits at the wire until a request is open on its engine: here engine 0's long-lived
    request is sent only once the pause is waiting for it, and the pause still finds it resident."""
    from conformance.situations import sentinels as sentinel_module
    from conformance.checks import CHECKS

    keep = sentinel_module.Sentinels._keep
    waited: list[bool] = []

    async def late(self, engine: int, adapter: str | None) -> None:
        if engine == 0:
            control = histories[0].backend.control
            waited.append(await wait_until(lambda: (control.holding() or (set(), set()))[0] == {0}, 5.0))
        await keep(self, engine, adapter)
    monkeypatch.setattr(sentinel_module.Sentinels, "_keep", late)
    monkeypatch.setattr(sentinel_module.Sentinels, "_missing", lambda self: [])
    histories: list[Run] = []

    async def script(run: Run) -> None:
        histories.append(run)
        await run.update()

    assert _run(script) == []
    h = histories[0].history
    assert waited == [True], "the pause was not held while engine 0 had nothing open"
    verdict = CHECKS["I1-I2"](h)
    assert verdict.status == "pass", verdict.explain()


def test_a_held_call_waits_out_a_resident_request_near_its_end() -> None:
    """Regression (real vLLM 0.32.0 in CI, I1-I2 unknown): the suite's long-lived request ended with its budget in
    the millisecond its engine's held pause went on. A request resident there lets the held call go on only while it
    has at least a quarter of its decode time left; one nearer its end is waited out (it is sent again as it ends)."""
    from types import SimpleNamespace

    from conformance.wire import WireLog
    from conformance.wire_control import WireControl

    wire = WireLog()
    run = object.__new__(Run)
    run.backend = SimpleNamespace(wire=wire, control=WireControl(), decode_tokens_per_s=100.0, sentinel_tokens=300)
    run.rollout = SimpleNamespace(max_new_tokens=10)

    def resident(age_s: float, engine: int = 0):
        call = wire.open(engine, "POST", "/generate", {"sampling_params": {"max_new_tokens": 100}}, "sentinel")
        call.t_start -= age_s  # 100 tokens at 100 tokens/s: one second of decoding
        return call
    old = resident(0.8)
    assert not holds_any(run, 0), "a request with a fifth of its decode time left let the held call go on"
    resident(0.5, engine=1)
    assert not holds_any(run, 0), "a request on another engine counted"
    fresh = resident(0.01)
    assert holds_any(run, 0)
    wire.close(fresh, 200, {})
    assert not holds_any(run, 0)
    assert old.t_end is None and not holds_any(run, 0)
    resident(0.001)
    assert not holds_any(run, 0), "a request not yet settled at its recorder counted"


def test_a_held_call_on_a_real_engine_takes_its_last_chance_before_the_resident_request_ends() -> None:
    """Regression (real vLLM 0.32.0 in CI, I1-I2 unknown): the vLLM reference pausing in place sends no request while
    its pause is held, so a hold waiting for a young request let every resident one end. On an engine that cannot be
    stalled the held call goes on while the youngest resident request has a quarter to 40% of its decode time left
    (and what the scenario needs after the call); on the fake, which stalls while a call is held, it waits on."""
    from types import SimpleNamespace

    from conformance.wire import WireLog
    from conformance.wire_control import WireControl

    wire = WireLog()
    run = object.__new__(Run)
    run.backend = SimpleNamespace(wire=wire, control=WireControl(), decode_tokens_per_s=100.0, sentinel_tokens=300)
    run.rollout = SimpleNamespace(max_new_tokens=100)  # one second of decoding
    call = wire.open(0, "POST", "/generate", {"sampling_params": {"max_new_tokens": 100}}, "integration")
    for age_s, goes in ((0.3, True), (0.55, False), (0.7, True), (0.8, False)):
        call.t_start = wire.clock() - age_s
        assert holds_young(run, 0) == goes, f"a request {age_s:.0%} through its decode: goes on {not goes}"
    call.t_start = wire.clock() - 0.7
    assert not holds_young(run, 0, keep_s=0.5), "went on with less left than the scenario needs after the call"
    run.backend.control.freeze = lambda frozen: None
    assert not holds_young(run, 0), "the fake, stalled while the call is held, took a last chance"


def test_a_resident_cycle_keeps_real_engines_paused_until_its_first_call_reaches_them() -> None:
    """Regression (the threaded vLLM designs on real vLLM 0.32.0, I1-I2 unknown): a design writes its checkpoint
    after its sends stopped (2.4 s, the engines busy), so every request it had in flight ended before its pause. Real
    engines are paused in their own keep mode from the cycle's start (recorded) and resumed as the first call that
    reaches them goes on, before it is forwarded; calls before it (a weight-version read) do not end it."""
    from types import SimpleNamespace

    from conformance.wire import WireLog
    from conformance.wire_control import WireControl

    wire, calls = WireLog(), []
    control = WireControl(wire.clock, wire.listen)
    control.keep_engines = calls.append
    run = object.__new__(Run)
    run.backend = SimpleNamespace(wire=wire, control=control)
    run.deadlines, run.history = SimpleNamespace(update_s=20.0), SimpleNamespace(injected=[])
    done = keep_resident(run)
    assert calls == [True] and [i.kind for i in run.history.injected] == ["keep"]
    wire.went_on(wire.open(0, "GET", "/get_weight_version", None, announce=False), held=False)
    assert calls == [True]
    wire.went_on(wire.open(1, "POST", "/pause_generation", {"mode": "abort"}, announce=False), held=True)
    assert calls == [True, False], "resumed as the pause went on"
    done()
    assert calls == [True, False] and [i.kind for i in run.history.injected] == ["keep"]


@pytest.mark.slow  # two scenario runs: the README command's tier stays under its minute
def test_a_resume_that_fails_after_the_keep_breaks_the_run_and_a_failed_pause_is_recorded() -> None:
    """An engine the suite's keep-pause may have left paused (its resume failed) makes the rest of the run the
    suite's doing: the run breaks there, after the cycle is recorded. A keep-pause that failed leaves nothing paused:
    recorded once (``keep-failed``), the run goes on."""
    def run_with(hook) -> tuple[list[str], list[str]]:
        backend = fake_backend_factory()()
        backend.control.freeze = None  # as real engines: cannot be stalled, kept through their hook
        backend.control.keep_engines = hook
        backend.start()
        try:
            history = asyncio.run(asyncio.wait_for(run_scenario(
                replace(SCENARIOS["first-drain"], name="keep-test"), load_integration(DEFAULT_INTEGRATION), backend),
                40))
        finally:
            backend.stop()
        return [b.message for b in history.breaks], [i.kind for i in history.injected if i.kind.startswith("keep")]

    def resume_fails(on: bool) -> None:
        if not on:
            raise RuntimeError("POST /resume: engine 0: 500")
    breaks, injected = run_with(resume_fails)
    assert breaks == ["update cycle 0: the engines' resume after a keep-pause failed (RuntimeError: POST /resume: "
                      "engine 0: 500): an engine may be left paused by the suite, so nothing after it is the "
                      "integration's doing"] and injected == ["keep"]

    def pause_fails(on: bool) -> None:
        if on:
            raise RuntimeError("POST /pause?mode=keep&clear_cache=false: engine 1: 500")
    breaks, injected = run_with(pause_fails)
    assert breaks == [] and injected == ["keep-failed"]


async def wait_until(condition, timeout_s: float) -> bool:
    """Whether ``condition()`` became true within ``timeout_s`` (polled)."""
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not condition():
        if asyncio.get_running_loop().time() > deadline:
            return False
        await asyncio.sleep(0.002)
    return True


def test_a_refusal_the_integration_never_triggers_is_reported_not_ignored() -> None:
    """A fault that never fired must not let a scenario pass as if it had been survived."""

    async def script(run: Run) -> None:
        await run.start()
        run.backend.control.refuse(0, "/no_such_endpoint", 400, {"success": False})
        await run.update()

    errors = _run(script)
    assert len(errors) == 1 and "(0, '/no_such_endpoint')" in errors[0] and "never used" in errors[0], errors


def test_a_cycle_whose_engine_is_gone_at_its_end_is_recorded_and_the_run_breaks() -> None:
    """An engine that died by the cycle's end (real vLLM after a forward pass on the weights a failed reload left)
    cannot be read for its weights: the cycle is recorded all the same, so the checkers see what the integration did
    in it, and the run breaks with the error."""
    recorded: list = []

    async def script(run: Run) -> None:
        await run.start()

        def gone() -> None:
            raise ConnectionError("engine 1 is gone")
        run.backend.digests = gone
        try:
            await run.update()
        finally:
            recorded.extend(run.history.cycles)

    errors = _run(script)
    assert len(recorded) == 1 and recorded[0].ok and recorded[0].digests_after is None
    assert any("engine 1 is gone" in e for e in errors), errors


def test_a_slow_engine_keeps_its_call_in_progress_while_the_others_finished() -> None:
    """``update(slow=...)``: the last engine's pause, transfer and continue each stay open (on the wire) until every
    other engine answered its own, and the window is recorded."""
    from conformance.cases import run_one

    result = run_one("slow-engine-tensor", load_integration(DEFAULT_INTEGRATION), fake_backend_factory())
    h = result.history
    windows = [i for i in h.injected if i.kind == "window"]
    assert [w.detail.split("first ")[1].split(" ")[0] for w in windows] == [
        "/pause_generation", "/update_weights_from_tensor", "/continue_generation"] and not h.unmet
    for w, cycle in zip(windows, h.cycles):
        calls = [c for c in h.integration_calls() if c.path in w.detail and cycle.t_start <= c.t_start <= cycle.t_end]
        slow = [c for c in calls if c.engine == w.engine][0]
        assert all(c.t_end < w.t_end <= slow.t_end for c in calls if c.engine != w.engine), (w, calls)
    assert all(v.passed for v in result.verdicts.values()), [v.explain() for v in result.verdicts.values()]


def test_a_window_that_never_opens_leaves_every_check_unknown(monkeypatch: pytest.MonkeyPatch) -> None:
    """When the other engines never finish in time (here: the slow engine must wait longer than its hold), the
    scenario did not show what it is for: every check answers unknown with the reason, never pass."""
    from conformance.cases import run_one
    from conformance.situations import slow
    from conformance.situations.timing import DEADLINES

    monkeypatch.setattr(slow, "LINGER_S", 60.0)
    quick = replace(DEADLINES, update_s=2.0)  # each slow call is held for a quarter of it
    result = run_one("slow-engine-tensor", load_integration(DEFAULT_INTEGRATION), fake_backend_factory(),
                     deadlines=quick)
    assert result.verdicts and all(v.status == "unknown" for v in result.verdicts.values())
    assert "was not kept in progress while the other engines had finished theirs" in \
        result.verdicts["V2"].witness[1], result.verdicts["V2"].witness


def test_a_check_judged_where_its_situation_never_came_answers_unknown() -> None:
    """Each check names the situations it reads (``conformance.situations.registry``); a history without one of them gives
    ``unknown`` with the reason, never a pass on nothing."""
    from conformance.cases import evaluate, run_one
    from conformance.checks import CHECKS

    lora = run_one("lora", load_integration(DEFAULT_INTEGRATION), fake_backend_factory()).history
    assert CHECKS["P1"](lora).status == "pass"  # LoRA cycles keep their order: nothing to fault, nothing shown
    v = evaluate("P1", lora)
    assert v.status == "unknown" and "the history holds no full-weight update cycle" in v.witness[1], v.witness


def test_every_check_judges_a_scenario_and_every_situation_is_built_and_read() -> None:
    from conformance.checks import REGISTRY
    from conformance.situations.registry import SITUATIONS

    judged = {c for s in SCENARIOS.values() for c in s.checks}
    assert judged == set(REGISTRY)
    built = {n for s in SCENARIOS.values() for n in s.situations}
    read = {n for c in REGISTRY.values() for n in c.needs}
    # a window that never opened, or a drain nothing outlasted, is recorded by its script (unmet) for the checks of
    # that scenario only: every check reads the others' absence in every scenario
    assert built == set(SITUATIONS) and read | {"window", "long-drain"} == set(SITUATIONS)


def test_a_tensor_payload_sglang_cannot_read_breaks_the_run_with_the_engine_s_death_as_witness() -> None:
    """An integration that pushes a safetensors buffer through ``/update_weights_from_tensor`` (the reference did
    until the fake was compared with real SGLang, which exits on it): the fake dies as SGLang does, and every case
    of the run fails with that death, naming the payload, as its witness."""
    import base64

    from fakes.safetensors_format import encode_safetensors

    def safetensors_b64(named) -> str:
        return base64.b64encode(encode_safetensors(dict(named))).decode()

    integration = replace(load_integration(DEFAULT_INTEGRATION), tensor_encoder=safetensors_b64)
    from conformance.cases import run_one

    result = run_one("steady-tensor-retract", integration, fake_backend_factory())
    assert result.verdicts and all(v.status == "fail" for v in result.verdicts.values())
    witness = " ".join(result.verdicts["I1-I2"].witness)
    # the first to meet the dead engine names it: the update itself, or (on a loaded machine) a /generate sent as
    # the engine died, whose 500 names the load that killed it
    assert "the run broke" in witness and "update_weights_from_tensor" in witness
    assert "engine crashed" in witness and "is a safetensors buffer" in witness


def test_a_batch_taken_during_a_failed_cycle_comes_once_its_engines_are_back(monkeypatch: pytest.MonkeyPatch) -> None:
    """Regression (CI, the partial-rollout reference on failing-transfer-tensor): a batch the suite began taking while
    the cycle's first calls were held waits for engines the failed load then keeps out of service (P8): the cycle
    does not wait for it (it waited its whole drain deadline, and the run broke with a hang); it comes with the next
    cycle that puts whole weights in, and is recorded."""

    async def feed_until_blocked(self: Run) -> None:  # the feeder's drain that outlasts the engines' pause
        await asyncio.wait_for(_paused(self), 10)
        await self.drain(self.rollout.buffer_capacity + self.rollout.max_in_flight_groups + 1)

    async def _paused(run: Run) -> None:
        while not any(c.path == "/pause_generation" and c.t_end is not None for c in run.backend.wire.snapshot()):
            await asyncio.sleep(0.005)

    from conformance.scenarios import run as run_module

    monkeypatch.setattr(run_module, "feed_held", feed_until_blocked)

    async def script(run: Run) -> None:
        await run.start()
        await run.update(refuse=range(len(run.backend.urls)), resident=True, transport="disk")
        batches = len(run.history.batches)
        await run.update(transport="disk")
        assert len(run.history.batches) > batches  # the batch it was taking, recorded once the engines were back
        await run.drain(1)

    errors = _run(script)
    assert len(errors) == 1 and errors[0].startswith("EngineError: ") and "/update_weights_from_disk" in errors[0], \
        errors  # the refused cycle's own error, nothing broken
