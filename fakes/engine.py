"""FakeEngine: the async shell over the pure scheduler (SGLang's TokenizerManager + scheduler process).

It owns what SGLang's tokenizer side owns (spec §2.2, §3.3, §4): the pause gate that parks new requests,
the writer-preferring model-update lock every /generate holds as a reader, the tokenizer-side
``weight_version`` label, LoRA refcounts, weight-update groups and sessions; and it drives the
``Scheduler`` either by hand (``await engine.step(n)``, manual clock) or with a real-time ticker
(``tokens_per_second``). Every public coroutine returns an ``asgi.Reply`` carrying SGLang's status and body;
``app.py`` does the wire parsing and validation. The engine binds to the event loop that first serves it.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import logging
import random
import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, AsyncIterator, Awaitable, Callable, Iterator, Mapping, Sequence

from . import weights as W
from .asgi import JSON_NULL, Reply
from .clock import Clock, ManualClock, RealClock
from .events import EventLog
from .faults import Fault, FaultPlan
from .profiles import DEFAULT_PROFILE, Profile, get_profile
from .scheduler import Request, Scheduler, StepResult, encode_text
from .served_model import BUILTIN_MODEL_PATH, ServedModel, builtin_model

logger = logging.getLogger(__name__)

PAUSED_BODY = {"message": "Generation paused successfully.", "status": "ok"}
CONTINUED_BODY = {"message": "Generation continued successfully.", "status": "ok"}
FLUSH_OK_TEXT = (
    "Cache flushed.\nPlease check backend logs for more details. "
    "(When there are running or waiting requests, the operation will not be performed.)\n"
)
LORA_NOT_ENABLED = "LoRA is not enabled. Please set `--enable-lora` to enable LoRA."
FLUSH_AFTER_UPDATE_ASSERT = "AssertionError: Cache flush failed after updating weights"
FLUSH_AFTER_UPDATE_ERROR = (  # 0.5.23, spec §3.3.3
    "Weights were updated, but the cache was not flushed because requests are still running or queued. "
    "Retract or finish them, then call /flush_cache."
)
WEIGHT_VERSION_DEPRECATED = {  # 0.5.10–0.5.16, spec §5
    "object": "error",
    "message": "Endpoint '/get_weight_version' or '/weight_version' is deprecated. Please use '/model_info' instead.",
    "type": "404",
    "param": None,
    "code": 404,
}
DEFAULT_MODEL_PATH = BUILTIN_MODEL_PATH
HEALTH_RID_PREFIX = "HEALTH_CHECK_"
# uuid.UUID(int=..., version=4): variant RFC 4122 (bits 62-63 = 10), version 4 (bits 76-79 = 0100)
_UUID4_CLEAR = ~((0xC000 << 48) | (0xF000 << 64)) & ((1 << 128) - 1)
_UUID4_SET = (0x8000 << 48) | (4 << 76)
_MAX_CATCH_UP_STEPS = 1000

# Set by the app for the duration of one HTTP call when a ``flush_fail`` fault fired for it.
_flush_fault: contextvars.ContextVar[bool] = contextvars.ContextVar("fake_sglang_flush_fault", default=False)


@contextlib.contextmanager
def flush_fault_scope(active: bool) -> Iterator[None]:
    """Make every cache flush inside this block fail (a ``flush_fail`` fault on the current call)."""
    token = _flush_fault.set(active)
    try:
        yield
    finally:
        _flush_fault.reset(token)


class EngineCrashed(RuntimeError):
    """The fake's SGLang process died (scheduler assert, injected crash)."""


class EngineClosed(RuntimeError):
    """The engine was shut down."""


def error_reply(status: int, message: str) -> Reply:
    """``_create_error_response``: ``{"error": {"message": ...}}`` (spec §6.5)."""
    return Reply(status, {"error": {"message": message}})


def _success_reply(ok: bool, body: dict[str, Any]) -> Reply:
    return Reply(200 if ok else 400, body)


# ------------------------------------------------------------------------------------------------
# small pieces
# ------------------------------------------------------------------------------------------------


class _UpdateLock:
    """SGLang's ``model_update_lock`` (``utils/aio_rwlock.py``): writer-preferring, so readers wait while
    a writer waits or holds it (spec §3.3.2)."""

    def __init__(
        self,
        wait: Callable[[Callable[[], bool]], Awaitable[None]],
        notify: Callable[[], None],
        check: Callable[[], None] = lambda: None,
    ) -> None:
        self._wait, self._notify, self._check = wait, notify, check
        self.readers = 0
        self.readers_waiting = 0
        self.writer = False
        self.writers_waiting = 0

    @property
    def locked(self) -> bool:
        return self.readers > 0 or self.writer

    async def acquire_read(self) -> None:
        if not self.writer and self.writers_waiting == 0:  # uncontended: no wait (what the slow path ends in)
            self._check()
            self.readers += 1
            self._notify()
            return
        self.readers_waiting += 1
        self._notify()
        try:
            await self._wait(lambda: not self.writer and self.writers_waiting == 0)
        finally:
            self.readers_waiting -= 1
        self.readers += 1
        self._notify()

    def release_read(self) -> None:
        self.readers -= 1
        self._notify()

    @contextlib.asynccontextmanager
    async def write(self) -> AsyncIterator[None]:
        self.writers_waiting += 1
        self._notify()
        try:
            await self._wait(lambda: not self.writer and self.readers == 0)
        finally:
            self.writers_waiting -= 1
            self._notify()
        self.writer = True
        self._notify()
        try:
            yield
        finally:
            self.writer = False
            self._notify()


@dataclass(eq=False)
class _Adapter:
    name: str
    path: str
    pinned: bool
    users: int = 0


class _Call:
    """One HTTP /generate call: the queue its requests' outputs go to (single consumer, unbounded; an
    ``asyncio.Queue`` without the ~3 KB and the locks it costs per call)."""

    __slots__ = ("_items", "_head", "_waiter")

    def __init__(self) -> None:
        self._items: list[Any] = []
        self._head = 0
        self._waiter: asyncio.Future | None = None

    def put_nowait(self, item: Any) -> None:
        self._items.append(item)
        waiter = self._waiter
        if waiter is not None:
            self._waiter = None
            if not waiter.done():
                waiter.set_result(None)

    async def get(self) -> Any:
        while self._head >= len(self._items):
            waiter = self._waiter = asyncio.get_running_loop().create_future()
            try:
                await waiter
            finally:
                if self._waiter is waiter:
                    self._waiter = None
        item = self._items[self._head]
        self._items[self._head] = None
        self._head += 1
        if self._head == len(self._items):
            self._items.clear()
            self._head = 0
        return item


@dataclass(eq=False, slots=True)
class _Sink:
    call: _Call
    index: int
    sent: int = 0  # output ids already streamed (delta streaming)
    adapter: _Adapter | None = None


@dataclass(frozen=True, slots=True)
class _Spec:
    """One normalized generate item (after batch / n>1 expansion)."""

    rid: str
    input_ids: list[int]
    sampling: Mapping[str, Any]
    lora: str | None
    return_logprob: bool
    return_text_in_logprobs: bool
    stream: bool


# ------------------------------------------------------------------------------------------------
# the engine
# ------------------------------------------------------------------------------------------------


