"""Each scenario's event loop, in a thread the suite can abandon.

``asyncio.run`` waits, when its coroutine is done, for every task still running to finish its cancellation and for
every worker thread of the loop's default executor: an integration that swallows ``CancelledError`` (a retry loop
in a bare ``except:``) or that blocks in ``asyncio.to_thread`` hangs it, and with it the whole pytest session. Here
the loop runs in a daemon thread, worker threads are daemon threads too, and what does not stop within a grace
period after its cancellation is left behind (loop, thread and all) and reported, so the session goes on.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Coroutine, Generic, TypeVar

T = TypeVar("T")

GRACE_S = 2.0
"""How long a cancelled task may take to finish before it is abandoned."""
ABANDONED: list[asyncio.AbstractEventLoop] = []
"""Loops left behind, kept referenced: collecting one would run its stuck coroutines' cleanup from the garbage
collector, in whatever thread it happens to run."""


class DaemonExecutor(concurrent.futures.ThreadPoolExecutor):
    """Runs each call in a fresh daemon thread: a call blocked for good holds up neither the loop's shutdown nor the
    interpreter's exit (a plain ``ThreadPoolExecutor``'s workers are joined at both). A subclass only because
    asyncio takes nothing else as a default executor; none of the pool is used."""

    def __init__(self, name: str) -> None:
        super().__init__(max_workers=1, thread_name_prefix=name)
        self.name = name

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> concurrent.futures.Future[Any]:
        future: concurrent.futures.Future[Any] = concurrent.futures.Future()

        def run() -> None:
            if not future.set_running_or_notify_cancel():
                return
            try:
                future.set_result(fn(*args, **kwargs))
            except BaseException as exc:  # noqa: BLE001 - handed to the awaiting coroutine
                future.set_exception(exc)
        threading.Thread(target=run, name=f"{self.name}-worker", daemon=True).start()
        return future

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        """Nothing to wait for: the threads are daemons and finish (or not) on their own."""


@dataclass
class LoopOutcome(Generic[T]):
    """How a loop run ended: the main coroutine's result (or why there is none) and what had to be abandoned."""

    result: T | None = None
    error: BaseException | None = None
    finished: bool = False
    """Whether the main coroutine finished (returned or raised) within its bound."""
    abandoned: list[str] = field(default_factory=list)
    """The tasks (coroutine names) still running after their cancellation and the grace period, left behind with
    the loop; or the loop itself, when its thread did not come back (a call blocked the loop's own thread)."""

    def get(self) -> T:
        """The main coroutine's result; re-raises its exception."""
        if self.error is not None:
            raise self.error
        return self.result  # type: ignore[return-value]


def _describe(task: asyncio.Task[Any]) -> str:
    coro = task.get_coro()
    return getattr(coro, "__qualname__", None) or repr(coro)


def run_abandonable(main: Coroutine[Any, Any, T], bound_s: float, name: str = "scenario",
                    grace_s: float = GRACE_S) -> LoopOutcome[T]:
    """Run ``main`` on a fresh event loop in a daemon thread, for at most ``bound_s``; never hangs.

    Past ``bound_s`` the main task is cancelled. Once it is done (or given up), every task it left running is
    cancelled; whatever is still running ``grace_s`` later is abandoned with the loop, which is then never closed
    (its worker threads are daemons: :class:`DaemonExecutor`). Returns within about ``bound_s + 3 * grace_s``."""
    outcome: LoopOutcome[T] = LoopOutcome()
    loop = asyncio.new_event_loop()
    loop.set_default_executor(DaemonExecutor(name))

    def drive() -> None:
        asyncio.set_event_loop(loop)
        task = loop.create_task(main)
        loop.run_until_complete(asyncio.wait({task}, timeout=bound_s))
        if not task.done():
            task.cancel()
            loop.run_until_complete(asyncio.wait({task}, timeout=grace_s))
        if task.done() and not task.cancelled():
            outcome.finished = True
            outcome.error = task.exception()
            outcome.result = None if outcome.error is not None else task.result()
        else:
            outcome.error = TimeoutError(f"{name} did not finish within {bound_s:g}s" + (
                "" if task.done() else f", nor {grace_s:g}s after its cancellation"))
        left = [t for t in asyncio.all_tasks(loop) if not t.done()]
        for t in left:
            t.cancel()
        if left:
            loop.run_until_complete(asyncio.wait(left, timeout=grace_s))
        stuck = [t for t in left if not t.done()]
        outcome.abandoned = [_describe(t) for t in stuck]
        if stuck:
            ABANDONED.append(loop)
        else:
            loop.run_until_complete(loop.shutdown_asyncgens())
            loop.close()

    thread = threading.Thread(target=drive, name=f"{name}-loop", daemon=True)
    started = time.monotonic()
    thread.start()
    thread.join(bound_s + 3 * grace_s + 1.0)
    if thread.is_alive():
        outcome.finished = False
        outcome.error = TimeoutError(f"{name} did not finish within {time.monotonic() - started:.0f}s and its event "
                                     f"loop does not answer (a call blocks the loop's own thread)")
        outcome.abandoned = [f"the event loop of {name} (its thread is blocked)"]
        ABANDONED.append(loop)
    return outcome
