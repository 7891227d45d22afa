"""Waiting on a condition with a bound that counts only the time the waiting loop ran.

On a starved machine (two real engines on two cores) a process is not scheduled for seconds at a time: a thread
sleeping 50 ms wakes up to 4 s late (real vLLM 0.32.0 in CI). A bound measured on the wall clock is then used up
while nothing was looked at, and a wait ends at its bound in the instant the loop runs again, before what it waits
for was read (real vLLM 0.32.0 in CI: a held pause went on after 8.7 s of a 5.5 s bound, in the millisecond the
long-lived request its engine held ended; answers held for a pause that drains went on as the drained request ended,
not as the pause answered a few milliseconds later). :func:`poll` counts each step at most :data:`POLL_STEP_S`
against the bound instead, so a wait gives up only after its loop has looked for that long. The wire control's holds
and the wait for the suite's long-lived requests use it.
"""

from __future__ import annotations

import asyncio
import time
from typing import Callable

POLL_STEP_S = 0.05
"""The most one step of polling counts against a bound."""


async def poll(condition: Callable[[], bool], bound_s: float, clock: Callable[[], float] = time.monotonic,
               standing: Callable[[], bool] = lambda: True, restart: Callable[[], bool] | None = None) -> bool:
    """Poll ``condition`` every millisecond while ``standing()``, for at most ``bound_s`` of polling (counted again
    from 0 while ``restart()`` is true); whether it came true. Each step counts at most :data:`POLL_STEP_S`."""
    polled, last = 0.0, clock()
    while not (met := condition()) and standing() and polled < bound_s:
        await asyncio.sleep(0.001)
        now = clock()
        polled = 0.0 if restart is not None and restart() else polled + min(now - last, POLL_STEP_S)
        last = now
    return met