class FakeEngine:
    """A faithful fake of one SGLang server's weight-sync surface (see ``fakes/README.md``)."""

    def __init__(
        self,
        profile: str | Profile = DEFAULT_PROFILE,
        tokens_per_second: float | None = None,
        max_running_requests: int = 64,
        enable_lora: bool = False,
        max_loras: int = 8,
        seed: int = 0,
        weights: W.WeightStore | Mapping[str, Any] | None = None,
        model_path: str | None = None,
        faults: FaultPlan | None = None,
        engine_id: str = "e0",
        health_check_timeout_s: float = 20.0,
        *,
        clock: Clock | None = None,
        weight_version: str = "default",
        group_timeout_s: float = 60.0,
        trace_tokens: bool = False,
        model: ServedModel | None = None,
        tokenizer_path: str | None = None,
        served_model_name: str | None = None,
        skip_tokenizer_init: bool = False,
        max_lora_rank: int | None = None,
        lora_target_modules: Sequence[str] | None = None,
        load_format: str = "auto",
        server_args: Mapping[str, Any] | None = None,
        starting: bool = False,
        strict_weights: bool = False,
        enable_memory_saver: bool = False,
        enable_weights_cpu_backup: bool = False,
        context_length: int | None = None,
    ) -> None:
        if tokens_per_second is not None and tokens_per_second <= 0:
            raise ValueError(f"tokens_per_second must be > 0 or None (manual clock), got {tokens_per_second}")
        self.profile = get_profile(profile)
        self.tokens_per_second = tokens_per_second
        if clock is None:
            clock = ManualClock() if tokens_per_second is None else RealClock()
        self.clock: Clock = clock
        self.enable_lora = enable_lora
        self.max_loras = max_loras
        self.seed = seed
        self.faults = faults
        self.engine_id = engine_id
        self.health_check_timeout_s = health_check_timeout_s
        self.group_timeout_s = group_timeout_s
        self.events = EventLog()
        self.scheduler = Scheduler(
            self.profile,
            max_running_requests,
            self.clock,
            seed,
            version=weight_version,
            events=self.events,
            engine_id=engine_id,
            trace_tokens=trace_tokens,
        )
        if model is not None and weights is not None:
            raise ValueError("pass model= or weights=, not both")
        if model is None:
            model = builtin_model(seed) if weights is None else ServedModel(
                model_path or DEFAULT_MODEL_PATH, self._initial_weights(weights, seed), dict(W.TINY_CONFIG))
        self.model = model
        self.weights: W.WeightStore = model.weights
        self.model_path = model_path or model.path
        self.tokenizer_path = tokenizer_path or self.model_path
        self.served_model_name = served_model_name or self.model_path
        self.skip_tokenizer_init = skip_tokenizer_init
        self.max_lora_rank = max_lora_rank
        self.lora_target_modules = tuple(lora_target_modules) if lora_target_modules else None
        self.load_format = load_format
        self.strict_weights = strict_weights  # refuse unknown names / partial checkpoints (SGLang skips, loads)
        self.server_args = dict(server_args or {})  # the launch flags (python -m fakes.launch_server)
        self.server_status = "Starting" if starting else "Up"  # TokenizerManager.server_status
        self.enable_memory_saver = enable_memory_saver
        self.enable_weights_cpu_backup = enable_weights_cpu_backup
        self.offload_tags: set[str] = set()  # released GPU memory types (release/resume_memory_occupation)
        self.context_length = context_length or model.config.get("max_position_embeddings")
        self.weight_version = weight_version  # tokenizer-side label (/model_info, ≤0.5.16 meta_info)
        self.startup_weight_version = weight_version
        self.crashed = False
        self.crash_reason: str | None = None
        self.closed = False
        # tokenizer-side state
        self.paused = False  # TokenizerManager.is_pause
        self.pause_mode: str | None = None
        self.session_open = False
        self._parked: list[str] = []
        self._loras: OrderedDict[str, _Adapter] = OrderedDict()
        self._groups: dict[str, Any] = {}
        self._sinks: dict[Request, _Sink] = {}
        self._sink_rids: dict[str, int] = {}  # rid -> how many of ``_sinks`` carry it (O(1) rid lookups)
        self._calls: set[_Call] = set()
        self._flushing = False
        self._lora_update_lock: asyncio.Lock | None = None
        self._rid_rng = random.Random(f"rid:{seed}:{engine_id}")
        self._outputs = 0  # scheduler outputs so far (health checks watch it)
        self._health_checks = 0
        self._background: set[asyncio.Task] = set()
        # loop binding
        self._loop: asyncio.AbstractEventLoop | None = None
        self._waiters: set[asyncio.Future] = set()
        self._ticker: asyncio.Task | None = None
        self._sync_lock = threading.Lock()
        self.update_lock = _UpdateLock(self._wait_for, self._touch, self._raise_if_dead)
        self._app = None
        self._event("weights.load", digest=self.weights.digest(), source="startup", model_path=self.model_path)

    @staticmethod
    def _initial_weights(weights: W.WeightStore | Mapping[str, Any] | None, seed: int) -> W.WeightStore:
        if weights is None:
            return W.WeightStore(W.tiny_model(seed))
        if isinstance(weights, W.WeightStore):
            return weights
        return W.WeightStore(weights)

    # -- public properties ------------------------------------------------------------------------
    @property
    def app(self) -> Any:
        """The ASGI app serving this engine (built once)."""
        if self._app is None:
            from .app import make_app

            self._app = make_app(self)
        return self._app

    @property
    def manual(self) -> bool:
        return isinstance(self.clock, ManualClock)

    @property
    def dead(self) -> bool:
        return self.crashed or self.closed

    def snapshot(self) -> dict[str, Any]:
        """The engine's observable state (JSON-ready)."""
        return {
            "engine": self.engine_id,
            "profile": self.profile.version,
            **self.scheduler.snapshot(),
            "parked": list(self._parked),
            "paused": self.paused,
            "mode": self.pause_mode,
            "version": self.weight_version,
            "session_open": self.session_open,
            "loras": {a.name: a.path for a in self._loras.values()},
            "groups": sorted(self._groups),
            "model_path": self.model_path,
            "released_memory": sorted(self.offload_tags),
            "digest": self.weights.digest(),
            "flushing": self._flushing,
            "readers": self.update_lock.readers,
            "readers_waiting": self.update_lock.readers_waiting,
            "writer": self.update_lock.writer,
            "crashed": self.crashed,
            "crash_reason": self.crash_reason,
            "clock": self.clock.now(),
        }

    # -- loop binding, waiting, stepping ----------------------------------------------------------
    def _bind(self) -> asyncio.AbstractEventLoop:
        loop = asyncio.get_running_loop()
        if self._loop is loop:
            return loop
        if self._loop is not None and not self._loop.is_closed() and self._loop.is_running():
            raise RuntimeError(f"FakeEngine {self.engine_id} is bound to another running event loop")
        self._loop = loop
        self._waiters = set()
        self._lora_update_lock = asyncio.Lock()
        if self.tokens_per_second is not None and not self.dead:
            self._ticker = loop.create_task(self._tick(), name=f"fake-sglang-ticker-{self.engine_id}")
        return loop

    def _touch(self) -> None:
        """Wake every ``wait_until`` so it re-checks its predicate."""
        if not self._waiters:
            return
        waiters, self._waiters = self._waiters, set()
        for fut in waiters:
            if not fut.done():
                fut.set_result(None)

    async def _next_change(self, timeout: float | None = None) -> None:
        fut = self._bind().create_future()
        self._waiters.add(fut)
        try:
            await asyncio.wait_for(fut, timeout)
        finally:
            self._waiters.discard(fut)

    async def wait_until(self, predicate: Callable[[], bool], timeout: float | None = 5.0) -> None:
        """Wait (real time, at most ``timeout`` s; None = forever) until ``predicate()`` holds; it is
        re-checked on every engine state change. Raises ``TimeoutError`` naming the engine state."""
        loop = self._bind()
        deadline = None if timeout is None else loop.time() + timeout
        while not predicate():
            remaining = None if deadline is None else deadline - loop.time()
            if remaining is not None and remaining <= 0:
                raise TimeoutError(
                    f"engine {self.engine_id}: condition not met within {timeout}s; state={self.snapshot()}"
                )
            try:
                await self._next_change(remaining)
            except asyncio.TimeoutError:
                continue

    def wait_until_threadsafe(self, predicate: Callable[[], bool], timeout: float = 5.0) -> None:
        """``wait_until`` for a caller on another thread (the engine's loop must be running)."""
        self._run_threadsafe(self.wait_until(predicate, timeout), timeout)

    async def _wait_for(self, predicate: Callable[[], bool]) -> None:
        """Internal wait with no deadline that gives up when the engine dies."""
        await self.wait_until(lambda: predicate() or self.dead, timeout=None)
        self._raise_if_dead()

    def _raise_if_dead(self) -> None:
        if self.crashed:
            raise EngineCrashed(self.crash_reason or "engine crashed")
        if self.closed:
            raise EngineClosed(f"engine {self.engine_id} is shut down")

    async def _engine_time_wait(self, predicate: Callable[[], bool], duration: float) -> bool:
        """Wait up to ``duration`` seconds of *engine clock* for ``predicate``; return whether it holds.
        Manual clock: time passes only through ``step`` (or ``clock.advance``)."""
        if self.manual:
            deadline = self.clock.now() + duration
            await self.wait_until(lambda: predicate() or self.dead or self.clock.now() >= deadline, timeout=None)
            return predicate()
        try:
            await self.wait_until(lambda: predicate() or self.dead, timeout=duration)
        except TimeoutError:
            pass
        return predicate()

    async def step(self, n: int = 1) -> int:
        """Run ``n`` decode iterations (no-ops while paused or idle; a manual clock still advances ``n * dt``).
        Returns the number of tokens produced."""
        self._bind()
        produced = self._run_steps(n)
        await asyncio.sleep(0)
        return produced

    def step_threadsafe(self, n: int = 1, timeout: float = 5.0) -> int:
        """``step`` for a caller on another thread (or before any loop served the engine)."""
        if self._loop is None or self._loop.is_closed():
            return self._run_steps(n)
        return self._run_threadsafe(self.step(n), timeout)

    def _run_threadsafe(self, coro: Awaitable[Any], timeout: float) -> Any:
        loop = self._loop
        if loop is None or loop.is_closed():
            coro.close()  # type: ignore[attr-defined]
            raise RuntimeError(f"engine {self.engine_id} is not served by a running event loop")
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is loop:
            coro.close()  # type: ignore[attr-defined]
            raise RuntimeError("*_threadsafe called from the engine's own loop; await the coroutine instead")
        return asyncio.run_coroutine_threadsafe(coro, loop).result(timeout)  # type: ignore[arg-type]

    def _run_steps(self, n: int) -> int:
        produced = 0
        with self._sync_lock:
            for _ in range(n):
                if self.dead:
                    break
                if self._memory_gone() and self.scheduler.has_work() and not self.scheduler.paused:
                    self.crash("CUDA error: an illegal memory access was encountered (a forward pass while "
                               f"GPU memory {sorted(self.offload_tags)} is released by the memory saver)")
                    break
                if isinstance(self.clock, ManualClock):
                    self.clock.tick()
                result = self.scheduler.step()
                produced += len(result.emitted) + len(result.finished)
                self._deliver(result)
        self._touch()
        return produced

    def _runnable(self) -> bool:
        return not self.dead and self.scheduler.has_work() and not self.scheduler.paused

    async def _tick(self) -> None:
        """Real-time mode: step at ``tokens_per_second``, catching up by elapsed time; idle without work."""
        assert self.tokens_per_second is not None
        interval = 1.0 / self.tokens_per_second
        last = self.clock.now()
        while not self.dead:
            if not self._runnable():
                await self._next_change()
                last = self.clock.now()
                continue
            delay = last + interval - self.clock.now()
            # Always yield to the loop, even when behind: catching up must not starve the HTTP side.
            await asyncio.sleep(delay if delay > 0 else 0)
            now = self.clock.now()
            n = min(max(1, int((now - last) / interval)), _MAX_CATCH_UP_STEPS)
            for _ in range(n):
                if not self._runnable():
                    break
                self._run_steps(1)
            last = max(last + n * interval, now - interval)

    # -- delivery of scheduler outputs ------------------------------------------------------------
    def _render(self, req: Request, sink: _Sink) -> dict[str, Any]:
        body = self.scheduler.render(req, since=sink.sent, label=self.weight_version)
        sink.sent = len(req.output_ids)
        return body

    def _deliver(self, result: StepResult) -> None:
        if result.produced_output:
            self._outputs += 1
        sinks = self._sinks
        for req in result.emitted:
            if req.stream:
                sink = sinks.get(req)
                if sink is not None:
                    sink.call.put_nowait((sink.index, self._render(req, sink), False))
        self._deliver_finished(result.finished)

    def _deliver_finished(self, reqs: list[Request] | tuple[Request, ...]) -> None:
        for req in reqs:
            sink = self._pop_sink(req)
            if sink is None:
                continue
            if sink.adapter is not None:
                sink.adapter.users -= 1
            sink.call.put_nowait((sink.index, self._render(req, sink), True))
        self._touch()

    def _add_sink(self, req: Request, sink: _Sink) -> None:
        self._sinks[req] = sink
        self._sink_rids[req.rid] = self._sink_rids.get(req.rid, 0) + 1

    def _pop_sink(self, req: Request) -> _Sink | None:
        sink = self._sinks.pop(req, None)
        if sink is not None:
            left = self._sink_rids[req.rid] - 1
            if left:
                self._sink_rids[req.rid] = left
            else:
                del self._sink_rids[req.rid]
        return sink

    def abort(self, rid: str = "", abort_all: bool = False) -> None:
        """``TokenizerManager.abort_request``: fire-and-forget. A rid the tokenizer does not hold (and an
        empty rid without ``abort_all``) is ignored; the scheduler then matches by prefix (spec §7.3).
        Waiting-queue aborts are answered after the caller's handler returns (so on ≤0.5.16 they carry
        a version set right after the abort, spec §6.3)."""
        if not abort_all and rid not in self._sink_rids:
            return
        done = self.scheduler.abort(rid, abort_all)
        if done:
            if self._loop is not None and not self._loop.is_closed():
                self._loop.call_soon(self._deliver_finished, done)
            else:
                self._deliver_finished(done)
        self._touch()

    # -- crash / shutdown -------------------------------------------------------------------------
    def crash(self, reason: str) -> None:
        """What SGLang's process death looks like from outside: every later call answers 500 (/health 503)."""
        if self.crashed:
            return
        self.crashed = True
        self.crash_reason = reason
        self._event("engine.crash", reason=reason)
        self._fail_calls(EngineCrashed(reason))

    async def aclose(self) -> None:
        """Shut the engine down: stop the ticker, release hung calls (they answer 503)."""
        self.closed = True
        self._fail_calls(EngineClosed(f"engine {self.engine_id} is shut down"))
        if self._ticker is not None:
            self._ticker.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._ticker
        for task in list(self._background):
            task.cancel()

    def _fail_calls(self, exc: Exception) -> None:
        for call in list(self._calls):
            call.put_nowait((None, exc, True))
        self._touch()

    def dead_reply(self, endpoint: str) -> Reply:
        """The answer of a dead engine: /health* 503 (empty), everything else 500 (crash) / 503 (shut down)."""
        if endpoint in ("/health", "/health_generate", "/ready"):
            return Reply(503)
        if self.crashed:
            return error_reply(500, f"engine crashed: {self.crash_reason}")
        return error_reply(503, f"engine {self.engine_id} is shut down")

    # -- faults -----------------------------------------------------------------------------------
    async def apply_fault(self, fault: Fault, endpoint: str) -> Reply | None:
        """Apply ``fault`` before handling ``endpoint``: a Reply to answer instead, or None to go on."""
        self._event("fault", endpoint=endpoint, fault=fault.kind, status=fault.status, latency_s=fault.latency_s)
        if fault.kind == "latency":
            if self.manual:
                await self._engine_time_wait(lambda: False, fault.latency_s)
            else:
                await asyncio.sleep(fault.latency_s)
            return self.dead_reply(endpoint) if self.dead else None
        if fault.kind == "error":
            return Reply(fault.error_status, fault.error_body)
        if fault.kind == "hang":
            await self.wait_until(lambda: self.dead, timeout=None)
            return self.dead_reply(endpoint)
        if fault.kind == "crash":
            self.crash(f"injected crash fault on {endpoint}")
            return self.dead_reply(endpoint)
        return None  # flush_fail: the app opens a flush_fault_scope for the call

    # -- /generate --------------------------------------------------------------------------------
    def _new_rid(self) -> str:
        """``uuid.UUID(int=<128 random bits>, version=4).hex``, without the UUID object."""
        value = self._rid_rng.getrandbits(128) & _UUID4_CLEAR | _UUID4_SET
        return f"{value:032x}"

    def normalize_generate(self, obj: Mapping[str, Any]) -> tuple[list[_Spec], bool]:
        """``GenerateReqInput.normalize_batch_and_arguments``: expand batch and ``n>1`` into items with rids.
        Returns (items, whether the answer is a list). Raises ValueError with SGLang's messages."""
        text, input_ids = obj.get("text"), obj.get("input_ids")
        if (text is None) == (input_ids is None):
            raise ValueError("Either text, input_ids or input_embeds should be provided.")
        if text is not None and self.skip_tokenizer_init:  # tokenizer_manager._tokenize_one_request
            raise ValueError(
                "The engine initialized with skip_tokenizer_init=True cannot accept text prompts. Please provide "
                "input_ids or re-initialize the engine with skip_tokenizer_init=False.")
        if text is not None:
            is_batch = isinstance(text, list)
            prompts = [encode_text(t) for t in (text if is_batch else [text])]
        else:
            is_batch = bool(input_ids) and isinstance(input_ids[0], list)
            prompts = [list(p) for p in input_ids] if is_batch else [list(input_ids)]
        if not prompts:
            raise ValueError("The batch of prompts is empty.")
        params = obj.get("sampling_params") or {}
        if isinstance(params, list):
            if len(params) != len(prompts):
                raise ValueError("The length of sampling_params does not match the batch size.")
            per_prompt = [dict(p or {}) for p in params]
        else:
            per_prompt = [dict(params)] * len(prompts)
        n = int(per_prompt[0].get("n", 1) or 1)
        if n < 1:
            raise ValueError(f"n must be at least 1, got {n}.")
        items = prompts * n  # GenerateReqInput._expand_inputs: text * num
        item_params = per_prompt * n
        is_list = is_batch or n > 1
        rids = self._rids(obj.get("rid"), len(items), is_list)
        loras = obj.get("lora_path")
        lora_list = loras if isinstance(loras, list) else [loras] * len(items)
        if len(lora_list) != len(items):
            lora_list = (lora_list * n)[: len(items)]
        specs = []
        for rid, ids, sp, lora in zip(rids, items, item_params, lora_list):
            self._check_sampling(sp)
            specs.append(
                _Spec(
                    rid=rid,
                    input_ids=ids,
                    sampling=sp,
                    lora=lora,
                    return_logprob=bool(obj.get("return_logprob")),
                    return_text_in_logprobs=bool(obj.get("return_text_in_logprobs")),
                    stream=bool(obj.get("stream")),
                )
            )
        return specs, is_list

    def _rids(self, rid: Any, num: int, is_list: bool) -> list[str]:
        """``GenerateReqInput._normalize_rid``."""
        if rid is None:
            return [self._new_rid() for _ in range(num)]
        if isinstance(rid, list):
            if len(rid) != num:
                raise ValueError("The specified rids length mismatch with the batch_size for batch processing.")
            return [str(r) for r in rid]
        return [f"{rid}_{i}" for i in range(num)] if is_list else [str(rid)]

    @staticmethod
    def _check_sampling(sp: Mapping[str, Any]) -> None:
        max_new = sp.get("max_new_tokens", 128)
        if not isinstance(max_new, int) or isinstance(max_new, bool) or max_new < 0:
            raise ValueError(f"max_new_tokens must be at least 0, got {max_new}.")
        stop_ids = sp.get("stop_token_ids") or []
        if not isinstance(stop_ids, list) or (stop_ids and not all(isinstance(t, int) for t in stop_ids)):
            raise ValueError(f"stop_token_ids must be a list of ints, got {stop_ids!r}.")

    async def generate(self, obj: Mapping[str, Any]) -> Reply:
        """``POST /generate``: one object, a list (batch / n>1), or an SSE stream (spec §6)."""
        try:
            specs, is_list = self.normalize_generate(obj)
        except ValueError as e:
            return error_reply(400, str(e))
        if specs and specs[0].stream:
            return Reply(200, stream=self._stream(specs, is_list))
        results: list[Any] = [None] * len(specs)
        try:
            async for index, body in self.run_generate(specs):
                results[index] = body
        except ValueError as e:
            return error_reply(400, str(e))
        except (EngineCrashed, EngineClosed):
            return self.dead_reply("/generate")
        return Reply(200, results if is_list else results[0])

    async def _stream(self, specs: list[_Spec], is_list: bool) -> AsyncIterator[dict[str, Any]]:
        try:
            async for index, chunk in self.run_generate(specs, final_only=False):
                if is_list:
                    chunk = {**chunk, "index": index}
                yield chunk
        except ValueError as e:
            yield {"error": {"message": str(e)}}
        except (EngineCrashed, EngineClosed) as e:
            yield {"error": {"message": str(e)}}

    async def run_generate(self, specs: list[_Spec], final_only: bool = True) -> AsyncIterator[tuple[int, dict]]:
        """``TokenizerManager.generate_request``: pause gate → reader lock → LoRA/rid checks → scheduler,
        yielding ``(index, body)`` as outputs arrive. Leaving early (client gone) aborts what is unfinished."""
        self._bind()
        self._raise_if_dead()
        if self.paused:  # _pass_gate returns at once otherwise
            await self._pass_gate([s.rid for s in specs])
        await self.update_lock.acquire_read()
        call = _Call()
        reqs: list[Request] = []
        try:
            reqs = self._dispatch(specs, call)
            remaining = len(reqs)
            while remaining:
                index, item, final = await call.get()
                if isinstance(item, BaseException):
                    raise item
                if final:
                    remaining -= 1
                if final or not final_only:
                    yield index, item
        finally:
            self._calls.discard(call)
            unfinished = [r for r in reqs if r in self._sinks]
            for req in unfinished:  # create_abort_task: the client left before the end
                self.abort(req.rid)
            for req in unfinished:
                sink = self._pop_sink(req)
                if sink is not None and sink.adapter is not None:
                    sink.adapter.users -= 1
            self.update_lock.release_read()

    async def _pass_gate(self, rids: list[str]) -> None:
        """``async with is_pause_cond: await wait_for(lambda: not is_pause)`` (spec §2.4)."""
        if not self.paused:
            return
        for rid in rids:
            self._event("request.parked", rid=rid)
        self._parked.extend(rids)
        self._touch()
        try:
            await self._wait_for(lambda: not self.paused)
        finally:
            for rid in rids:
                self._parked.remove(rid)
            self._touch()

    def _dispatch(self, specs: list[_Spec], call: _Call) -> list[Request]:
        """Validate LoRA names and rids, then hand the items to the scheduler (all or none)."""
        adapters = [self._lookup_adapter(s.lora) for s in specs]
        if self.profile.reject_duplicate_rid:
            held = self._sink_rids
            seen: set[str] = set()
            for s in specs:
                if s.rid in held or s.rid in seen:
                    raise ValueError(f"Duplicate request ID detected: {s.rid}")
                seen.add(s.rid)
        self._calls.add(call)
        reqs = []
        for index, (spec, adapter) in enumerate(zip(specs, adapters)):
            req = Request(
                rid=spec.rid,
                input_ids=spec.input_ids,
                max_new_tokens=spec.sampling.get("max_new_tokens", 128),
                stop_token_ids=tuple(spec.sampling.get("stop_token_ids") or ()),
                stop=_as_tuple(spec.sampling.get("stop")),
                lora=spec.lora,
                return_logprob=spec.return_logprob,
                return_text_in_logprobs=spec.return_text_in_logprobs,
                stream=spec.stream,
            )
            if adapter is not None:
                adapter.users += 1
                self._loras.move_to_end(adapter.name)
            self._add_sink(req, _Sink(call, index, adapter=adapter))
            self.scheduler.submit(req)
            reqs.append(req)
        self._touch()
        return reqs

    def _lookup_adapter(self, name: str | None) -> _Adapter | None:
        if name is None:
            return None
        if not self.enable_lora:
            raise ValueError(LORA_NOT_ENABLED)
        adapter = self._loras.get(name)
        if adapter is None:  # lora_registry.acquire
            raise ValueError(
                f"The following requested LoRA adapters are not loaded: {name}\n"
                f"Loaded adapters: {_odict_keys(self._loras)}."
            )
        return adapter

    # -- health -----------------------------------------------------------------------------------
    async def health(self) -> Reply:
        """``/health``, ``/health_generate``: a 1-token probe; 200 once any scheduler output arrives after
        the check started, 503 after ``health_check_timeout_s`` of engine time (spec §7.2)."""
        if self.dead or self.server_status == "Starting":  # 503 until the warmup request succeeded
            return Reply(503)
        start = self._outputs
        self._health_checks += 1
        spec = _Spec(f"{HEALTH_RID_PREFIX}{self._health_checks}", [0], {"max_new_tokens": 1}, None, False, False, False)

        async def probe() -> None:
            with contextlib.suppress(ValueError, EngineCrashed, EngineClosed):
                async for _ in self.run_generate([spec]):
                    pass

        task = asyncio.get_running_loop().create_task(probe())
        self._background.add(task)
        task.add_done_callback(lambda t: (self._background.discard(t), self._touch()))
        ok = await self._engine_time_wait(lambda: task.done() or self._outputs > start, self.health_check_timeout_s)
        if not ok or self.dead:
            task.cancel()
            return Reply(503)
        return Reply(200)

    async def ready(self) -> Reply:
        """0.5.23 ``/ready``: ``is_ready() = not is_pause and is_healthy()`` (http_server.py:715)."""
        return Reply(503 if self.paused or self.dead else 200)

    # -- pause / continue / abort / version -------------------------------------------------------
    async def pause_generation(self, obj: Mapping[str, Any] | None) -> Reply:
        """``/pause_generation`` (spec §2). ≤0.5.4: body ignored, abort once, return."""
        mode = obj.get("mode", "abort") if (obj is not None and self.profile.pause_modes) else "abort"
        self.paused = True
        self.pause_mode = mode
        self._touch()
        if mode != "abort":
            self.scheduler.pause(mode)
        elif not self.profile.pause_abort_waits_for_readers:
            self.abort(abort_all=True)
        else:
            # loop {abort_request(abort_all=True); if not model_update_lock.is_locked(): break; sleep(1.0)}
            while True:
                self.abort(abort_all=True)
                if not self.update_lock.locked:
                    break
                await self._next_change()
                self._raise_if_dead()
        self._touch()
        return Reply(200, dict(PAUSED_BODY))

    async def continue_generation(self, obj: Mapping[str, Any] | None) -> Reply:
        """``/continue_generation``: reopen the gate and resume the scheduler (``torch_empty_cache`` is a no-op)."""
        self.paused = False
        self.pause_mode = None
        self.scheduler.resume()
        self._touch()
        return Reply(200, dict(CONTINUED_BODY))

    async def abort_request(self, obj: Mapping[str, Any]) -> Reply:
        """``/abort_request``: 200 with an empty body, immediately (spec §7.3)."""
        rids = obj.get("rid")
        for rid in rids if isinstance(rids, list) else [rids or ""]:
            self.abort(rid, bool(obj.get("abort_all")))
        return Reply(200)

    async def update_weight_version(self, obj: Mapping[str, Any]) -> Reply:
        """``/update_weight_version``: abort all (default True!) then set the label (spec §1.2)."""
        if obj["abort_all_requests"]:
            self.abort(abort_all=True)
        version = obj["new_version"]
        self._set_version(version, "update_weight_version")
        return Reply(200, {"success": True, "message": f"Weight version updated to {version}", "new_version": version})

    def _set_version(self, version: str, cause: str) -> None:
        self.weight_version = version
        self.scheduler.set_version(version, cause)
        self._touch()

    # -- weight updates ---------------------------------------------------------------------------
    async def _weight_update(
        self,
        source: str,
        obj: Mapping[str, Any],
        load: Callable[[], Awaitable[W.WeightStore | str]],
        ok_message: str,
        flush: bool,
        extra: Mapping[str, Any] | None = None,
        needs_session: bool = False,
    ) -> Reply:
        """The shared update cycle (spec §3.3): abort → lock (skipped while paused ≥0.5.6) → load →
        post-update flush → version stamp. ``load`` returns the new store, or a failure message."""
        extra = dict(extra or {})
        if obj.get("abort_all_requests"):
            self.abort(abort_all=True)
        try:
            skip_lock = self.paused and self.profile.paused_updates_skip_lock
            async with contextlib.nullcontext() if skip_lock else self.update_lock.write():
                if needs_session and not self.session_open:
                    message = f"{source} must run between begin_weight_update() and end_weight_update()"
                    return Reply(400, {"success": False, "message": message, **extra})
                loaded = await load()
                self._raise_if_dead()
                if isinstance(loaded, str):
                    return Reply(400, {"success": False, "message": loaded, **extra})
                return self._apply_update(source, obj, loaded, ok_message, flush, extra)
        except (EngineCrashed, EngineClosed):
            return self.dead_reply(f"/{source}")

    def _apply_update(
        self, source: str, obj: Mapping[str, Any], loaded: W.WeightStore, ok_message: str, flush: bool, extra: dict
    ) -> Reply:
        self.weights = loaded
        self._event("weights.load", digest=loaded.digest(), source=source, model_path=obj.get("model_path"))
        version = obj.get("weight_version")
        if flush and not self._flush_now():
            if self.profile.post_update_flush_failure == "crash":
                self.crash(FLUSH_AFTER_UPDATE_ASSERT)
                return self.dead_reply(f"/{source}")
            if version is not None:  # 0.5.23: scheduler-side version recorded, tokenizer label not (code-read)
                self.scheduler.set_version(version, f"{source} (cache flush failed)")
            return Reply(400, {"success": False, "message": FLUSH_AFTER_UPDATE_ERROR, **extra})
        if source == "update_weights_from_disk":  # the tokenizer side records the path only on success (spec §3.3)
            self.model_path = obj["model_path"]
        message = ok_message
        if version is not None:
            self._set_version(version, source)
            message += f" Weight version updated to {version}."
        return Reply(200, {"success": True, "message": message, **extra})

    def _merged(self, blobs: Mapping[str, W.TensorBlob], source: str, strict: bool = False) -> W.WeightStore:
        """The weights after loading ``blobs`` as the model's ``load_weights`` does (``models/llama.py``, the same
        in ``qwen2.py``/``qwen3.py``, 0.5.4–0.5.23): a name the model lacks is skipped with
        ``logger.warning("Parameter <name> not found in params_dict")`` (silently for the names its stacked
        q/k/v and gate/up mapping or its skip rules swallow) and the rest load; the update succeeds. A shape
        mismatch raises (``default_weight_loader``'s assert). ``strict_weights`` refuses unknown names instead."""
        if not (self.strict_weights or strict):
            unknown = [name for name in blobs if name not in self.weights]
            for name in unknown:
                silent = _silently_skipped(name, self.model.config)
                message = None if silent else f"Parameter {name} not found in params_dict"
                if message is not None:
                    logger.warning(message)
                self._event("weights.skipped", name=name, source=source, message=message)
            if unknown:
                blobs = {name: blob for name, blob in blobs.items() if name in self.weights}
        return self.weights.updated(blobs, cast=True)

    def _flush_now(self) -> bool:
        """One flush attempt: the profile's idle predicate, unless a ``flush_fail`` fault is active."""
        return self.scheduler.is_idle_for_flush() and not _flush_fault.get()

    async def update_weights_from_disk(self, obj: Mapping[str, Any]) -> Reply:
        """``/update_weights_from_disk``: read the checkpoint; failure rolls back and keeps the version."""

        missing_shards = "error" if self.profile.missing_shard_fails else "skip"

        async def load() -> W.WeightStore | str:
            try:
                blobs = await asyncio.to_thread(W.load_checkpoint, obj["model_path"], obj.get("load_format"),
                                                strict=self.strict_weights, missing_shards=missing_shards)
                return self._merged(blobs, "update_weights_from_disk")
            except W.CheckpointError as e:
                return _disk_failure(e, e.stage)
            except W.WeightError as e:
                return _disk_failure(e, "load")

        flush = obj.get("flush_cache", True) if self.profile.disk_flush_cache_field else True
        return await self._weight_update(
            "update_weights_from_disk",
            obj,
            load,
            "Succeeded to update model weights.",
            flush,
            {"num_paused_requests": 0},
        )

    async def update_weights_from_tensor(self, obj: Mapping[str, Any]) -> Reply:
        """``/update_weights_from_tensor``: decode this rank's payload. SGLang's model runner has no
        try/except here (``update_weights_from_tensor`` → ``load_weights``), so a bad payload or unknown
        parameter kills the scheduler: the fake crashes."""

        async def load() -> W.WeightStore | str:
            try:
                load_format = obj.get("load_format")
                # tp_worker.deserialize_own_rank: this rank's item; a LocalSerializedTensor inside is unwrapped
                # for it too (weight_updater._unwrap_tensor). One TP rank here: rank 0.
                blobs = W.decode_tensor_payload(obj["serialized_named_tensors"][0], tp_rank=0,
                                                load_format=load_format)
                # load_format "direct" copies into params_dict[name] (_model_load_weights_direct): no skipping
                return self._merged(blobs, "update_weights_from_tensor", strict=load_format == "direct")
            except (W.WeightError, IndexError) as e:
                self.crash(f"{type(e).__name__} in update_weights_from_tensor: {e}")
                raise EngineCrashed(self.crash_reason) from None

        return await self._weight_update(
            "update_weights_from_tensor",
            obj,
            load,
            "Success",
            bool(obj.get("flush_cache", True)),
            needs_session=self.profile.weight_update_sessions,
        )

    async def update_weights_from_distributed(self, obj: Mapping[str, Any]) -> Reply:
        """``/update_weights_from_distributed``: receive the broadcast on the named group. An unknown group
        hits an ``assert`` outside the model runner's try (spec §3.3.7): the fake crashes."""

        async def load() -> W.WeightStore | str:
            group = self._groups.get(obj["group_name"])
            if group is None:
                self.crash(
                    f"AssertionError: Group {obj['group_name']} not in {list(self._groups)}. "
                    "Please call `init_weights_update_group` first."
                )
                raise EngineCrashed(self.crash_reason)
            try:
                blobs = await asyncio.to_thread(group.receive, obj["names"], obj["dtypes"], obj["shapes"])
                return self._merged(blobs, "update_weights_from_distributed")
            except Exception as e:  # noqa: BLE001 - model_runner catches Exception here
                return (
                    f"Failed to update parameter online: {e}. The full weights of the ModelRunner are "
                    "partially updated. Please discard the whole weights."
                )

        return await self._weight_update(
            "update_weights_from_distributed",
            obj,
            load,
            "Succeeded to update parameter online.",
            bool(obj.get("flush_cache", True)),
            needs_session=self.profile.weight_update_sessions,
        )

    async def init_weights_update_group(self, obj: Mapping[str, Any]) -> Reply:
        """``/init_weights_update_group``: join the trainer's group (blocks until it joins; no lock)."""
        try:
            group = await asyncio.to_thread(
                W.DistributedGroup.join,
                obj["master_address"],
                obj["master_port"],
                obj["rank_offset"],  # rank = rank_offset + tp_rank (tp_size 1)
                obj["world_size"],
                obj["group_name"],
                obj["backend"],
                self.group_timeout_s,
            )
        except Exception as e:  # noqa: BLE001
            return Reply(400, {"success": False, "message": f"Failed to initialize custom process group: {e}."})
        self._groups[obj["group_name"]] = group
        return Reply(200, {"success": True, "message": "Succeeded to initialize custom process group."})

    async def destroy_weights_update_group(self, obj: Mapping[str, Any]) -> Reply:
        group = self._groups.pop(obj["group_name"], None)
        if group is None:
            return Reply(400, {"success": False, "message": "The group to be destroyed does not exist."})
        await asyncio.to_thread(group.destroy)
        return Reply(200, {"success": True, "message": "Succeeded to destroy custom process group."})

    async def begin_weight_update(self, obj: Mapping[str, Any]) -> Reply:
        """0.5.23 ``/begin_weight_update`` (``scheduler_components/weight_updater.py``)."""
        if self.session_open:
            message = "a weight-update session is already open; call end_weight_update() first"
            return Reply(400, {"success": False, "message": message})
        self.session_open = True
        return Reply(200, {"success": True, "message": "Success"})

    async def end_weight_update(self, obj: Mapping[str, Any]) -> Reply:
        if not self.session_open:
            message = "no weight-update session is open; call begin_weight_update() first"
            return Reply(400, {"success": False, "message": message})
        self.session_open = False
        return Reply(200, {"success": True, "message": "Success"})

    async def get_weights_by_name(self, obj: Mapping[str, Any]) -> Reply:
        blob = self.weights.get(obj["name"])
        values = None if blob is None else W.values_preview(blob, obj["truncate_size"])
        if values is None:
            return error_reply(400, "Get parameter by name failed")
        return Reply(200, values)

    # -- memory occupation ------------------------------------------------------------------------
    def _memory_gone(self) -> bool:
        """Weights or KV cache released by torch_memory_saver (``--enable-memory-saver``; without it the adapter is
        a no-op and release/resume change nothing on the GPU)."""
        return self.enable_memory_saver and bool(self.offload_tags & {"weights", "kv_cache"})

    def _memory_tags(self, obj: Mapping[str, Any] | None) -> list[str]:
        tags = (obj or {}).get("tags")
        return list(tags) if tags else list(self.profile.memory_tags)

    async def release_memory_occupation(self, obj: Mapping[str, Any] | None) -> Reply:
        """``/release_memory_occupation`` (scheduler ``weight_updater.release_memory_occupation``): no lock, no
        pause gate. 0.5.10+ asserts the scheduler is idle (a resident request kills the server); the KV cache is
        flushed; with ``--enable-memory-saver`` the released memory holds nothing until resumed. Answers 200
        ``null``."""
        if self.profile.release_memory_requires_idle and not self.scheduler.is_idle_for_flush():
            self.crash("AssertionError: release_memory_occupation should be called only when server is idle.")
            return self.dead_reply("/release_memory_occupation")
        tags = self._memory_tags(obj)
        self.offload_tags.update(tags)
        self._event("memory.release", tags=tags, memory_saver=self.enable_memory_saver)
        return Reply(200, JSON_NULL)

    async def resume_memory_occupation(self, obj: Mapping[str, Any] | None) -> Reply:
        """``/resume_memory_occupation``: ``offload_tags.remove(tag)`` (a tag not released is a KeyError that kills
        the scheduler). Weights resumed by the memory saver without ``--enable-weights-cpu-backup`` come back as
        fresh, unfilled memory (zeros here): the trainer must push weights again before generating."""
        tags = self._memory_tags(obj)
        missing = [t for t in tags if t not in self.offload_tags]
        if missing:
            self.crash(f"KeyError: {missing[0]!r} (resume_memory_occupation of memory that is not released)")
            return self.dead_reply("/resume_memory_occupation")
        self.offload_tags.difference_update(tags)
        if "weights" in tags and self.enable_memory_saver and not self.enable_weights_cpu_backup:
            self.weights = W.WeightStore({name: W.TensorBlob.zeros(b.dtype, b.shape) for name, b in self.weights.items()})
            self._event("weights.load", digest=self.weights.digest(), source="resume_memory_occupation",
                        model_path=None)
        self._event("memory.resume", tags=tags, memory_saver=self.enable_memory_saver)
        self._touch()
        return Reply(200, JSON_NULL)

    # -- flush ------------------------------------------------------------------------------------
    async def flush_cache(self, timeout: float = 0.0) -> Reply:
        """``/flush_cache``: plain-text body; ``timeout`` (0.5.10+) waits that long for idleness (spec §7.1)."""
        if self._flushing:
            return Reply(400, "Another flush_cache is already in progress.")
        message = ""
        if timeout > 0:
            self._flushing = True
            self._touch()
            try:
                ok = await self._engine_time_wait(self.scheduler.is_idle_for_flush, timeout)
            finally:
                self._flushing = False
                self._touch()
            if not ok:
                message = "Timed out waiting for idle state."
        ok = self._flush_now()
        if ok:
            return Reply(200, FLUSH_OK_TEXT)
        if not self.profile.flush_timeout_query:
            return Reply(400, FLUSH_OK_TEXT)  # ≤0.5.6: same text, status 400
        return Reply(400, message or "Flush cache failed.\n")

    # -- LoRA -------------------------------------------------------------------------------------
    def _lora_body(self, ok: bool, error: str | None, with_adapters: bool = True) -> Reply:
        loaded = {a.name: a.path for a in self._loras.values()} if with_adapters else None
        return _success_reply(ok, {"success": ok, "error_message": error, "loaded_adapters": loaded})

    async def load_lora_adapter(self, obj: Mapping[str, Any]) -> Reply:
        """``/load_lora_adapter``: no abort, no model-update lock, no version stamp (spec §4)."""

        async def read() -> None:
            adapter = await asyncio.to_thread(W.load_lora_adapter, obj["lora_path"])
            self._check_lora_fits(obj["lora_name"], adapter["config"])

        return await self._load_lora(obj["lora_name"], obj["lora_path"], bool(obj.get("pinned")), read)

    def _check_lora_fits(self, name: str, config: Mapping[str, Any]) -> None:
        """``LoRAManager.validate_new_adapter``: the adapter must fit the memory pool ``--max-lora-rank`` and
        ``--lora-target-modules`` set up (ValueError with SGLang's message)."""
        rank = int(config.get("r") or 0)
        modules = config.get("target_modules") or []
        modules = [modules] if isinstance(modules, str) else list(modules)
        allowed = self.lora_target_modules
        too_big = self.max_lora_rank is not None and rank > self.max_lora_rank
        outside = allowed is not None and "all" not in allowed and not set(modules) <= set(allowed)
        if too_big or outside:
            raise ValueError(
                f"LoRA adapter {name} with rank {rank} is incompatible with the current LoRA memory pool "
                "configuration. Please ensure that the LoRA adapter's rank is within the configured "
                "`--max-lora-rank` and that the target modules are included in `--lora-target-modules`.")

    async def load_lora_adapter_from_tensors(self, obj: Mapping[str, Any]) -> Reply:
        """0.5.10+: one ``serialized_tensors`` str (≤0.5.16) or ``serialized_named_tensors`` list (0.5.23)."""

        async def read() -> None:
            payload = obj["serialized_tensors"] if "serialized_tensors" in obj else obj["serialized_named_tensors"]
            W.decode_tensor_payload(payload[0] if isinstance(payload, list) else payload)

        return await self._load_lora(obj["lora_name"], "__tensor__", bool(obj.get("pinned")), read)

    async def _load_lora(self, name: str, path: str, pinned: bool, read: Callable[[], Awaitable[None]]) -> Reply:
        if not self.enable_lora:
            return self._lora_body(False, LORA_NOT_ENABLED, with_adapters=False)
        self._bind()
        assert self._lora_update_lock is not None
        async with self._lora_update_lock:
            if name in self._loras:
                return self._lora_body(False, f"Failed to load LoRA adapter {name} because it is already loaded")
            try:
                await read()
            except W.WeightError as e:
                return self._lora_body(False, f"Failed to load LoRA adapter {name}: {e}")
            except ValueError as e:  # validate_new_adapter
                return self._lora_body(False, str(e))
            self._loras[name] = _Adapter(name, path, pinned)
            self._event("lora.load", name=name, path=path, pinned=pinned)
            while len(self._loras) > self.max_loras:  # max_loaded_loras: unload the LRU unpinned adapter
                victim = next((a for a in self._loras.values() if not a.pinned), None)
                if victim is None:
                    message = "Didn't find any LoRA adapters when trying to evict LRU LoRA adapter."
                    return self._lora_body(False, message)
                await self._unload_locked(victim.name)
            return self._lora_body(True, None)

    async def unload_lora_adapter(self, obj: Mapping[str, Any]) -> Reply:
        """``/unload_lora_adapter``: unregister first (new requests then get 400), then wait for its users."""
        if not self.enable_lora:
            return self._lora_body(False, LORA_NOT_ENABLED, with_adapters=False)
        self._bind()
        assert self._lora_update_lock is not None
        name = obj["lora_name"]
        async with self._lora_update_lock:
            if name not in self._loras:
                message = f"LoRA with name {name} does not exist. Loaded LoRAs: {_odict_keys(self._loras)}"
                return self._lora_body(False, message, with_adapters=False)
            await self._unload_locked(name)
            return self._lora_body(True, None)

    async def _unload_locked(self, name: str) -> None:
        adapter = self._loras.pop(name)
        self._touch()
        await self._wait_for(lambda: adapter.users == 0)  # lora_registry.wait_for_unload
        self._event("lora.unload", name=name, path=adapter.path)

    # -- info -------------------------------------------------------------------------------------
    def model_info(self) -> dict[str, Any]:
        """``/model_info`` / ``/get_model_info`` body with this profile's keys (spec §5)."""
        values = {
            "model_path": self.model_path,
            "tokenizer_path": self.tokenizer_path,
            "is_generation": True,
            "preferred_sampling_params": None,
            "weight_version": self.weight_version,
            "has_image_understanding": False,
            "has_audio_understanding": False,
            "model_type": self.model.model_type,
            "architectures": self.model.architectures,
            "served_model_name": self.served_model_name,
            "load_format": self.load_format,
            "reasoning_parser": None,
            "tool_call_parser": None,
            "disaggregation_mode": "null",
        }
        return {key: values[key] for key in self.profile.model_info_keys}

    def server_info(self) -> dict[str, Any]:
        """A small ``/server_info``: server args + internal state. ``weight_version`` tracks updates
        ≤0.5.16 and is the startup value on 0.5.23 (spec §5, code-read)."""
        tracked = self.profile.server_info_tracks_version
        return {
            **self.server_args,
            "model_path": self.model_path,
            "tokenizer_path": self.tokenizer_path,
            "served_model_name": self.served_model_name,
            "skip_tokenizer_init": self.skip_tokenizer_init,
            "dtype": self.server_args.get("dtype", "auto"),
            "weight_version": self.weight_version if tracked else self.startup_weight_version,
            "max_running_requests": self.scheduler.max_running_requests,
            "enable_lora": self.enable_lora,
            "max_loaded_loras": self.max_loras,
            "tp_size": 1,
            "dp_size": 1,
            "load_format": self.load_format,
            "internal_states": [{"paused": self.scheduler.paused, "num_running_reqs": len(self.scheduler.running)}],
            "version": self.profile.version,
        }

    def models(self, model: str | None = None) -> Reply:
        """``/v1/models`` (the served model, then every loaded LoRA adapter on 0.5.10+) and
        ``/v1/models/{model}`` (the served model only; 404 ``model_not_found`` otherwise)."""
        base = {"id": self.served_model_name, "object": "model", "created": int(self._wall_time()),
                "owned_by": "sglang", "root": self.served_model_name, "parent": None,
                "max_model_len": self.context_length}
        if model is not None:
            if model != self.served_model_name:
                return Reply(404, {"error": {"message": f"The model '{model}' does not exist",
                                             "type": "invalid_request_error", "param": "model",
                                             "code": "model_not_found"}})
            return Reply(200, base)
        cards = [base]
        if self.enable_lora and self.profile.models_list_loras:
            cards += [{**base, "id": a.name, "root": a.path, "parent": self.served_model_name, "max_model_len": None}
                      for a in self._loras.values()]
        return Reply(200, {"object": "list", "data": cards})

    @staticmethod
    def _wall_time() -> float:
        import time

        return time.time()

    def get_weight_version(self) -> Reply:
        if self.profile.get_weight_version == "deprecated":
            return Reply(404, dict(WEIGHT_VERSION_DEPRECATED))
        return Reply(200, {"weight_version": self.weight_version})

    # -- events -----------------------------------------------------------------------------------
    def record_control(self, endpoint: str, payload: Any, status: int, body: Any) -> None:
        """A ``control`` event: the exact wire payload, the status and body answered."""
        self._event("control", endpoint=endpoint, payload=payload, status=status, body=body)

    def _event(self, kind: str, **fields: Any) -> None:
        self.events.record(self.clock.now(), kind, self.engine_id, **fields)
        self._touch()

    def __repr__(self) -> str:
        return f"FakeEngine({self.engine_id!r}, profile={self.profile.version!r}, version={self.weight_version!r})"


