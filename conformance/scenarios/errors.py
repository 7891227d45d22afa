"""How a run breaks: the integration lacks a capability (skip), a call hangs, a situation never comes, an update
fails unexpectedly; and the bounded waits that raise them. Every wait has a deadline."""

from __future__ import annotations

import asyncio
import time
from typing import Awaitable, Callable, TypeVar

from ..history import Breakage, OpenCall
from ..wire import WireLog

CANCEL_GRACE_S = 2.0
"""How long a cancelled call into the integration may take to stop before the run goes on without it."""
T = TypeVar("T")


class Unsupported(Exception):
    """The integration lacks a capability the scenario needs (the test is skipped with this reason)."""


class RunBroken(Exception):
    """The run broke: the scenario stops there and every case of it fails (see :class:`Breakage`)."""

    kind = "error"

    def __init__(self, message: str, open_calls: list[OpenCall] | None = None) -> None:
        super().__init__(message)
        self.t = time.monotonic()
        self.open_calls = open_calls

    def breakage(self, wire: WireLog) -> Breakage:
        return Breakage(self.kind, str(self), self.t, self.open_calls if self.open_calls is not None
                        else open_calls(wire))


class UnexpectedUpdateFailure(RunBroken):
    """An update the scenario expected to succeed failed (the cycle is recorded)."""


class Hang(RunBroken):
    """A call into the integration did not return within its deadline."""

    kind = "hang"


class ScenarioTimeout(RunBroken):
    """The situation a scenario waited for did not come within its deadline."""

    kind = "timeout"


def open_calls(wire: WireLog) -> list[OpenCall]:
    """What is still waiting for an answer on the wire right now."""
    return [OpenCall(c.engine, c.method, c.path, c.t_start, c.origin) for c in wire.open_calls()]


async def bounded(coro: Awaitable[T], timeout_s: float, what: str, wire: WireLog,
                  broken: type[RunBroken] | None = None) -> T:
    """Await ``coro`` for at most ``timeout_s``; past it, raise ``broken`` (:class:`Hang` by default) naming
    ``what`` and the calls open on the wire at that moment (taken before the call is cancelled, which closes
    them)."""
    task = asyncio.ensure_future(coro)
    done, _ = await asyncio.wait({task}, timeout=timeout_s)
    if not done:
        stuck = open_calls(wire)
        task.cancel()
        await asyncio.wait({task}, timeout=CANCEL_GRACE_S)  # an integration may swallow the cancellation
        raise (broken or Hang)(f"{what} did not return within {timeout_s:g}s", stuck)
    return task.result()


async def wait_for_condition(predicate: Callable[[], bool], timeout_s: float, what: str,
                             between: Callable[[], Awaitable[None]] | None = None) -> None:
    """Poll ``predicate`` until true (awaiting ``between`` after each false poll); raise ScenarioTimeout naming
    ``what`` at the deadline."""
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise ScenarioTimeout(f"timed out after {timeout_s:.0f}s waiting for {what}")
        if between is not None:
            await between()
        await asyncio.sleep(0.005)
