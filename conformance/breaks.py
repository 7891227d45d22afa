"""How a run breaks: the integration lacks a capability (skip), a call hangs, a situation never comes, an update
fails unexpectedly; and the bounded call into the integration that raises a hang. Every wait has a deadline (the
waits for situations: :mod:`conformance.situations.waiting`)."""

from __future__ import annotations

import asyncio
import time
from typing import Awaitable, Protocol, TypeVar

from .history import Breakage, OpenCall, WireCall
from .situations.timing import CANCEL_GRACE_S

T = TypeVar("T")


class WireLog(Protocol):
    """What a run's break reads of the wire (:class:`conformance.wire.WireLog`)."""

    def open_calls(self) -> list[WireCall]: ...


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