_STACKED = (".q_proj", ".k_proj", ".v_proj", ".gate_proj", ".up_proj")  # LlamaForCausalLM.stacked_params_mapping
_SKIPPED = ("rotary_emb.inv_freq", "projector", "rotary_emb.cos_cached", "rotary_emb.sin_cached")


def _silently_skipped(name: str, config: Mapping[str, Any]) -> bool:
    """Unknown names ``LlamaForCausalLM.load_weights`` drops without a warning: rotary caches and projectors,
    ``lm_head`` of a tied model, and names its stacked mapping rewrites (``q_proj`` → ``qkv_proj``) to a
    parameter that does not exist (``if name not in params_dict: continue``)."""
    if any(part in name for part in _SKIPPED):
        return True
    if config.get("tie_word_embeddings") and "lm_head.weight" in name:
        return True
    return any(part in name for part in _STACKED)


def _disk_failure(e: Exception, stage: str) -> str:
    """``model_runner.update_weights_from_disk`` messages per failing stage (spec §3.2)."""
    if stage == "loader":
        return f"Failed to get model loader: {e}."
    if stage == "iterator":
        return f"Failed to get weights iterator: {e}."
    return f"Failed to update weights: {e}.\nRolling back to original weights."


def _as_tuple(value: Any) -> tuple[str, ...]:
    if value is None:
        return ()
    return (value,) if isinstance(value, str) else tuple(value)


def _odict_keys(d: Mapping[str, Any]) -> str:
    """How ``OrderedDict.keys()`` prints in SGLang's messages."""
    return f"odict_keys({list(d)!r})"
