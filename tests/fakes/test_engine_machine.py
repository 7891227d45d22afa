"""Hypothesis state machine over the WHOLE fake engine, driven at the HTTP level (in-process ASGI, manual clock).

Rules: /generate (background calls), stepping, pause (in_place / retract / abort), continue, /update_weight_version
(with and without ``abort_all_requests``), /update_weights_from_tensor (inside a begin/end session on 0.5.23),
/update_weights_from_disk from a checkpoint written to a tmp dir, /abort_request (rid prefix, abort_all), the 0.5.23
session endpoints, and requests the server must REJECT (4xx) without changing anything.

The model predicts where every request is (parked at the pause gate / waiting / running / answered), how many
tokens it has, whether it will end aborted, the tokenizer-side version label, the scheduler-side version, the
weights digest, the model path and the session flag; after every rule the engine's snapshot and ``/model_info``
must agree with it, and every answered request's body is checked against spec §6.1–§6.3.

Hypothesis stateful has no asyncio: one event loop runs in a daemon thread and every rule submits its coroutine
with ``run_coroutine_threadsafe(wait_for(coro, timeout))`` (the zarr ``SyncStoreWrapper`` pattern). Long-lived
/generate calls are tasks on that loop. No sleeps: every wait is ``engine.wait_until`` or a bounded ``asyncio.wait``.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import tempfile
import threading
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable

import httpx
import pytest
from hypothesis import Phase, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from fakes import weights as W
from fakes.engine import DEFAULT_MODEL_PATH, FLUSH_AFTER_UPDATE_ERROR, FakeEngine
from fakes.profiles import get_profile

pytestmark = pytest.mark.cpu

# No Phase.explain: its line tracer makes the pure-Python weight code of each new engine ~100x slower.
MACHINE_SETTINGS = settings(max_examples=15, stateful_step_count=25, deadline=None,
                            phases=[Phase.explicit, Phase.reuse, Phase.generate, Phase.target, Phase.shrink])
CALL_TIMEOUT_S = 5.0  # one rule's coroutine, end to end
SETTLE_TIMEOUT_S = 1.0  # engine state reaching what the model predicts (ms when right; bounds each shrink try)
CAPACITY = 64  # max_running_requests: above the number of requests one example can submit (<= 25)
MAX_UPDATE_STEPS = 12  # a writer waits for readers: max_new_tokens <= 6 (+1 abort step) steps release them all

PARKED, WAITING, RUNNING, DONE = "parked", "waiting", "running", "done"
ABORT_RUNNING = {"type": "abort", "message": "Aborted", "status_code": None, "err_type": None}  # spec §6.3
ABORT_WAITING = {"type": "abort", "message": "Abort in waiting queue"}  # spec §6.3, >= 0.5.6
PAUSED_BODY = {"message": "Generation paused successfully.", "status": "ok"}  # spec §2.1
CONTINUED_BODY = {"message": "Generation continued successfully.", "status": "ok"}


# ------------------------------------------------------------------------------------------------------------------
# one event loop in a daemon thread
# ------------------------------------------------------------------------------------------------------------------


class _LoopThread:
    """An asyncio loop running forever in a daemon thread; ``run`` submits a coroutine and waits, bounded."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="engine-machine-loop", daemon=True)
        self.thread.start()

    def run(self, coro: Awaitable[Any], timeout: float = CALL_TIMEOUT_S) -> Any:
        future = asyncio.run_coroutine_threadsafe(asyncio.wait_for(coro, timeout), self.loop)
        try:
            return future.result(timeout + 5)
        except BaseException:
            future.cancel()
            raise


@functools.lru_cache(maxsize=1)
def _loop_thread() -> _LoopThread:
    return _LoopThread()


# ------------------------------------------------------------------------------------------------------------------
# weights (pure functions of the step: computed once)
# ------------------------------------------------------------------------------------------------------------------


@functools.lru_cache(maxsize=1)
def _initial() -> dict[str, W.TensorBlob]:
    """The engine's startup weights (``WeightStore(tiny_model(0))``); TensorBlobs are immutable, so engines share them."""
    return W.tiny_model(0)


@functools.lru_cache(maxsize=None)
def _trained(step: int) -> dict[str, W.TensorBlob]:
    return W.perturbed(_initial(), step)


@functools.lru_cache(maxsize=None)
def _payload(step: int) -> str:
    return W.encode_tensor_payload(_trained(step))


@functools.lru_cache(maxsize=None)
def _digest(step: int | None) -> str:
    """Digest of the trained weights of ``step`` (None: the startup weights)."""
    return W.weights_digest(_initial() if step is None else _trained(step))


# ------------------------------------------------------------------------------------------------------------------
# the model
# ------------------------------------------------------------------------------------------------------------------


