"""The one wait of the situations, the wire holds and the teardown: until a condition holds, bounded, woken by the
wire.

A wait looks at its condition whenever a call the wire records is sent or answered (``wake``: a
:meth:`~conformance.wire.WireLog.listen`), and every :data:`~conformance.situations.timing.TICK_S` for conditions
that come true with time alone (a request open long enough, a quiet spell). Its bound counts the time it waited on
its ``clock`` (the wire log's, injectable), each wake at most :data:`~conformance.situations.timing.STEP_S`: on a
starved machine (two real engines on two cores) a process is not scheduled for seconds at a time, and a bound read
off the wall clock would be used up while nothing was looked at, and end in the instant the loop runs again, before
what it waits for was read (real vLLM 0.32.0 in CI: a held pause went on after 8.7 s of a 5.5 s bound, in the
millisecond the long-lived request its engine held ended)."""

from __future__ import annotations

import asyncio
import time
from typing import Awaitable, Callable

from ..breaks import ScenarioTimeout
from ..history import WireCall
from .timing import STEP_S, TICK_S

Listen = Callable[[Callable[[WireCall, bool], None]], Callable[[], None]]
"""A wire log's ``listen``: registers a listener, returns the function that removes it."""


async def wait_until(condition: Callable[[], bool], bound_s: float, *, wake: Listen | None = None,
                     clock: Callable[[], float] = time.monotonic, standing: Callable[[], bool] = lambda: True,
                     restart: Callable[[], bool] | None = None,
                     between: Callable[[], Awaitable[None]] | None = None) -> bool:
    """Wait until ``condition()`` holds, while ``standing()``, for at most ``bound_s`` of waiting (counted from 0
    again while ``restart()`` holds), awaiting ``between`` after each look that found it false (its time counts in
    full); whether it held."""
    loop, woken = asyncio.get_running_loop(), asyncio.Event()

    def on_call(_call: WireCall, _answered: bool) -> None:
        try:
            loop.call_soon_threadsafe(woken.set)
        except RuntimeError:  # the loop is closed: nothing waits any more
            pass
    stop = wake(on_call) if wake is not None else (lambda: None)
    waited = 0.0
    try:
        while not (met := condition()) and standing() and waited < bound_s:
            if between is not None:  # work done meanwhile (a batch consumed) counts in full
                began = clock()
                await between()
                waited += clock() - began
            woken.clear()
            last = clock()
            try:
                await asyncio.wait_for(woken.wait(), TICK_S)
            except TimeoutError:
                pass
            waited = 0.0 if restart is not None and restart() else waited + min(clock() - last, STEP_S)
    finally:
        stop()
    return met


async def wait_for(condition: Callable[[], bool], timeout_s: float, what: str, *, wake: Listen | None = None,
                   between: Callable[[], Awaitable[None]] | None = None) -> None:
    """:func:`wait_until`, or raise :class:`~conformance.breaks.ScenarioTimeout` naming ``what``: a situation a
    scenario needs that never came breaks the run."""
    if not await wait_until(condition, timeout_s, wake=wake, between=between):
        raise ScenarioTimeout(f"timed out after {timeout_s:.0f}s waiting for {what}")
