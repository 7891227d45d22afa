"""The wire recorder: what it records, and the refusals it injects in front of an engine."""

from __future__ import annotations

import asyncio
import threading
import time

import httpx
import pytest

from conformance.wire import PROBE_HEADER, WireLog, WireRecorder
from conformance.wire_control import WireControl

pytestmark = pytest.mark.cpu


class CountingApp:
    """A stand-in engine: answers 200 ``{"success": true}`` and counts the requests that reach it."""

    def __init__(self) -> None:
        self.seen: list[str] = []

    async def __call__(self, scope: dict, receive, send) -> None:
        await receive()
        self.seen.append(scope["path"])
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"application/json")]})
        await send({"type": "http.response.body", "body": b'{"success": true}'})


def _post(app, path: str, payload: dict, headers: dict | None = None) -> httpx.Response:
    async def go() -> httpx.Response:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://engine") as client:
            return await client.post(path, json=payload, headers=headers)
    return asyncio.run(asyncio.wait_for(go(), 10))


def test_calls_are_recorded_with_payload_status_and_response_but_probes_are_not() -> None:
    log, engine = WireLog(), CountingApp()
    app = WireRecorder(engine, 3, log)
    assert _post(app, "/update_weights_from_disk", {"model_path": "/ckpt/1"}).status_code == 200
    assert _post(app, "/model_info", {}, headers={PROBE_HEADER: "1"}).status_code == 200
    [call] = log.snapshot()
    assert (call.engine, call.path, call.payload, call.status, call.response) == \
        (3, "/update_weights_from_disk", {"model_path": "/ckpt/1"}, 200, {"success": True})
    assert call.ok and call.t_end is not None and engine.seen == ["/update_weights_from_disk", "/model_info"]


def test_a_refusal_answers_once_without_reaching_the_engine_and_is_recorded() -> None:
    log, engine = WireLog(), CountingApp()
    control = WireControl(log.clock)
    app = WireRecorder(engine, 1, log, control)
    body = {"success": False, "message": "Failed to update weights: injected.", "num_paused_requests": 0}
    control.refuse(1, "/update_weights_from_disk", 400, body)
    control.refuse(0, "/update_weights_from_disk", 400, body)  # another engine's: never used here
    refused = _post(app, "/update_weights_from_disk", {"model_path": "/ckpt/2"})
    assert (refused.status_code, refused.json()) == (400, body)
    assert engine.seen == []
    assert _post(app, "/update_weights_from_disk", {"model_path": "/ckpt/2"}).status_code == 200  # consumed once
    assert engine.seen == ["/update_weights_from_disk"]
    first, second = log.snapshot()
    assert (first.status, first.response, first.ok) == (400, body, False) and second.ok
    assert control.clear_refusals() == [(0, "/update_weights_from_disk")]
    assert control.clear_refusals() == []


def test_held_answers_reach_the_client_only_once_released_and_the_call_ends_then() -> None:
    log, engine, released = WireLog(), CountingApp(), asyncio.Event()
    control = WireControl(log.clock)
    app = WireRecorder(engine, 0, log, control)
    hold = control.hold_answers(released.is_set, timeout_s=10)

    async def go() -> tuple[float, float]:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://engine") as client:
            answer = asyncio.create_task(client.post("/generate", json={"text": "x"}))
            await asyncio.wait_for(_until(lambda: hold.held == 1), 5)
            assert engine.seen == ["/generate"] and not answer.done()  # the engine answered; the client waits
            t_release = log.clock()
            released.set()
            assert (await asyncio.wait_for(answer, 5)).status_code == 200
            return t_release, log.clock()
    t_release, t_after = asyncio.run(go())
    [call] = log.snapshot()
    assert hold.released_by == "ready" and t_release <= call.t_end <= t_after
    assert _post(app, "/update_weights_from_disk", {}).status_code == 200  # only /generate answers are held