@dataclass(eq=False)
class Req:
    """One /generate call as the model sees it."""

    rid: str
    max_new: int
    task: asyncio.Task
    state: str
    tokens: int = 0
    token_versions: list[str] = field(default_factory=list)  # scheduler version stamped on each token
    retractions: int = 0
    abort_pending: bool = False
    outcome: str | None = None  # "length" | "abort_running" | "abort_waiting"
    ok_labels: frozenset[str] = frozenset()  # meta_info.weight_version the answer may carry (<= 0.5.16, spec §6.2)
    ok_sched: frozenset[str] = frozenset()  # 0.5.23: version of the empty span of a request without tokens
    checked: bool = False

    @property
    def resident(self) -> bool:
        return self.state in (WAITING, RUNNING)


def _spans(versions: list[str]) -> list[dict[str, Any]]:
    """``utils/weight_versions.py`` (0.5.23): spans over output-token indices, end exclusive (spec §6.2)."""
    spans: list[dict[str, Any]] = []
    for i, version in enumerate(versions):
        if spans and spans[-1]["version"] == version:
            spans[-1]["end"] = i + 1
        else:
            spans.append({"version": version, "start": i, "end": i + 1})
    return spans


class EngineMachine(RuleBasedStateMachine):
    """Model-based test of one FakeEngine over HTTP. Subclasses pick the profile."""

    profile_version = "0.5.23"

    def __init__(self) -> None:
        super().__init__()
        self.profile = get_profile(self.profile_version)
        self.lt = _loop_thread()
        self.engine = FakeEngine(self.profile_version, tokens_per_second=None, max_running_requests=CAPACITY,
                                 weights=W.WeightStore(_initial()), trace_tokens=True)
        self.client: httpx.AsyncClient = self.lt.run(self._open_client())
        self.tmp = tempfile.TemporaryDirectory(prefix="engine-machine-")
        self._broken = False  # a rule or invariant raised: teardown only closes
        # -- the model --
        self.reqs: dict[str, Req] = {}
        self._transit: set[str] = set()  # rids sent or released since the last settle (may still be on their way)
        self.count = 0
        self.paused = False  # tokenizer-side gate (TokenizerManager.is_pause)
        self.mode: str | None = None
        self.sched_pause: str | None = None  # scheduler _engine_paused: in_place / retract (never abort, spec §2.2)
        self.label = "default"  # tokenizer-side weight_version (/model_info)
        self.sched_version = "default"  # scheduler-side version stamped on tokens (0.5.23 records it separately)
        self.digest = _digest(None)
        self.model_path = DEFAULT_MODEL_PATH
        self.session_open = False

    async def _open_client(self) -> httpx.AsyncClient:
        transport = httpx.ASGITransport(app=self.engine.app)
        return httpx.AsyncClient(transport=transport, base_url="http://fake", timeout=CALL_TIMEOUT_S)

    # -- plumbing --------------------------------------------------------------------------------------------
    def _run(self, coro: Awaitable[Any], timeout: float = CALL_TIMEOUT_S) -> Any:
        self._broken = True
        result = self.lt.run(coro, timeout)
        self._broken = False
        return result

    def _resident(self) -> list[Req]:
        return [r for r in self.reqs.values() if r.resident]

    def _where(self, rid: str) -> str:
        """Where the engine holds ``rid``: parked at the pause gate, waiting, running, or nowhere (done)."""
        if rid in self.engine.snapshot()["parked"]:
            return PARKED
        held = self.engine.scheduler.find(rid)
        return DONE if held is None else held.state

    def _misplaced(self, reqs: list[Req]) -> dict[str, tuple[str, str]]:
        """rid -> (model state, engine place) for every request the engine holds elsewhere than predicted."""
        places = {r.rid: self._where(r.rid) for r in reqs}
        return {r.rid: (r.state, places[r.rid]) for r in reqs if places[r.rid] != r.state}

    async def _first(self, cond: Callable[[], bool], tasks: list[asyncio.Task]) -> bool:
        """Wait until the engine reaches ``cond`` or one of ``tasks`` is done, at most SETTLE_TIMEOUT_S; return
        whether ``cond`` was reached. The inner ``wait_until`` has no timeout of its own (the deadline is this
        ``asyncio.wait``): cancelling a ``wait_until(timeout=...)`` can be swallowed by Python 3.11's
        ``asyncio.wait_for`` when the engine wakes it at the same moment, and it then runs to its own deadline."""
        waiter = asyncio.ensure_future(self.engine.wait_until(cond, timeout=None))
        try:
            done, _ = await asyncio.wait({waiter, *tasks}, timeout=SETTLE_TIMEOUT_S,
                                         return_when=asyncio.FIRST_COMPLETED)
        finally:
            waiter.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await waiter
        return waiter in done

    async def _race(self, task: asyncio.Task, cond: Callable[[], bool]) -> bool:
        """Wait (bounded) until ``task`` is done (True) or the engine reaches ``cond`` (False)."""
        if task.done():
            return True
        reached = await self._first(cond, [task])
        if task.done():
            return True
        if reached:
            return False
        raise TimeoutError(f"the call did not end and the engine did not move; state={self.engine.snapshot()}")

    async def _settle(self) -> None:
        """Check the engine against the model, then every newly answered request.

        Only requests in transit (just sent, or released by continue) need waiting for: they reach the gate or
        the scheduler within a few loop turns. Everything else is already where it will stay (scheduler
        transitions are synchronous), so a misplaced request fails at once instead of after a timeout."""
        undone = [r for r in self.reqs.values() if r.state != DONE]
        transit = [r for r in undone if r.rid in self._transit]
        self._transit.clear()
        arrived = not transit or await self._first(lambda: not self._misplaced(transit), [r.task for r in undone])
        surprises = [r for r in undone if r.task.done()]
        if surprises:
            r = surprises[0]
            raise AssertionError(f"{r.rid} was answered while the model has it {r.state}: {_describe(r.task)}")
        assert arrived, f"requests never reached the engine: {self._misplaced(transit)}; {self.engine.snapshot()}"
        misplaced = self._misplaced(list(self.reqs.values()))
        assert not misplaced, f"rid -> (model, engine): {misplaced}"
        finals = [r for r in self.reqs.values() if r.state == DONE and not r.checked]
        if finals:  # the engine let them go: their answers are a few loop turns away
            await asyncio.wait_for(asyncio.gather(*(r.task for r in finals)), SETTLE_TIMEOUT_S)
        for r in finals:
            self._check_final(r)
            r.checked = True

    def _check_final(self, r: Req) -> None:
        """Exactly one final answer: HTTP 200, one object, finish_reason as the model predicts (spec §6.1–6.3)."""
        resp: httpx.Response = r.task.result()
        assert resp.status_code == 200, (r.rid, resp.status_code, resp.text)
        body = resp.json()
        assert isinstance(body, dict), (r.rid, body)
        meta = body["meta_info"]
        reason = meta["finish_reason"]
        assert meta["id"] == r.rid
        assert reason["type"] in ("length", "stop", "abort"), (r.rid, reason)
        if r.outcome == "length":
            assert reason == {"type": "length", "length": r.max_new}, (r.rid, reason)
            assert r.tokens == r.max_new
        elif r.outcome == "abort_running":
            assert reason == ABORT_RUNNING, (r.rid, "expected an abort of a running request", reason)
        else:
            assert reason == ABORT_WAITING, (r.rid, "expected an abort in the waiting queue", reason)
            assert "prompt_tokens" not in meta, (r.rid, meta)  # spec §6.3: no prompt_tokens on this path
        assert meta["completion_tokens"] == r.tokens, (r.rid, meta["completion_tokens"], r.tokens)
        assert len(body["output_ids"]) == r.tokens, (r.rid, body["output_ids"], r.tokens)
        if r.outcome != "abort_waiting":
            assert meta[self.profile.retraction_key] == r.retractions, (r.rid, meta)
        if self.profile.weight_versions_spans:  # 0.5.23: spans, weight_version = last span's version
            spans = meta["weight_versions"]
            if r.token_versions:
                assert spans == _spans(r.token_versions), (r.rid, spans, r.token_versions)
            else:
                assert len(spans) == 1 and spans[0]["start"] == spans[0]["end"] == 0, (r.rid, spans)
                assert spans[0]["version"] in r.ok_sched, (r.rid, spans, r.ok_sched)
            assert meta["weight_version"] == spans[-1]["version"], (r.rid, meta)
        else:  # the tokenizer's label when the answer was built
            assert meta["weight_version"] in r.ok_labels, (r.rid, meta["weight_version"], r.ok_labels)

    # -- model transitions ---------------------------------------------------------------------------------------
    def _finish(self, r: Req, outcome: str, labels: frozenset[str] | None = None,
                sched: frozenset[str] | None = None) -> None:
        r.state, r.outcome = DONE, outcome
        r.ok_labels = labels if labels is not None else frozenset({self.label})
        r.ok_sched = sched if sched is not None else frozenset({self.sched_version})

    def _abort(self, hit: Callable[[Req], bool], labels: frozenset[str] | None = None,
               sched: frozenset[str] | None = None) -> None:
        """Scheduler AbortReq: running -> finish with abort on their next decode step; waiting -> answered now."""
        for r in self._resident():
            if not hit(r):
                continue
            if r.state == RUNNING:
                r.abort_pending = True
            else:
                self._finish(r, "abort_waiting", labels, sched)

    def _model_step(self) -> int:
        """One decode iteration: admit every waiting request, every running one emits a token."""
        if self.sched_pause is not None:
            return 0
        for r in self._resident():
            if r.state == WAITING:
                r.state = RUNNING
        assert len(self._resident()) <= CAPACITY
        produced = 0
        for r in self._resident():
            r.tokens += 1
            r.token_versions.append(self.sched_version)
            produced += 1
            if r.abort_pending:
                self._finish(r, "abort_running")
            elif r.tokens >= r.max_new:
                self._finish(r, "length")
        return produced

    async def _engine_step(self) -> int:
        produced = await self.engine.step(1)
        expected = self._model_step()
        assert produced == expected, (produced, expected)
        return produced

    # -- rules: requests -------------------------------------------------------------------------------------
    @initialize(max_new_tokens=st.lists(st.integers(1, 6), max_size=3), steps=st.integers(0, 2),
                pause=st.none() | st.sampled_from(["in_place", "retract"]))
    def in_flight(self, max_new_tokens: list[int], steps: int, pause: str | None) -> None:
        """The starting point: 0-3 requests in flight (waiting, or running after a step or two), maybe already
        paused, as a trainer finds its rollout engine. With 15 examples of 25 steps, the other rules then meet
        resident requests (and a frozen batch) often enough to matter."""

        async def go() -> None:
            for m in max_new_tokens:
                self._spawn_generate(m, explicit_stream_false=False, parent=None)
            await self._settle()
            for _ in range(steps):
                await self._engine_step()
            await self._settle()

        self._run(go())
        if pause is not None:
            self.pause(pause)

    @rule(max_new_tokens=st.integers(1, 6), explicit_stream_false=st.booleans(), data=st.data())
    def generate(self, max_new_tokens: int, explicit_stream_false: bool, data: st.DataObject) -> None:
        parent = data.draw(st.none() | st.sampled_from(sorted(self.reqs)), label="parent") if self.reqs else None

        async def go() -> None:
            self._spawn_generate(max_new_tokens, explicit_stream_false, parent)
            await self._settle()

        self._run(go())

    def _spawn_generate(self, max_new_tokens: int, explicit_stream_false: bool, parent: str | None) -> None:
        """Start one POST /generate on the loop (rid ``r<n>`` or ``<parent>.<n>``: prefix-related rids)."""
        rid = f"r{self.count}" if parent is None else f"{parent}.{self.count}"
        body: dict[str, Any] = {"text": f"prompt {self.count}", "rid": rid,
                                "sampling_params": {"max_new_tokens": max_new_tokens}}
        if explicit_stream_false:
            body["stream"] = False
        self.count += 1
        task = asyncio.ensure_future(self.client.post("/generate", json=body))
        self.reqs[rid] = Req(rid, max_new_tokens, task, PARKED if self.paused else WAITING)
        self._transit.add(rid)

    @rule(n=st.integers(1, 4))
    def step(self, n: int) -> None:
        async def go() -> None:
            tokens_before = len(self.engine.events.of_kind("request.token"))
            finished_before = len(self.engine.events.of_kind("request.finish"))
            produced = 0
            for _ in range(n):
                produced += await self._engine_step()
            if self.paused:  # invariant: no token is produced while paused (any mode, spec §2.3/§2.4)
                assert produced == 0, f"{produced} tokens produced while paused ({self.mode})"
                assert len(self.engine.events.of_kind("request.token")) == tokens_before
                assert len(self.engine.events.of_kind("request.finish")) == finished_before
            await self._settle()

        self._run(go())

    # -- rules: pause / continue -------------------------------------------------------------------------------
    @rule(mode=st.sampled_from(["in_place", "retract"]))
    def pause(self, mode: str) -> None:
        async def go() -> None:
            resp = await self.client.post("/pause_generation", json={"mode": mode})
            assert resp.status_code == 200 and resp.json() == PAUSED_BODY, resp.text
            self.paused, self.mode, self.sched_pause = True, mode, mode
            if mode == "retract":
                for r in self._resident():
                    if r.state == RUNNING:
                        r.state, r.retractions = WAITING, r.retractions + 1
            await self._settle()

        self._run(go())

    # pause(abort) loops abort until no /generate holds the reader lock (spec §2.2); a running request finishes
    # its abort only on a decode step, which never comes while the scheduler is frozen by pause(in_place).
    @precondition(lambda self: self.sched_pause is None or not any(r.state == RUNNING for r in self._resident()))
    @rule(explicit_mode=st.booleans())
    def pause_abort(self, explicit_mode: bool) -> None:
        async def go() -> None:
            body = {"mode": "abort"} if explicit_mode else {}  # {} -> the default mode, abort
            task = asyncio.ensure_future(self.client.post("/pause_generation", json=body))
            engine = self.engine

            def aborting() -> bool:  # the call has aborted everything and waits for the running ones to end
                running = engine.scheduler.running
                return engine.pause_mode == "abort" and bool(running) and all(r.abort_pending for r in running)

            self.paused, self.mode = True, "abort"
            self._abort(lambda r: True)
            steps = 0
            while not await self._race(task, aborting):
                steps += 1
                assert steps <= 2, "pause(abort) still waiting after its running requests were stepped"
                await self._engine_step()
            resp = task.result()
            assert resp.status_code == 200 and resp.json() == PAUSED_BODY, resp.text
            assert not self._resident(), "pause(abort) returned with requests still in the scheduler"
            await self._settle()

        self._run(go())

    @rule(torch_empty_cache=st.sampled_from([None, False, True]))
    def continue_generation(self, torch_empty_cache: bool | None) -> None:
        body = {} if torch_empty_cache is None or not self.profile.continue_torch_empty_cache else {
            "torch_empty_cache": torch_empty_cache}

        async def go() -> None:
            resp = await self.client.post("/continue_generation", json=body)
            assert resp.status_code == 200 and resp.json() == CONTINUED_BODY, resp.text
            self.paused, self.mode, self.sched_pause = False, None, None
            self._release_parked()
            await self._settle()

        self._run(go())

    def _release_parked(self) -> None:
        """continue reopens the gate: parked requests go on to the scheduler's waiting queue (spec §2.2)."""
        for r in self.reqs.values():
            if r.state == PARKED:
                r.state = WAITING
                self._transit.add(r.rid)

    # -- rules: versions and weights ---------------------------------------------------------------------------
    @rule(version=st.sampled_from(["v1", "v2", "v3"]), abort_all_requests=st.sampled_from([None, True, False]))
    def update_weight_version(self, version: str, abort_all_requests: bool | None) -> None:
        body: dict[str, Any] = {"new_version": version}
        if abort_all_requests is not None:
            body["abort_all_requests"] = abort_all_requests

        async def go() -> None:
            resp = await self.client.post("/update_weight_version", json=body)
            assert resp.status_code == 200, resp.text
            assert resp.json() == {"success": True, "message": f"Weight version updated to {version}",
                                   "new_version": version}
            if abort_all_requests is not False:  # default True (spec §1.1): aborts everything in the scheduler
                new = frozenset({version})  # the aborted answers carry the NEW version (spec §6.3)
                self._abort(lambda r: True, labels=new, sched=new)
            self.label = self.sched_version = version
            await self._settle()

        self._run(go())

    @precondition(lambda self: not self.profile.weight_update_sessions or self.session_open)
    @rule(step=st.integers(0, 3), version=st.sampled_from([None, "w1", "w2"]),
          flush_cache=st.sampled_from([None, True, False]), abort_all_requests=st.sampled_from([None, False, True]))
    def update_weights_from_tensor(self, step: int, version: str | None, flush_cache: bool | None,
                                   abort_all_requests: bool | None) -> None:
        body: dict[str, Any] = {"serialized_named_tensors": [_payload(step)]}
        self._weight_update("/update_weights_from_tensor", body, step, version, flush_cache, abort_all_requests)

    # FAKE BUG found by this machine (shrunk replay: test_shrunk_0523_failed_disk_update_keeps_model_path; fixed in
    # fakes/ by commit 18f8099): on 0.5.23 a disk update whose post-update flush fails (requests resident after
    # pause(in_place)) answers 400 success:false, yet the fake had already moved /model_info's model_path (and
    # served_model_name) to the new checkpoint. Spec §3.3 items 3 and 5, §10.6: only a SUCCESSFUL disk update
    # sets model_path; on this failure the tokenizer side is not updated.
    @rule(step=st.integers(0, 3), version=st.sampled_from([None, "w1", "w2"]),
          flush_cache=st.sampled_from([None, True, False]), abort_all_requests=st.sampled_from([None, False, True]))
    def update_weights_from_disk(self, step: int, version: str | None, flush_cache: bool | None,
                                 abort_all_requests: bool | None) -> None:
        path = os.path.join(self.tmp.name, f"ckpt-{step}")
        if not os.path.isdir(path):
            W.save_checkpoint(path, _trained(step))
        self._weight_update("/update_weights_from_disk", {"model_path": path}, step, version, flush_cache,
                            abort_all_requests)

    def _weight_update(self, endpoint: str, body: dict[str, Any], step: int, version: str | None,
                       flush_cache: bool | None, abort_all_requests: bool | None) -> None:
        """spec §3.3: abort (optional) -> writer lock unless paused -> load -> post-update flush -> version."""
        disk = endpoint == "/update_weights_from_disk"
        # >= 0.5.6 an update while paused skips the model-update lock; otherwise the writer waits for every
        # /generate (reader) to end, so nothing is resident when the post-update flush runs.
        locked = not (self.paused and self.profile.paused_updates_skip_lock)
        fail = False if locked else self._flush_would_fail(abort=bool(abort_all_requests))
        if fail and flush_cache is not False and self.profile.post_update_flush_failure == "crash":
            flush_cache = False  # <= 0.5.16 the failed flush kills the server (spec §3.3.3): a crash is another test
        if flush_cache is not None:
            body["flush_cache"] = flush_cache
        if abort_all_requests is not None:
            body["abort_all_requests"] = abort_all_requests
        if version is not None:
            body["weight_version"] = version
        flush_fails = fail and flush_cache is not False

        async def go() -> None:
            label_before, sched_before = self.label, self.sched_version
            either = frozenset({label_before, version or label_before})
            either_sched = frozenset({sched_before, version or sched_before})
            if abort_all_requests:  # answers of waiting aborts may be built before or after the version changes
                self._abort(lambda r: True, labels=either, sched=either_sched)
            resp = await self._under_writer_lock(endpoint, body, locked)
            extra = {"num_paused_requests": 0} if disk else {}
            self.digest = _digest(step)  # weights change even when the flush fails (spec §3.3.3)
            if flush_fails:  # 0.5.23: 400, scheduler version recorded; tokenizer label and model_path NOT (§3.3.3)
                assert resp.status_code == 400, resp.text
                assert resp.json() == {"success": False, "message": FLUSH_AFTER_UPDATE_ERROR, **extra}
                if version is not None:
                    self.sched_version = version
            else:
                message = "Succeeded to update model weights." if disk else "Success"
                if version is not None:
                    message += f" Weight version updated to {version}."
                assert resp.status_code == 200, resp.text
                assert resp.json() == {"success": True, "message": message, **extra}
                if version is not None:
                    self.label = self.sched_version = version
                if disk:
                    self.model_path = body["model_path"]  # spec §3.3.5: disk success sets model_path
            await self._settle()

        self._run(go())

    def _flush_would_fail(self, abort: bool) -> bool:
        """The post-update flush's idle predicate (spec §7.1, §3.3.3) on what stays resident once the optional
        abort_all ran (it answers waiting requests at once; running ones only end on a decode step)."""
        resident = self._resident()
        if abort:
            resident = [r for r in resident if r.state == RUNNING]
        if any(r.state == RUNNING for r in resident):
            return True
        ignore_waiting = self.profile.flush_ignores_waiting_while_paused and self.sched_pause is not None
        return bool(resident) and not ignore_waiting

    async def _under_writer_lock(self, endpoint: str, body: dict[str, Any], locked: bool) -> Any:
        """POST a call that takes the writer side of the model-update lock (``locked``; skipped while paused):
        the engine is stepped while it waits for the ``/generate`` calls holding the reader side."""
        task = asyncio.ensure_future(self.client.post(endpoint, json=body))
        lock = self.engine.update_lock
        steps = 0
        while not await self._race(task, lambda: lock.writers_waiting > 0 and lock.readers > 0):
            assert locked, f"{endpoint} waited for the model-update lock while paused (spec §3.3.2)"
            steps += 1
            assert steps <= MAX_UPDATE_STEPS, f"{endpoint} still waits for readers after {steps} steps"
            await self._engine_step()
        return task.result()

    def _session_call(self, endpoint: str) -> Any:
        """A session call: under the writer lock unless paused (0.5.23 ``_weight_update_session_call``)."""
        return self._under_writer_lock(endpoint, {}, not (self.paused and self.profile.paused_updates_skip_lock))

    @precondition(lambda self: self.profile.weight_update_sessions and not self.session_open)
    @rule()
    def begin_weight_update(self) -> None:
        async def go() -> None:
            resp = await self._session_call("/begin_weight_update")
            assert resp.status_code == 200 and resp.json() == {"success": True, "message": "Success"}, resp.text
            self.session_open = True
            await self._settle()

        self._run(go())

    @precondition(lambda self: self.profile.weight_update_sessions and self.session_open)
    @rule()
    def end_weight_update(self) -> None:
        async def go() -> None:
            resp = await self._session_call("/end_weight_update")
            assert resp.status_code == 200 and resp.json() == {"success": True, "message": "Success"}, resp.text
            self.session_open = False
            await self._settle()

        self._run(go())

    # -- rules: aborts -------------------------------------------------------------------------------------------
    @precondition(lambda self: bool(self.reqs))
    @rule(data=st.data())
    def abort_request(self, data: st.DataObject) -> None:
        rid = data.draw(st.sampled_from(sorted(set(self.reqs) | {"r", "zz"})), label="rid")

        async def go() -> None:
            resp = await self.client.post("/abort_request", json={"rid": rid})
            assert resp.status_code == 200 and resp.content == b"", resp.text  # spec §7.3: empty body
            # the tokenizer ignores a rid it does not hold; the scheduler then matches by PREFIX (spec §7.3)
            if any(r.rid == rid for r in self._resident()):
                self._abort(lambda r: r.rid.startswith(rid))
            await self._settle()

        self._run(go())

    @rule(with_empty_rid=st.booleans())
    def abort_all(self, with_empty_rid: bool) -> None:
        body: dict[str, Any] = {"abort_all": True, **({"rid": ""} if with_empty_rid else {})}

        async def go() -> None:
            resp = await self.client.post("/abort_request", json=body)
            assert resp.status_code == 200 and resp.content == b"", resp.text
            self._abort(lambda r: True)  # never the requests parked at the pause gate (spec §2.4)
            await self._settle()

        self._run(go())

    # -- rules: rejected requests --------------------------------------------------------------------------------
    def _rejections(self) -> list[str]:
        kinds = ["version_malformed_json", "version_missing_field", "version_bad_type", "pause_unknown_mode",
                 "pause_no_body", "continue_no_body", "generate_malformed_json", "generate_no_prompt",
                 "generate_negative_max_new_tokens", "abort_bad_rid_type"]
        lock_free = self.paused or not self._resident()  # else the update would wait for the writer lock
        if lock_free:
            kinds.append("disk_missing_path")
        if self.profile.weight_update_sessions:  # spec §3.2, §3.3.6
            if lock_free:  # a session call's refusal comes from the scheduler, after the writer lock too
                kinds.append("end_without_session" if not self.session_open else "begin_while_open")
                if not self.session_open:
                    kinds.append("tensor_outside_session")
        else:
            kinds.append("session_route_missing")
        return kinds

    @rule(data=st.data())
    def rejected(self, data: st.DataObject) -> None:
        kind = data.draw(st.sampled_from(self._rejections()), label="kind")
        status, call = {
            "version_malformed_json": (400, ("/update_weight_version", {"content": b'{"new_version": '})),
            "version_missing_field": (400, ("/update_weight_version", {"json": {}})),
            "version_bad_type": (400, ("/update_weight_version", {"json": {"new_version": 7}})),
            "pause_unknown_mode": (400, ("/pause_generation", {"json": {"mode": "freeze"}})),
            "pause_no_body": (400, ("/pause_generation", {})),
            "continue_no_body": (400, ("/continue_generation", {})),
            "generate_malformed_json": (400, ("/generate", {"content": b"{not json"})),
            "generate_no_prompt": (400, ("/generate", {"json": {"sampling_params": {"max_new_tokens": 2}}})),
            "generate_negative_max_new_tokens": (
                400, ("/generate", {"json": {"text": "x", "rid": "bad", "sampling_params": {"max_new_tokens": -1}}})),
            "abort_bad_rid_type": (400, ("/abort_request", {"json": {"rid": 5, "abort_all": True}})),
            "disk_missing_path": (
                400, ("/update_weights_from_disk", {"json": {"model_path": os.path.join(self.tmp.name, "missing"),
                                                             "weight_version": "never"}})),
            "tensor_outside_session": (
                400, ("/update_weights_from_tensor", {"json": {"serialized_named_tensors": [_payload(0)],
                                                               "weight_version": "never"}})),
            "begin_while_open": (400, ("/begin_weight_update", {"json": {}})),
            "end_without_session": (400, ("/end_weight_update", {"json": {}})),
            "session_route_missing": (404, ("/begin_weight_update", {"json": {}})),  # 0.5.10 has no sessions
        }[kind]
        path, kwargs = call

        async def go() -> None:
            before = self.engine.snapshot()
            events_before = len(self.engine.events.of_kind("request.submit", "request.finish", "version.change",
                                                           "weights.load"))
            resp = await self.client.post(path, **kwargs)
            assert resp.status_code == status, (kind, resp.status_code, resp.text)
            if kind in ("disk_missing_path", "tensor_outside_session", "begin_while_open", "end_without_session"):
                assert resp.json()["success"] is False, resp.text
            # a rejected request changes nothing (snapshot includes weights digest, version, queues, pause)
            assert self.engine.snapshot() == before, kind
            assert self.engine.weights.digest() == self.digest and self.engine.weight_version == self.label
            assert len(self.engine.events.of_kind("request.submit", "request.finish", "version.change",
                                                  "weights.load")) == events_before, kind
            await self._settle()

        self._run(go())

    # -- invariants ----------------------------------------------------------------------------------------------
    @invariant()
    def engine_matches_model(self) -> None:
        async def go() -> None:
            snap = self.engine.snapshot()
            resident = self._resident()
            assert not snap["crashed"], snap["crash_reason"]
            assert set(snap["running"]) == {r.rid for r in resident if r.state == RUNNING}, snap
            assert set(snap["waiting"]) == {r.rid for r in resident if r.state == WAITING}, snap
            assert sorted(snap["parked"]) == sorted(r.rid for r in self.reqs.values() if r.state == PARKED), snap
            assert (snap["paused"], snap["mode"]) == (self.paused, self.mode), snap
            assert snap["scheduler_pause_mode"] == self.sched_pause, snap
            assert snap["version"] == self.label and snap["scheduler_version"] == self.sched_version, snap
            assert snap["digest"] == self.digest, "weights changed other than by a successful update"
            assert snap["model_path"] == self.model_path, (snap["model_path"], self.model_path)
            assert snap["session_open"] == self.session_open
            assert snap["readers"] == len(resident) and not snap["writer"], snap  # one reader per /generate
            for r in resident:
                held = self.engine.scheduler.find(r.rid)
                assert held is not None and len(held.output_ids) == r.tokens, (r.rid, "tokens", r.tokens)
                assert held.retractions == r.retractions, (r.rid, "retractions", held.retractions, r.retractions)
                assert held.abort_pending == r.abort_pending, (r.rid, "abort pending", held.abort_pending)
            # the label changes only through /update_weight_version or a successful update with weight_version
            info = await self.client.get("/model_info")
            assert info.status_code == 200, info.text
            assert info.json()["weight_version"] == self.label, (info.json(), self.label)
            assert info.json()["model_path"] == self.model_path, (info.json()["model_path"], self.model_path)

        self._run(go())

    # -- teardown ------------------------------------------------------------------------------------------------
    def teardown(self) -> None:
        try:
            if not self._broken:
                self._run(self._drain(), timeout=3 * CALL_TIMEOUT_S)
        finally:
            with contextlib.suppress(Exception):
                self.lt.run(self._close())
            self.tmp.cleanup()

    async def _drain(self) -> None:
        """continue + step until every request is answered (bounded); each got exactly one final answer."""
        resp = await self.client.post("/continue_generation", json={})
        assert resp.status_code == 200, resp.text
        self.paused, self.mode, self.sched_pause = False, None, None
        self._release_parked()
        await self._settle()
        for _ in range(2 * 7):
            if not self._resident():
                break
            await self._engine_step()
            await self._settle()
        assert not self._resident(), {r.rid: r.state for r in self._resident()}
        assert all(r.checked for r in self.reqs.values())
        finishes: dict[str, int] = {}
        for event in self.engine.events.of_kind("request.finish"):
            finishes[event.fields["rid"]] = finishes.get(event.fields["rid"], 0) + 1
        assert finishes == {rid: 1 for rid in self.reqs}, finishes

    async def _close(self) -> None:
        for r in self.reqs.values():
            if not r.task.done():
                r.task.cancel()
        await asyncio.wait_for(self.engine.aclose(), CALL_TIMEOUT_S)
        await self.client.aclose()
        pending = [r.task for r in self.reqs.values()]
        if pending:
            await asyncio.wait(pending, timeout=CALL_TIMEOUT_S)


def _describe(task: asyncio.Task) -> str:
    if task.cancelled():
        return "cancelled"
    if task.exception() is not None:
        return f"raised {task.exception()!r}"
    resp = task.result()
    return f"HTTP {resp.status_code} {resp.text[:300]}"


class EngineMachine0510(EngineMachine):
    profile_version = "0.5.10"


class EngineMachine0523(EngineMachine):
    profile_version = "0.5.23"


TestEngineMachine0510 = EngineMachine0510.TestCase
TestEngineMachine0523 = EngineMachine0523.TestCase
for _case in (TestEngineMachine0510, TestEngineMachine0523):
    _case.settings = MACHINE_SETTINGS
del _case


def test_shrunk_0523_failed_disk_update_keeps_model_path() -> None:
    """The machine's shrunk counterexample for the FAKE BUG noted on ``update_weights_from_disk``, replayed
    deterministically as a regression test (the machine alone finds it in about a third of 15-example runs)."""
    state = EngineMachine0523()
    try:
        state.in_flight(max_new_tokens=[2], steps=1, pause="in_place")
        state.engine_matches_model()
        state.update_weights_from_disk(abort_all_requests=None, flush_cache=None, step=0, version=None)
        state.engine_matches_model()
    finally:
        state.teardown()
