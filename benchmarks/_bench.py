"""Shared bits of the benchmark scripts: repo on sys.path, argument parsing, deadlines, the result table."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import sys
import time
from pathlib import Path
from typing import Any, Awaitable, Callable, Sequence, TypeVar

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:  # `python benchmarks/<name>.py` from anywhere
    sys.path.insert(0, str(REPO))

T = TypeVar("T")


def parser(description: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--quick", action="store_true", help="short smoke mode (< 10 s)")
    return p


def machine() -> str:
    return f"python {platform.python_version()}, {platform.machine()}, {os.cpu_count()} CPUs"


def new_loop() -> asyncio.AbstractEventLoop:
    """The loop the fakes use (uvloop when installed)."""
    from fakes.serving import new_event_loop

    return new_event_loop()


def run(coro: Awaitable[T]) -> T:
    """Run ``coro`` to completion on a fresh (uv)loop."""
    loop = new_loop()
    try:
        asyncio.set_event_loop(loop)
        return loop.run_until_complete(coro)
    finally:
        asyncio.set_event_loop(None)
        loop.close()


async def bounded(aw: Awaitable[T], seconds: float, what: str) -> T:
    """``await aw`` with a deadline (every wait in the benchmarks has one)."""
    try:
        return await asyncio.wait_for(aw, seconds)
    except asyncio.TimeoutError:
        raise TimeoutError(f"{what}: no result within {seconds} s") from None


class Timer:
    def __enter__(self) -> "Timer":
        self.t0 = time.perf_counter()
        return self

    def __exit__(self, *exc: object) -> None:
        self.seconds = time.perf_counter() - self.t0


def fmt(value: Any) -> str:
    if isinstance(value, float):
        if value == 0 or abs(value) >= 100:
            return f"{value:,.0f}"
        if abs(value) >= 1:
            return f"{value:,.2f}"
        return f"{value:.3f}"
    if isinstance(value, int):
        return f"{value:,}"
    return str(value)


def table(title: str, header: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """A small fixed-width table (markdown-compatible pipes)."""
    cells = [[str(h) for h in header]] + [[fmt(v) for v in row] for row in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(header))]

    def line(r: Sequence[str]) -> str:
        return "| " + " | ".join(c.rjust(w) if i else c.ljust(w) for i, (c, w) in enumerate(zip(r, widths))) + " |"

    out = [f"## {title}", "", line(cells[0]), "|" + "|".join("-" * (w + 2) for w in widths) + "|"]
    out += [line(r) for r in cells[1:]]
    return "\n".join(out)


def emit(text: str) -> None:
    sys.stdout.write(text + "\n")
    sys.stdout.flush()


def repeat_best(fn: Callable[[], float], times: int) -> float:
    """Best of ``times`` runs of ``fn`` (a rate: higher is better)."""
    return max(fn() for _ in range(times))


GENERATE_BODY = json.dumps({"text": "benchmark prompt", "sampling_params": {"max_new_tokens": 4}}).encode()
"""A short ``/generate`` (4 tokens): the round trip, not the decode, is what it measures."""


async def generate_rate(url: str, seconds: float, concurrency: int, timeout_s: float) -> float:
    """Completed ``/generate`` calls (:data:`GENERATE_BODY`) per second at ``concurrency`` for ``seconds``, after one
    warm-up call per worker; each call bounded by ``timeout_s``."""
    import aiohttp

    headers = {"content-type": "application/json"}
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
        async def call() -> None:
            async with session.post(url + "/generate", data=GENERATE_BODY, headers=headers) as r:
                body = await r.read()
                if r.status != 200:
                    raise RuntimeError(f"HTTP {r.status}: {body[:200]!r}")

        await bounded(asyncio.gather(*(call() for _ in range(concurrency))), timeout_s, "warm-up")
        done, end = 0, time.perf_counter() + seconds

        async def worker() -> None:
            nonlocal done
            while time.perf_counter() < end:
                await bounded(call(), timeout_s, "a /generate call")
                done += 1

        t0 = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        return done / (time.perf_counter() - t0)