def test_held_answers_go_on_at_the_timeout_or_when_the_holds_are_released() -> None:
    log, engine = WireLog(), CountingApp()
    control = WireControl(log.clock)
    app = WireRecorder(engine, 0, log, control)
    hold = control.hold_answers(lambda: False, timeout_s=0.05)
    assert _post(app, "/generate", {"text": "x"}).status_code == 200 and hold.released_by == "timeout"
    hold = control.hold_answers(lambda: False, timeout_s=60)
    control.release_holds()
    assert _post(app, "/generate", {"text": "x"}).status_code == 200 and hold.released_by == "end"


def test_a_slow_engine_holds_only_its_first_answer_on_the_paths() -> None:
    log, engine = WireLog(), CountingApp()
    control = WireControl(log.clock)
    slow, other = WireRecorder(engine, 1, log, control), WireRecorder(engine, 0, log, control)
    hold = control.hold_answers(lambda: False, timeout_s=0.05, paths=frozenset({"/update_weights_from_disk"}), engine=1,
                            first_only=True)
    for app in (other, slow):
        assert _post(app, "/generate", {"text": "x"}).status_code == 200
    assert _post(other, "/update_weights_from_disk", {}).status_code == 200 and hold.held == 0  # another engine
    assert _post(slow, "/update_weights_from_disk", {}).status_code == 200 and hold.held == 1
    assert hold.released_by == "timeout" and hold.held_at is not None
    assert _post(slow, "/update_weights_from_disk", {}).status_code == 200 and hold.held == 1  # the first only


async def _until(condition) -> None:
    while not condition():
        await asyncio.sleep(0.001)


