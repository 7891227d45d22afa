"""The asyncio helpers the reference builds its update cycle from."""

from __future__ import annotations

import asyncio
import threading
from typing import Any, Awaitable, Callable, Iterable, TypeVar

T = TypeVar("T")


def run_in_daemon_thread(fn: Callable[..., T], *args: Any) -> "asyncio.Future[T]":
    """Run a blocking call (a gloo rendezvous or broadcast) in a daemon thread; a future of its result.

    Unlike ``asyncio.to_thread`` the thread never holds up interpreter or event-loop shutdown: a collective
    whose peer never came is bounded by its own timeout and then dropped.
    """
    loop = asyncio.get_running_loop()
    future: asyncio.Future[T] = loop.create_future()

    def settle(result: Any, error: BaseException | None) -> None:
        if future.done():
            return
        if error is not None:
            future.set_exception(error)
        else:
            future.set_result(result)

    def target() -> None:
        try:
            result, error = fn(*args), None
        except BaseException as exc:  # handed to the awaiting task
            result, error = None, exc
        try:
            loop.call_soon_threadsafe(settle, result, error)
        except RuntimeError:  # the loop is gone: nobody is waiting any more
            pass

    threading.Thread(target=target, name=f"reference-{getattr(fn, '__name__', 'call')}", daemon=True).start()
    return future


def _failure(task: "asyncio.Future[Any]") -> BaseException | None:
    return asyncio.CancelledError() if task.cancelled() else task.exception()


async def gather_all(*aws: Awaitable[Any]) -> list[Any]:
    """All results in order, once every awaitable finished; raises the earliest failure (the others as notes).

    Engine calls are never abandoned half-way: an engine is not resumed while its update is still running.
    The earliest failure is usually the cause (an engine refused), later ones its effects (peers timing out).
    """
    tasks = [asyncio.ensure_future(a) for a in aws]
    if not tasks:
        return []
    finished: list[asyncio.Future[Any]] = []
    for task in tasks:
        task.add_done_callback(finished.append)
    try:
        await asyncio.wait(tasks)
    except BaseException:  # we were cancelled: leave no orphan behind
        for task in tasks:
            task.cancel()
        raise
    errors = [e for e in map(_failure, finished) if e is not None]
    if errors:
        for other in errors[1:]:
            errors[0].add_note(f"also failed: {other!r}")
        raise errors[0]
    return [t.result() for t in tasks]


async def gather_or_cancel(*aws: Awaitable[Any]) -> list[Any]:
    """All results in order; on the first failure cancel the rest, wait for them, and raise that failure."""
    tasks = [asyncio.ensure_future(a) for a in aws]
    try:
        return list(await asyncio.gather(*tasks))
    except BaseException:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        raise


async def settle_all(aws: Iterable[Awaitable[Any]]) -> list[BaseException]:
    """Run every awaitable to completion concurrently; the exceptions they raised (cleanup paths)."""
    results = await asyncio.gather(*aws, return_exceptions=True)
    return [r for r in results if isinstance(r, BaseException)]
