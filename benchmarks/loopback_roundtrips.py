"""Loopback round trips per second: the fake's POST /generate vs a bare hello-world ASGI app on the same stack.

Concurrency 64 (64 workers, one keep-alive connection each). Both apps run on the same server stack
(``fakes.server.uvicorn_config``: uvloop + httptools, no access log) in the same placement:

* ``process`` — ``LoopbackServer(mode="process")``, i.e. ``python -m fakes`` in its own process (the hello-world
  app through the CLI's hidden ``--hello-world`` flag, same code path, same uvicorn settings);
* ``thread``  — ``LoopbackServer(mode="thread")``: uvicorn in a daemon thread of the client's process;
* ``in-process`` — ``httpx.ASGITransport`` (no sockets; the app runs in the client's loop).

Clients: aiohttp and httpx.AsyncClient, on a uvloop loop. Each measurement warms up (5 requests per worker),
then runs at most ``--requests`` requests or ``--seconds`` seconds, whichever ends first.

The fake engine: profile 0.5.23, ``--tokens-per-second 1000`` (real-time ticker, 1 ms per decode step),
``max_running_requests`` 64, requests ``{"text": "benchmark prompt", "sampling_params": {"max_new_tokens": 4}}``:
each request spends ~4 ms in decode, batched with every other in-flight request, so the decode-bound ceiling
is 64 / 4 ms = 16,000 round trips/s — far above what is measured: the figure is the cost of the HTTP path,
validation, the scheduler, the ticker and delivery, i.e. what a test pays per /generate.

    python benchmarks/loopback_roundtrips.py [--quick] [--requests 3000] [--seconds 4]
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from typing import Any, Awaitable, Callable, Iterator

import _bench

from fakes import FakeEngine, LoopbackServer
from fakes.__main__ import hello_world_app

CONCURRENCY = 64
TOKENS_PER_SECOND = 1000.0
MAX_NEW_TOKENS = 4
PAYLOAD = json.dumps({"text": "benchmark prompt", "sampling_params": {"max_new_tokens": MAX_NEW_TOKENS}}).encode()
HEADERS = {"content-type": "application/json"}
WARMUP_PER_WORKER = 5
CALL_TIMEOUT_S = 10.0


def _check(app: str, status: int, body: bytes) -> None:
    if status != 200:
        raise RuntimeError(f"{app}: HTTP {status}: {body[:200]!r}")


def _check_fake_body(body: bytes) -> None:
    answer = json.loads(body)
    if answer["meta_info"]["completion_tokens"] != MAX_NEW_TOKENS:
        raise RuntimeError(f"unexpected /generate answer: {answer}")


async def _drive(one: Callable[[], Awaitable[None]], requests: int, seconds: float) -> tuple[int, float]:
    """``CONCURRENCY`` workers calling ``one`` until ``requests`` are done or ``seconds`` passed."""

    async def warm() -> None:
        for _ in range(WARMUP_PER_WORKER):
            await one()

    await _bench.bounded(asyncio.gather(*(warm() for _ in range(CONCURRENCY))), 60.0, "warm-up")
    budget = requests
    deadline = time.perf_counter() + seconds
    done = 0

    async def worker() -> None:
        nonlocal budget, done
        while budget > 0 and time.perf_counter() < deadline:
            budget -= 1
            await one()
            done += 1

    t0 = time.perf_counter()
    await _bench.bounded(asyncio.gather(*(worker() for _ in range(CONCURRENCY))), seconds + 30.0, "measurement")
    return done, time.perf_counter() - t0


async def _aiohttp(url: str, app: str, requests: int, seconds: float) -> tuple[int, float]:
    import aiohttp

    timeout = aiohttp.ClientTimeout(total=CALL_TIMEOUT_S)
    connector = aiohttp.TCPConnector(limit=CONCURRENCY)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        async def one() -> None:
            async with session.post(url + "/generate", data=PAYLOAD, headers=HEADERS) as resp:
                _check(app, resp.status, await resp.read())

        async with session.post(url + "/generate", data=PAYLOAD, headers=HEADERS) as resp:
            body = await resp.read()
            _check(app, resp.status, body)
            if app == "fake":
                _check_fake_body(body)
        return await _drive(one, requests, seconds)


async def _httpx(url: str, app: str, requests: int, seconds: float, transport: Any = None) -> tuple[int, float]:
    import httpx

    limits = httpx.Limits(max_connections=CONCURRENCY, max_keepalive_connections=CONCURRENCY)
    async with httpx.AsyncClient(base_url=url, limits=limits, timeout=CALL_TIMEOUT_S, transport=transport) as client:
        async def one() -> None:
            resp = await client.post("/generate", content=PAYLOAD, headers=HEADERS)
            _check(app, resp.status_code, resp.content)

        resp = await client.post("/generate", content=PAYLOAD, headers=HEADERS)
        _check(app, resp.status_code, resp.content)
        if app == "fake":
            _check_fake_body(resp.content)
        return await _drive(one, requests, seconds)


@contextlib.contextmanager
def _server(placement: str, app: str) -> Iterator[str]:
    """The base URL of ``app`` ("fake" or "hello") served in ``placement`` ("process" or "thread")."""
    if placement == "process":
        cli = ["--engines", "1", "--tokens-per-second", str(TOKENS_PER_SECOND), "--max-running-requests",
               str(CONCURRENCY)] + (["--hello-world"] if app == "hello" else [])
        server = LoopbackServer(mode="process", cli_args=cli)
    elif app == "hello":
        server = LoopbackServer(hello_world_app)
    else:
        server = LoopbackServer(factory=lambda: FakeEngine(tokens_per_second=TOKENS_PER_SECOND,
                                                           max_running_requests=CONCURRENCY).app)
    with server:
        yield server.url


def _in_process_app(app: str) -> Any:
    if app == "hello":
        return hello_world_app, None
    engine = FakeEngine(tokens_per_second=TOKENS_PER_SECOND, max_running_requests=CONCURRENCY)
    return engine.app, engine


def measure(placement: str, client: str, app: str, requests: int, seconds: float) -> tuple[int, float]:
    if placement == "in-process":
        import httpx

        asgi, engine = _in_process_app(app)

        async def go() -> tuple[int, float]:
            try:
                return await _httpx("http://fake", app, requests, seconds, transport=httpx.ASGITransport(app=asgi))
            finally:
                if engine is not None:
                    await engine.aclose()

        return _bench.run(go())
    with _server(placement, app) as url:
        run = _aiohttp if client == "aiohttp" else _httpx
        return _bench.run(run(url, app, requests, seconds))


def main(argv: list[str] | None = None) -> int:
    p = _bench.parser(__doc__.splitlines()[0])
    p.add_argument("--requests", type=int, default=None, help="max requests per measurement (default 3000; quick 600)")
    p.add_argument("--seconds", type=float, default=None, help="max seconds per measurement (default 4; quick 1)")
    args = p.parse_args(argv)
    requests = args.requests or (600 if args.quick else 3000)
    seconds = args.seconds or (1.0 if args.quick else 4.0)
    t_start = time.perf_counter()
    combos = [("process", "aiohttp")]
    if not args.quick:
        combos += [("thread", "aiohttp"), ("process", "httpx"), ("thread", "httpx"), ("in-process", "httpx")]

    rows = []
    headline: tuple[float, float] | None = None
    for placement, client in combos:
        rates = {}
        counts = {}
        for app in ("hello", "fake"):
            n, secs = measure(placement, client, app, requests, seconds)
            rates[app], counts[app] = n / secs, n
        ratio = rates["fake"] / rates["hello"]
        transport = "httpx.ASGITransport" if placement == "in-process" else client
        rows.append([placement, transport, counts["fake"], rates["fake"], counts["hello"], rates["hello"], ratio])
        if headline is None:
            headline = (rates["fake"], ratio)

    _bench.emit(_bench.table(
        f"loopback round trips/s at concurrency {CONCURRENCY} ({_bench.machine()})",
        ["server placement", "client", "fake n", "fake /generate rt/s", "hello n", "hello-world rt/s",
         "ratio fake/hello"],
        rows,
    ))
    _bench.emit("")
    assert headline is not None
    _bench.emit(f"fake /generate (process + aiohttp): {headline[0]:,.0f} round trips/s, "
                f"ratio to hello-world {headline[1]:.2f} (targets: >= 1,000 and >= 0.5)")
    _bench.emit(f"fake config: tokens_per_second={TOKENS_PER_SECOND:g}, max_new_tokens={MAX_NEW_TOKENS}, "
                f"max_running_requests={CONCURRENCY}, profile 0.5.23")
    _bench.emit(f"total time: {time.perf_counter() - t_start:.1f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
