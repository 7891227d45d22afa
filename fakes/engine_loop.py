"""The engine's life on its event loop: binding to the loop that serves it, waiting on state changes (never sleeping),
stepping the scheduler (by hand on a manual clock, or a real-time ticker at ``tokens_per_second``), SGLang's
writer-preferring model-update lock, crash and shutdown, injected faults and the event log.

``EngineLoop`` is the base of ``FakeEngine``; the state it uses is set up by ``FakeEngine.__init__``.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import Any, AsyncIterator, Awaitable, Callable

from .asgi import Reply
from .clock import ManualClock
from .failures import EngineClosed, EngineCrashed, error_reply
from .faults import Fault

_MAX_CATCH_UP_STEPS = 1000
TICK_S = 0.01
"""The real-time ticker wakes at most this often and runs the steps due since (SGLang's own decode steps are
milliseconds apart too): waking once per token at thousands of tokens per second costs a core's worth of event-loop
turns for no visible difference."""


class _UpdateLock:
    """SGLang's ``model_update_lock`` (``utils/aio_rwlock.py``): writer-preferring, so readers wait while
    a writer waits or holds it (``utils/aio_rwlock.py``, tokenizer_control_mixin.py)."""

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


class EngineLoop:
    """Loop binding, waiting, stepping, crash/shutdown, faults and events of a ``FakeEngine``."""

    @property
    def manual(self) -> bool:
        return isinstance(self.clock, ManualClock)

    @property
    def dead(self) -> bool:
        return self.crashed or self.closed

    def _bind(self) -> asyncio.AbstractEventLoop:
        loop = asyncio.get_running_loop()
        if self._loop is loop:
            return loop
        if self._loop is not None and not self._loop.is_closed() and self._loop.is_running():
            raise RuntimeError(f"FakeEngine {self.engine_id} is bound to another running event loop")
        self._loop = loop
        self._waiters = {}
        self._lora_update_lock = asyncio.Lock()
        if self.tokens_per_second is not None and not self.dead:
            self._ticker = loop.create_task(self._tick(), name=f"fake-sglang-ticker-{self.engine_id}")
        return loop

    def _touch(self) -> None:
        """Wake every ``wait_until`` so it re-checks its predicate."""
        if not self._waiters:
            return
        waiters, self._waiters = self._waiters, {}  # in arrival order: a run replays identically (virtual time)
        for fut in waiters:
            if not fut.done():
                fut.set_result(None)

    async def _next_change(self, timeout: float | None = None) -> None:
        fut = self._bind().create_future()
        self._waiters[fut] = None
        try:
            await asyncio.wait_for(fut, timeout)
        finally:
            self._waiters.pop(fut, None)

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
                fault = self.forward_fault()
                if fault is not None and self.scheduler.has_work() and not self.scheduler.paused:
                    self.crash(fault)
                    break
                if isinstance(self.clock, ManualClock):
                    self.clock.tick()
                result = self.scheduler.step()
                produced += len(result.emitted) + len(result.finished)
                self._deliver(result)
        self._touch()
        return produced

    def forward_fault(self) -> str | None:
        """Why the next forward pass kills the engine, or None: GPU memory released by the memory saver."""
        if self.memory_gone:
            return ("CUDA error: an illegal memory access was encountered (a forward pass while "
                    f"GPU memory {sorted(self.offload_tags)} is released by the memory saver)")
        return None

    frozen = False
    """Real-time decoding stopped (:meth:`set_frozen`)."""

    def set_frozen(self, frozen: bool) -> None:
        """Stop (or restart) real-time decoding, from any thread: nothing decodes while frozen, and the steps missed
        are not caught up after (to the requests, the time frozen never passed). A test holding a call at the wire
        freezes the engines so that what they are decoding when the call arrives is still decoding when it goes on."""
        loop = self._loop
        if loop is None or loop.is_closed():
            self.frozen = frozen
            return
        loop.call_soon_threadsafe(self._apply_frozen, frozen)

    def _apply_frozen(self, frozen: bool) -> None:
        self.frozen = frozen
        self._touch()

    def _runnable(self) -> bool:
        return not self.dead and not self.frozen and self.scheduler.has_work() and not self.scheduler.paused

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
            delay = last + max(interval, TICK_S) - self.clock.now()
            # Always yield to the loop, even when behind: catching up must not starve the HTTP side.
            await asyncio.sleep(delay if delay > 0 else 0)
            now = self.clock.now()
            n = min(max(1, int((now - last) / interval)), _MAX_CATCH_UP_STEPS)
            for _ in range(n):
                if not self._runnable():
                    break
                self._run_steps(1)
            last = max(last + n * interval, now - interval)

    def crash(self, reason: str) -> None:
        """What SGLang's process death looks like from outside: every later call answers 500 (/health 503)."""
        if self.crashed:
            return
        self.crashed = True
        self.crash_reason = reason
        self._event("engine.crash", reason=reason)
        self._fail_calls(EngineCrashed(reason))
        if self.on_crash is not None:
            self.on_crash(reason)

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

    def record_control(self, endpoint: str, payload: Any, status: int, body: Any) -> None:
        """A ``control`` event: the exact wire payload, the status and body answered."""
        self._event("control", endpoint=endpoint, payload=payload, status=status, body=body)

    def _weights_event(self, kind: str, **fields: Any) -> None:
        """The engine now holds ``self.weights`` (``weights.load``) or no weights (``weights.lost``): a new weights tag,
        stamped on every token decoded from here on, recorded with each parameter's digest and the host's monotonic
        time (the suite's per-decode-step truth: P8 reads which weights each token came from)."""
        self.scheduler.weights_tag += 1
        lost = kind == "weights.lost"
        digests = {} if lost else {name: blob.digest() for name, blob in self.weights.items()}
        self._event(kind, tag=self.scheduler.weights_tag, wall=time.monotonic(), digests=digests,
                    digest=None if lost else self.weights.digest(), **fields)

    def _event(self, kind: str, **fields: Any) -> None:
        self.events.record(self.clock.now(), kind, self.engine_id, **fields)
        self._touch()
