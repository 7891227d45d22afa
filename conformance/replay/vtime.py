"""Virtual time for asyncio: a loop whose clock jumps to the next timer whenever every task waits.

Nothing sleeps for real. The loop's selector polls its file descriptors without blocking (the replay uses none
but the loop's own wake-up pipe: engines are reached in process); when nothing is ready, it moves the clock
forward by the time to the next scheduled callback. Work handed to the loop's executor (``asyncio.to_thread``:
the reference encodes tensors there) takes no virtual time: while any is running the clock stands still and
the loop waits for it for real. ``asyncio.sleep``, ``wait_for`` timeouts and every
``loop.time()`` read that clock, so a run of simulated hours takes as long as its callbacks take to run.
"""

from __future__ import annotations

import asyncio
import selectors
from typing import Any, Coroutine, TypeVar

T = TypeVar("T")

DEADLOCK_S = 30.0
"""Real seconds the loop waits for a thread's wake-up when no timer is set before calling it a deadlock."""


class VirtualDeadlock(RuntimeError):
    """Every task waits on something no timer or thread will ever deliver."""


class _VirtualSelector(selectors.BaseSelector):
    """A real selector polled with timeout 0; an empty poll advances virtual time by the loop's timeout."""

    def __init__(self) -> None:
        self._real = selectors.DefaultSelector()
        self.now = 0.0
        self.busy = 0
        """Executor jobs running: the clock stands still until they are done."""

    def register(self, fileobj: Any, events: int, data: Any = None) -> selectors.SelectorKey:
        return self._real.register(fileobj, events, data)

    def unregister(self, fileobj: Any) -> selectors.SelectorKey:
        return self._real.unregister(fileobj)

    def modify(self, fileobj: Any, events: int, data: Any = None) -> selectors.SelectorKey:
        return self._real.modify(fileobj, events, data)

    def get_map(self) -> Any:
        return self._real.get_map()

    def close(self) -> None:
        self._real.close()

    def select(self, timeout: float | None = None) -> list[tuple[selectors.SelectorKey, int]]:
        ready = self._real.select(0)
        if ready or timeout == 0:
            return ready
        if timeout is None or self.busy:  # only another thread can wake the loop (its self-pipe)
            ready = self._real.select(DEADLOCK_S)
            if not ready:
                why = f"{self.busy} executor job(s) still running" if self.busy else "every task waits, no timer set"
                raise VirtualDeadlock(f"nothing woke the loop for {DEADLOCK_S:g} real seconds ({why}): a deadlock in "
                                      f"virtual time")
            return ready
        self.now += timeout
        return []


class VirtualTimeLoop(asyncio.SelectorEventLoop):
    """An event loop on virtual time (see the module docstring); ``time()`` starts at 0."""

    def __init__(self) -> None:
        self._virtual = _VirtualSelector()
        super().__init__(self._virtual)

    def time(self) -> float:
        return self._virtual.now

    def run_in_executor(self, executor: Any, func: Any, *args: Any) -> asyncio.Future:
        future = super().run_in_executor(executor, func, *args)
        self._virtual.busy += 1

        def done(_: asyncio.Future) -> None:
            self._virtual.busy -= 1
        future.add_done_callback(done)
        return future


class LoopClock:
    """``now()`` = the running loop's time: the fake engines' clock in the replay (``fakes.clock.Clock``)."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop

    def now(self) -> float:
        return self._loop.time()


def run_virtual(main: Coroutine[Any, Any, T]) -> T:
    """Run ``main`` to completion on a fresh :class:`VirtualTimeLoop`; cancel what it left behind, close the loop."""
    loop = VirtualTimeLoop()
    try:
        asyncio.set_event_loop(loop)
        return loop.run_until_complete(main)
    finally:
        try:
            left = [t for t in asyncio.all_tasks(loop) if not t.done()]
            for task in left:
                task.cancel()
            if left:
                loop.run_until_complete(asyncio.gather(*left, return_exceptions=True))
            loop.run_until_complete(loop.shutdown_asyncgens())
        finally:
            asyncio.set_event_loop(None)
            loop.close()
