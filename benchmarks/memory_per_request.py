"""Memory per in-flight request in one FakeEngine (tracemalloc, in-process, manual clock).

Baseline: the same engine, empty (constructed, app built, bound to the loop). Then R /generate requests are
submitted through the engine's ASGI app in-process and measured in three states:

* parked   — the engine is paused (``/pause_generation`` mode ``abort``): every call waits at the pause gate;
* decoding — the gate is open, all R requests are running and have produced 1, then T tokens each
  (the difference gives the bytes per generated token);
* finished — every request has answered and its client is gone: what stays is the event log
  (``request.submit`` / ``admit`` / ``finish`` per request), reported as retained bytes per request.

    python benchmarks/memory_per_request.py [--quick] [--requests 10000] [--tokens 64]
"""

from __future__ import annotations

import asyncio
import gc
import json
import time
import tracemalloc
from typing import Any

import _bench

from fakes import FakeEngine

DEADLINE_S = 40.0


def _traced() -> int:
    gc.collect()
    return tracemalloc.get_traced_memory()[0]


class _Client:
    """One in-process ASGI /generate call whose answer is kept only as a status code (like a client that
    read and dropped its answer)."""

    def __init__(self, app: Any, body: bytes) -> None:
        self.done = asyncio.Event()
        self.status = 0
        self.task = asyncio.ensure_future(self._call(app, body))

    async def _call(self, app: Any, body: bytes) -> None:
        first = True

        async def receive() -> dict:
            nonlocal first
            if first:
                first = False
                return {"type": "http.request", "body": body, "more_body": False}
            await self.done.wait()
            return {"type": "http.disconnect"}

        async def send(message: dict) -> None:
            if message["type"] == "http.response.start":
                self.status = message["status"]
            elif not message.get("more_body", False):
                self.done.set()

        scope = {"type": "http", "method": "POST", "path": "/generate", "query_string": b"",
                 "headers": [(b"content-type", b"application/json")]}
        await app(scope, receive, send)


async def measure(requests: int, tokens: int) -> dict[str, float]:
    engine = FakeEngine(tokens_per_second=None, max_running_requests=requests)
    app = engine.app
    await engine.pause_generation({"mode": "abort"})  # bind to this loop, close the gate
    await engine.continue_generation({})
    base = _traced()

    await engine.pause_generation({"mode": "abort"})
    body = json.dumps({"text": "benchmark prompt", "sampling_params": {"max_new_tokens": tokens + 1}}).encode()
    clients = [_Client(app, body) for _ in range(requests)]
    await engine.wait_until(lambda: len(engine._parked) >= requests, timeout=DEADLINE_S)
    parked = _traced()

    await engine.continue_generation({})
    await engine.wait_until(lambda: len(engine.scheduler.waiting) >= requests, timeout=DEADLINE_S)
    await engine.step(1)  # admit + prefill + the first token
    assert len(engine.scheduler.running) == requests, engine.snapshot()
    admitted = _traced()
    await engine.step(tokens - 1)
    assert all(len(r.output_ids) == tokens for r in engine.scheduler.running)
    decoding = _traced()

    await engine.step(1)  # token tokens + 1 = max_new_tokens: every request finishes and answers
    await _bench.bounded(asyncio.gather(*(c.task for c in clients)), DEADLINE_S, "finished /generate calls")
    assert all(c.status == 200 for c in clients), {c.status for c in clients}
    del clients
    finished = _traced()
    events = len(engine.events)
    await engine.aclose()
    return {
        "parked": (parked - base) / requests,
        "admitted": (admitted - base) / requests,
        "decoding": (decoding - base) / requests,
        "finished": (finished - base) / requests,
        "events_per_request": events / requests,
        "base": base,
    }


async def measure_client_only(requests: int) -> float:
    """Bytes per request of this harness alone (the client task, its coroutine and Event): the same ``_Client``
    against a null ASGI app that reads the body and parks."""
    gate = asyncio.Event()

    async def null_app(scope: dict, receive: Any, send: Any) -> None:
        await receive()
        await gate.wait()
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"", "more_body": False})

    base = _traced()
    clients = [_Client(null_app, b"{}") for _ in range(requests)]
    for _ in range(3):
        await asyncio.sleep(0)
    parked = _traced()
    gate.set()
    await _bench.bounded(asyncio.gather(*(c.task for c in clients)), DEADLINE_S, "null-app calls")
    return (parked - base) / requests


def main(argv: list[str] | None = None) -> int:
    p = _bench.parser(__doc__.splitlines()[0])
    p.add_argument("--requests", type=int, default=None, help="requests in flight (default 10000; quick 1000)")
    p.add_argument("--tokens", type=int, default=None, help="tokens per request when measured (default 64; quick 16)")
    args = p.parse_args(argv)
    requests = args.requests or (1000 if args.quick else 10_000)
    tokens = args.tokens or (16 if args.quick else 64)
    t_start = time.perf_counter()

    tracemalloc.start()
    try:
        empty_engine = _traced()
        engine = FakeEngine(tokens_per_second=None)
        _ = engine.app
        empty_engine = _traced() - empty_engine
        del engine, _
        client_only = _bench.run(measure_client_only(requests))
        result = _bench.run(measure(requests, tokens))
    finally:
        tracemalloc.stop()

    per_token = (result["decoding"] - result["admitted"]) / (tokens - 1)
    def row(state: str, total: float, in_flight: bool = True) -> list[Any]:
        engine_side = total - client_only if in_flight else total
        return [state, total, engine_side, engine_side / empty_engine]

    rows = [
        ["baseline: empty engine (whole engine, once)", empty_engine, empty_engine, 1.0],
        [f"baseline: client harness only (null ASGI app, {requests} calls)", client_only, "-", "-"],
        row(f"parked at the pause gate ({requests} in flight)", result["parked"]),
        row(f"decoding, 1 token each ({requests} in flight)", result["admitted"]),
        row(f"decoding, {tokens} tokens each ({requests} in flight)", result["decoding"]),
        row("finished, client gone (retained: event log)", result["finished"], in_flight=False),
    ]
    _bench.emit(_bench.table(
        f"memory per request (tracemalloc; {_bench.machine()})",
        ["state", "bytes/request", "engine-side bytes/request (minus harness)", "ratio to an empty engine"],
        rows,
    ))
    _bench.emit("")
    _bench.emit(f"bytes/request: parked {result['parked'] - client_only:,.0f}, "
                f"decoding {result['decoding'] - client_only:,.0f} "
                f"(~{per_token:,.0f} B/token), retained after finish {result['finished']:,.0f} "
                f"({result['events_per_request']:.0f} events/request); engine side, without the "
                f"{client_only:,.0f} B/request of the client harness; empty engine {empty_engine:,.0f} B")
    _bench.emit(f"total time: {time.perf_counter() - t_start:.1f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