def test_the_first_held_call_per_engine_goes_on_when_ready_and_tells_the_next_that_another_went() -> None:
    """``hold_first`` holds each engine's first matching call until ``ready(engine, another_went)``; ``holding``
    says which engines wait and which went on; later calls and other paths are never held. Listeners hear of a held
    call only once it went on (the suite's long-lived request stops being renewed when the pause reaches the engine,
    not while the pause is held back from it)."""
    log, engines, asked = WireLog(), [CountingApp(), CountingApp()], []
    control = WireControl(log.clock)
    sent: list[tuple[int, str]] = []
    log.listen(lambda call, answered: None if answered else sent.append((call.engine, call.path)))
    apps = [WireRecorder(engine, i, log, control) for i, engine in enumerate(engines)]
    go = asyncio.Event()

    def ready(engine: int, another_went: bool) -> bool:
        asked.append((engine, another_went))
        return go.is_set() if engine == 0 else another_went

    control.hold_first(frozenset({"/pause_generation"}), ready, timeout_s=10)

    async def run() -> None:
        clients = [httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://engine") for app in apps]
        try:
            first = asyncio.create_task(clients[0].post("/pause_generation", json={}))
            second = asyncio.create_task(clients[1].post("/pause_generation", json={}))
            await asyncio.wait_for(_until(lambda: control.holding() == ({0, 1}, set())), 5)
            assert (await clients[0].post("/flush_cache", json={})).status_code == 200  # another path goes on
            assert engines[0].seen == ["/flush_cache"] and engines[1].seen == []
            assert sent == [(0, "/flush_cache")], f"held calls were announced before they went on: {sent}"
            go.set()
            await asyncio.wait_for(asyncio.gather(first, second), 5)
            assert sorted(sent) == [(0, "/flush_cache"), (0, "/pause_generation"), (1, "/pause_generation")]
            assert control.holding() == (set(), {0, 1})
            assert (await asyncio.wait_for(clients[0].post("/pause_generation", json={}), 5)).status_code == 200
        finally:
            for client in clients:
                await client.aclose()
    asyncio.run(run())
    assert (1, False) in asked and (1, True) in asked and (0, True) not in asked
    control.release_holds()
    assert control.holding() is None


def test_a_held_call_that_goes_on_at_the_bound_is_reported_when_the_holds_end() -> None:
    """A call whose ``ready`` never came true goes on at the bound, and :meth:`release_holds` names its engine (and
    when), so the run can record that the situation it aimed at was not built there; one that was ready is not
    named."""
    log, engines = WireLog(), [CountingApp(), CountingApp()]
    control = WireControl(log.clock)
    apps = [WireRecorder(engine, i, log, control) for i, engine in enumerate(engines)]
    control.hold_first(frozenset({"/pause_generation"}), lambda engine, _: engine == 1, timeout_s=0.05)

    async def run() -> None:
        clients = [httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://engine") for app in apps]
        try:
            await asyncio.wait_for(asyncio.gather(*(c.post("/pause_generation", json={}) for c in clients)), 5)
        finally:
            for client in clients:
                await client.aclose()
    t0 = log.clock()
    asyncio.run(run())
    expired = control.release_holds()
    assert list(expired) == [0] and t0 + 0.05 <= expired[0].at <= log.clock()
    assert 0.05 <= expired[0].held_s <= expired[0].at - t0 and expired[0].then is None
    assert control.release_holds() == {}


def test_a_held_call_whose_bound_passed_waits_for_then_at_most_its_own_bound() -> None:
    """Past the bound with ``ready`` false, ``then(engine)`` holds the call on (the least the situation needs: some
    request resident there) until it is true, or at most ``then_timeout_s`` more; both are reported as expired."""
    log, engines = WireLog(), [CountingApp(), CountingApp()]
    control = WireControl(log.clock)
    apps = [WireRecorder(engine, i, log, control) for i, engine in enumerate(engines)]
    resident = asyncio.Event()
    control.hold_first(frozenset({"/pause_generation"}), lambda engine, _: False, timeout_s=0.05,
                       then=lambda engine: engine == 1 or resident.is_set(), then_timeout_s=0.5)

    async def run() -> tuple[float, float, float, float]:
        clients = [httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://engine") for app in apps]
        try:
            t0 = log.clock()
            waiting = asyncio.create_task(clients[0].post("/pause_generation", json={}))
            await asyncio.wait_for(clients[1].post("/pause_generation", json={}), 5)
            went_1 = log.clock() - t0
            await asyncio.wait_for(_until(lambda: log.clock() - t0 > 0.2), 5)
            assert not waiting.done() and engines[0].seen == []  # past its bound, held on until then(0)
            resident_at = log.clock()
            resident.set()
            await asyncio.wait_for(waiting, 5)
            return t0, went_1, log.clock() - t0, resident_at
        finally:
            for client in clients:
                await client.aclose()
    t0, went_1, went_0, resident_at = asyncio.run(run())
    assert 0.05 <= went_1 and 0.2 < went_0  # no upper bound on the clock: a busy machine stalls the loop
    expired = control.release_holds()
    # held from its arrival (before engine 1's call went on; a few ms after t0 on a busy machine) until then(0) came
    # true, not before: the clock's reading of its arrival, not t0, is what held_s counts from
    arrived_0 = expired[0].at - expired[0].held_s
    assert sorted(expired) == [0, 1] and expired[0].then is True and expired[0].at >= resident_at
    assert expired[1].then is True  # engine 1 went on as then(1) came true, not at its then_timeout_s: no clock needed
    assert expired[0].held_s > 0.05 and t0 <= arrived_0 < t0 + went_1
    control.hold_first(frozenset({"/pause_generation"}), lambda engine, _: False, timeout_s=0.01,
                       then=lambda engine: False, then_timeout_s=0.05)
    t0 = log.clock()
    assert _post(apps[0], "/pause_generation", {}).status_code == 200
    assert 0.06 <= log.clock() - t0 < 1.0  # then never true: at most its own bound more
    assert control.release_holds()[0].then is False


def test_time_in_which_the_recorder_loop_did_not_run_does_not_use_a_hold_s_bound_up() -> None:
    """Regression (real vLLM 0.32.0 in CI, I1-I2 unknown): a starved recorder loop woke up past the hold's bound with
    the end of the engine's long-lived request read first, and the pause went on with nothing resident. Here the loop
    is frozen for three times the bound while ``then`` is false; once it runs again, ``then`` comes true a few polls
    later, and the call waits for it instead of going on at once."""
    log, engine = WireLog(), CountingApp()
    control = WireControl(log.clock)
    app = WireRecorder(engine, 0, log, control)
    polls: list[float] = []

    def then(_: int) -> bool:
        polls.append(log.clock())
        if len(polls) == 1:
            time.sleep(0.3)  # sleep-ok: freezes the loop as a starved machine does (it is the fault, not a wait)
        return len(polls) > 5
    control.hold_first(frozenset({"/pause_generation"}), lambda engine, _: False, timeout_s=0.01, then=then,
                       then_timeout_s=0.1)
    assert _post(app, "/pause_generation", {}).status_code == 200
    expired = control.release_holds()
    assert expired[0].then is True and len(polls) == 6, (
        f"went on after {len(polls)} polls with then {expired[0].then}: the frozen time used the bound up")
    assert 0.3 < expired[0].held_s < 0.3 + 0.1 + 0.05 + 1.0


def test_time_in_which_the_recorder_loop_did_not_run_does_not_use_an_answer_hold_s_bound_up() -> None:
    """Regression (real vLLM 0.32.0, S2 unknown in answers-while-paused): answers held until every engine is paused
    went on at their bound when a starved loop woke up with the drained request's end read first (no longer
    ``waiting``), a few milliseconds before the pause it drained for answered. Here the loop is frozen for three times
    the bound while ``waiting`` is true; it is false afterwards, and ``release`` comes true a few polls later."""
    log, engine = WireLog(), CountingApp()
    control = WireControl(log.clock)
    app = WireRecorder(engine, 0, log, control)
    polls: list[float] = []

    def waiting() -> bool:
        polls.append(log.clock())
        if len(polls) == 1:
            time.sleep(0.3)  # sleep-ok: freezes the loop as a starved machine does (it is the fault, not a wait)
            return True
        return False
    hold = control.hold_answers(lambda: len(polls) > 5, timeout_s=0.1, waiting=waiting)
    assert _post(app, "/generate", {"text": "x"}).status_code == 200
    assert hold.released_by == "ready", f"released by {hold.released_by} after {len(polls)} polls"
    control.release_holds()


def test_frozen_calls_keep_their_times_when_the_call_is_answered_later() -> None:
    log = WireLog()
    call = log.open(0, "POST", "/generate", {"text": "x"})
    [copy] = log.frozen()
    log.close(call, 200, {"text": "y"})
    assert copy.t_end is None and copy.status is None and call.t_end is not None and log.snapshot() == [call]


def test_the_log_records_and_the_control_refuses_and_holds() -> None:
    """One job each: the recorder's log has no way to refuse or hold, and a recorder given no control forwards
    every call as it came."""
    steering = {"refuse", "take_refusal", "clear_refusals", "hold_first", "holding", "hold_answers", "release_holds",
                "answer_held", "held"}
    assert steering <= set(dir(WireControl)) and not steering & set(dir(WireLog))
    log, engine = WireLog(), CountingApp()
    app = WireRecorder(engine, 0, log)
    assert _post(app, "/update_weights_from_disk", {}).status_code == 200
    assert engine.seen == ["/update_weights_from_disk"]


def test_a_held_call_freezes_a_fake_backends_decoding_and_the_frozen_time_is_no_decode_time() -> None:
    """While ``hold_first`` holds any call the control's ``freeze`` hook is on (once, for overlapping holds); the time
    frozen is not counted as decoding (``decode_time``): a request resident when the call arrived is as far from its
    end when it goes on."""
    from conformance.wire_control import WireControl

    now = [10.0]
    control, calls = WireControl(clock=lambda: now[0]), []
    control.freeze = calls.append
    control._held_one(+1)
    now[0] = 11.0
    control._held_one(+1)
    assert calls == [True] and control.decode_time(9.0, 11.5) == pytest.approx(1.0)
    now[0] = 12.0
    control._held_one(-1)
    control._held_one(-1)
    assert calls == [True, False] and control.decode_time(9.0, 13.0) == pytest.approx(2.0)
    unhooked = WireControl(clock=lambda: now[0])
    unhooked._held_one(+1)
    assert unhooked.decode_time(9.0, 13.0) == 4.0  # real engines: nothing is frozen


def test_a_keep_pauses_real_engines_through_their_hook_and_the_kept_time_is_no_decode_time() -> None:
    """Where the engines cannot be stalled, ``keep`` pauses them through ``keep_engines`` and resumes them once (its
    end, or its bound); the time kept is not decoding. A pause that fails leaves nothing paused and says why; a resume
    that fails says the engines may be left paused; no hook, no keep."""
    now = [10.0]
    control, calls = WireControl(clock=lambda: now[0]), []
    control.keep_engines = calls.append
    end = control.keep(60.0)
    assert end is not None and calls == [True] and control.keep_failed is None
    now[0] = 12.0
    assert control.decode_time(9.0, 12.0) == pytest.approx(1.0)
    end()
    end()
    assert calls == [True, False] and control.decode_time(9.0, 13.0) == pytest.approx(2.0)
    resumed = threading.Event()
    control.keep_engines = lambda on: (calls.append(on), None if on else resumed.set())
    assert control.keep(0.01) is not None and resumed.wait(5.0) and calls == [True, False, True, False]

    def refuses(on: bool) -> None:
        calls.append(on)
        if on:
            raise RuntimeError("POST /pause?mode=keep&clear_cache=false: engine 1: 500")
    calls.clear()
    control.keep_engines = refuses
    assert control.keep(60.0) is None and calls == [True, False]
    assert control.keep_failed == ("the engines' keep-pause failed (RuntimeError: POST /pause?mode=keep&clear_cache="
                                   "false: engine 1: 500)") and control.left_paused is None

    def resume_refused(on: bool) -> None:
        if not on:
            raise RuntimeError("POST /resume: engine 0: 500")
    control.keep_engines = resume_refused
    end = control.keep(60.0)
    assert end is not None and control.keep_failed is None and control.left_paused is None
    end()
    assert control.keep_failed is None and control.left_paused == (
        "the engines' resume after a keep-pause failed (RuntimeError: POST /resume: engine 0: 500)")
    assert WireControl().keep(1.0) is None


def test_every_caller_of_a_keeps_end_returns_only_once_the_engines_are_resumed() -> None:
    """Regression (real vLLM 0.32.0, the distributed transport paused in place): two recorder threads end the keep as
    the integration's pauses reach two engines; the second returned while the first was still resuming, so its pause
    was forwarded and the suite's resume then undid it (the engine then crashed in its weight update)."""
    resuming, resumed, calls = threading.Event(), threading.Event(), []

    def hook(on: bool) -> None:
        calls.append(on)
        if not on:
            resuming.set()
            assert resumed.wait(5.0)
    control = WireControl()
    control.keep_engines = hook
    end = control.keep(60.0)
    assert end is not None
    first = threading.Thread(target=end)
    first.start()
    assert resuming.wait(5.0)
    second_done = threading.Event()
    second = threading.Thread(target=lambda: (end(), second_done.set()))
    second.start()
    assert not second_done.wait(0.2), "the second caller returned while the resume was still under way"
    resumed.set()
    first.join(5.0)
    second.join(5.0)
    assert second_done.is_set() and calls == [True, False]
