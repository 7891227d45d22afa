"""In-process decode throughput of one FakeEngine (manual clock): token-steps per second with many requests in flight.

Submits R /generate requests through the engine's own ASGI app in-process (no sockets, no HTTP client: a bare
ASGI receive/send pair), waits until the scheduler holds all of them, admits them with one step, then times N
``await engine.step()`` calls. Baselines in the same run: the same engine with 1 request in flight, and a bare
Python loop doing the minimal per-token work (appending one int to each request's list).

    python benchmarks/decode_throughput.py [--quick] [--requests 1000] [--steps 300]
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import _bench

from fakes import FakeEngine

DEADLINE_S = 30.0


async def _asgi_generate(app: Any, body: bytes, done: asyncio.Event) -> int:
    """One POST /generate straight into the ASGI app; returns the status. The client 'disconnects' (receive
    answers http.disconnect) only once ``done`` is set, like a client waiting for its answer."""
    sent: list[dict] = []
    first = True

    async def receive() -> dict:
        nonlocal first
        if first:
            first = False
            return {"type": "http.request", "body": body, "more_body": False}
        await done.wait()
        return {"type": "http.disconnect"}

    async def send(message: dict) -> None:
        sent.append(message)

    scope = {"type": "http", "method": "POST", "path": "/generate", "query_string": b"",
             "headers": [(b"content-type", b"application/json")]}
    await app(scope, receive, send)
    return sent[0]["status"] if sent else 0


async def engine_rate(requests: int, steps: int) -> dict[str, float]:
    """Token-steps/s and steps/s of ``steps`` decode iterations with ``requests`` in flight."""
    engine = FakeEngine(tokens_per_second=None, max_running_requests=max(requests, 1))
    app = engine.app
    done = asyncio.Event()
    body = json.dumps({"text": "benchmark prompt", "sampling_params": {"max_new_tokens": steps + 10}}).encode()
    tasks = [asyncio.ensure_future(_asgi_generate(app, body, done)) for _ in range(requests)]
    try:
        await engine.wait_until(lambda: len(engine.scheduler.waiting) >= requests, timeout=DEADLINE_S)
        await engine.step()  # admit + prefill every request (not timed)
        assert len(engine.scheduler.running) == requests, engine.snapshot()
        tokens = 0
        durations = []
        clock = time.perf_counter
        t0 = clock()
        for _ in range(steps):
            t = clock()
            tokens += await engine.step()
            durations.append(clock() - t)
        seconds = clock() - t0
        assert tokens == requests * steps, (tokens, requests, steps)
    finally:
        engine.abort(abort_all=True)  # running requests finish with "abort" on the next step
        await engine.step(2)
        statuses = await _bench.bounded(asyncio.gather(*tasks), DEADLINE_S, "aborted /generate calls")
        done.set()
        await engine.aclose()
    assert all(s == 200 for s in statuses), statuses
    step_s = _median(durations)  # robust to other processes on the machine
    return {"tokens_per_s": requests / step_s, "steps_per_s": 1 / step_s, "mean_tokens_per_s": tokens / seconds}


def _median(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[len(ordered) // 2]


def bare_rate(requests: int, steps: int) -> dict[str, float]:
    """The floor: a Python loop appending one int per request per step."""
    lists: list[list[int]] = [[] for _ in range(requests)]
    durations = []
    clock = time.perf_counter
    t0 = clock()
    for _ in range(steps):
        t = clock()
        for ids in lists:
            ids.append(65)
        durations.append(clock() - t)
    seconds = clock() - t0
    step_s = _median(durations)
    mean = requests * steps / seconds
    return {"tokens_per_s": requests / step_s, "steps_per_s": 1 / step_s, "mean_tokens_per_s": mean}


def main(argv: list[str] | None = None) -> int:
    p = _bench.parser(__doc__.splitlines()[0])
    p.add_argument("--requests", type=int, default=None, help="requests in flight (default 1000; quick 1000)")
    p.add_argument("--steps", type=int, default=None, help="timed steps (default 1000; quick 50)")
    args = p.parse_args(argv)
    requests = args.requests or 1000
    steps = args.steps or (50 if args.quick else 1000)
    single_steps = steps * 10
    t_start = time.perf_counter()

    many = _bench.run(engine_rate(requests, steps))
    one = _bench.run(engine_rate(1, single_steps))
    bare = bare_rate(requests, steps)

    rows = [
        [f"FakeEngine, {requests} in flight", steps, many["tokens_per_s"], many["steps_per_s"],
         many["mean_tokens_per_s"], 1.0],
        ["baseline: FakeEngine, 1 in flight", single_steps, one["tokens_per_s"], one["steps_per_s"],
         one["mean_tokens_per_s"], many["tokens_per_s"] / one["tokens_per_s"]],
        [f"baseline: bare loop (append 1 int x {requests})", steps, bare["tokens_per_s"], bare["steps_per_s"],
         bare["mean_tokens_per_s"], many["tokens_per_s"] / bare["tokens_per_s"]],
    ]
    _bench.emit(_bench.table(
        f"decode throughput (in-process, manual clock; median step; {_bench.machine()})",
        ["case", "steps", "token-steps/s", "steps/s", "token-steps/s (mean)", f"ratio ({requests} in flight / case)"],
        rows,
    ))
    _bench.emit("")
    _bench.emit(f"token-steps/s with {requests} in flight: {many['tokens_per_s']:,.0f}; "
                f"vs 1 in flight: x{many['tokens_per_s'] / one['tokens_per_s']:.1f}; "
                f"vs bare loop: {many['tokens_per_s'] / bare['tokens_per_s']:.6f} "
                f"(per token: {1e6 / many['tokens_per_s']:.2f} us fake vs {1e6 / bare['tokens_per_s']:.3f} us bare)")
    _bench.emit(f"total time: {time.perf_counter() - t_start:.1f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
