"""Loopback round trips per second: the fake's POST /generate vs a bare hello-world ASGI app on the same stack.

Concurrency 64 (64 workers, one keep-alive connection each). Both apps run on the same server stack
(``fakes.serving.uvicorn_config``: uvloop + httptools, no access log, no proxy-headers middleware) in the same
placement:

* ``process`` — ``LoopbackServer(mode="process")``, i.e. ``python -m fakes`` in its own process (the hello-world
  app through the CLI's hidden ``--hello-world`` flag, same code path, same uvicorn settings);
* ``thread``  — ``LoopbackServer(mode="thread")``: uvicorn in a daemon thread of the client's process;
* ``in-process`` — ``httpx.ASGITransport`` (no sockets; the app runs in the client's loop).

Clients: aiohttp and httpx.AsyncClient, on a uvloop loop. Each measurement warms up (5 requests per worker),
then runs at most ``--requests`` requests or ``--seconds`` seconds, whichever ends first; hello-world and fake
rounds alternate (``--rounds``) and the medians are reported, with the server's CPU time per round trip (process
placement, from /proc).

The fake engine: its default profile (the newest release it knows), ``--tokens-per-second 1000`` (real-time ticker, 1 ms per decode step),
``max_running_requests`` 64, requests ``{"text": "benchmark prompt", "sampling_params": {"max_new_tokens": 4}}``:
each request spends ~4 ms in decode, batched with every other in-flight request, so the decode-bound ceiling
is 64 / 4 ms = 16,000 round trips/s — far above what is measured: the figure is the cost of the HTTP path,
validation, the scheduler, the ticker and delivery, i.e. what a test pays per /generate.

    python benchmarks/loopback_roundtrips.py [--quick] [--requests 3000] [--seconds 2] [--rounds 3]
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from typing import Any, Awaitable, Callable

import _bench

from fakes import FakeEngine, LoopbackServer
from fakes.facts import SGLANG
from fakes.cli import hello_world_app

CONCURRENCY = 64
TOKENS_PER_SECOND = 1000.0  # default of --tokens-per-second
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


def _proc_cpu_s(pid: int) -> float | None:
    """User + system CPU seconds of process ``pid`` so far (Linux /proc; None elsewhere)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return None


class Target:
    """One app ("fake" or "hello") served in one placement; ``measure`` runs one round of round trips."""

    def __init__(self, placement: str, app: str, tps: float) -> None:
        self.placement, self.app, self.tps = placement, app, tps
        self.server: LoopbackServer | None = None

    def __enter__(self) -> "Target":
        if self.placement == "process":
            cli = ["--engines", "1", "--tokens-per-second", str(self.tps), "--max-running-requests", str(CONCURRENCY)]
            hello = ["--hello-world"] if self.app == "hello" else []
            self.server = LoopbackServer(mode="process", cli_args=cli + hello)
        elif self.placement == "thread":
            if self.app == "hello":
                self.server = LoopbackServer(hello_world_app)
            else:
                tps = self.tps
                self.server = LoopbackServer(
                    factory=lambda: FakeEngine(tokens_per_second=tps, max_running_requests=CONCURRENCY).app)
        if self.server is not None:
            self.server.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self.server is not None:
            self.server.stop()

    def cpu_s(self) -> float | None:
        if self.server is None or self.server.process is None:
            return None
        return _proc_cpu_s(self.server.process.pid)

    def measure(self, client: str, requests: int, seconds: float) -> tuple[int, float]:
        if self.placement == "in-process":
            import httpx

            engine = None if self.app == "hello" else FakeEngine(tokens_per_second=self.tps,
                                                                   max_running_requests=CONCURRENCY)
            asgi = hello_world_app if engine is None else engine.app

            async def go() -> tuple[int, float]:
                try:
                    transport = httpx.ASGITransport(app=asgi)
                    return await _httpx("http://fake", self.app, requests, seconds, transport=transport)
                finally:
                    if engine is not None:
                        await engine.aclose()

            return _bench.run(go())
        assert self.server is not None
        run = _aiohttp if client == "aiohttp" else _httpx
        return _bench.run(run(self.server.url, self.app, requests, seconds))


def _median(values: list[float]) -> float:
    ordered = sorted(values)
    mid = len(ordered) // 2
    return ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2


def compare(placement: str, client: str, rounds: int, requests: int, seconds: float, tps: float) -> dict[str, Any]:
    """Alternate hello-world and fake rounds (so both see the same machine weather); medians per app."""
    rates: dict[str, list[float]] = {"hello": [], "fake": []}
    counts: dict[str, int] = {"hello": 0, "fake": 0}
    cpu_us: dict[str, list[float]] = {"hello": [], "fake": []}
    with Target(placement, "hello", tps) as hello, Target(placement, "fake", tps) as fake:
        for _ in range(rounds):
            for target in (hello, fake):
                before = target.cpu_s()
                n, secs = target.measure(client, requests, seconds)
                after = target.cpu_s()
                rates[target.app].append(n / secs)
                counts[target.app] += n
                if before is not None and after is not None and n:
                    cpu_us[target.app].append((after - before) / n * 1e6)  # includes the warm-up: an upper bound
    out: dict[str, Any] = {"counts": counts}
    for app in ("hello", "fake"):
        out[app] = _median(rates[app])
        out[app + "_range"] = (min(rates[app]), max(rates[app]))
        out[app + "_cpu_us"] = _median(cpu_us[app]) if cpu_us[app] else None
    out["ratio"] = out["fake"] / out["hello"]
    return out


def main(argv: list[str] | None = None) -> int:
    p = _bench.parser(__doc__.splitlines()[0])
    p.add_argument("--requests", type=int, default=None,
                   help="max requests per measurement (default 3000; quick 500)")
    p.add_argument("--seconds", type=float, default=None, help="max seconds per measurement (default 2; quick 1)")
    p.add_argument("--rounds", type=int, default=None,
                   help="alternating hello/fake rounds per combo (default 3; quick 1)")
    p.add_argument("--tokens-per-second", type=float, default=TOKENS_PER_SECOND,
                   help=f"the fake engine's decode speed (default {TOKENS_PER_SECOND:g})")
    p.add_argument("--combos", default=None,
                   help="comma-separated placement:client pairs (default: all; quick: process:aiohttp)")
    args = p.parse_args(argv)
    tps = args.tokens_per_second
    requests = args.requests or (500 if args.quick else 3000)
    seconds = args.seconds or (1.0 if args.quick else 2.0)
    rounds = args.rounds or (1 if args.quick else 3)
    if args.combos:
        combos = [tuple(c.split(":", 1)) for c in args.combos.split(",")]
    elif args.quick:
        combos = [("process", "aiohttp")]
    else:
        combos = [("process", "aiohttp"), ("thread", "aiohttp"), ("process", "httpx"), ("thread", "httpx"),
                  ("in-process", "httpx")]
    t_start = time.perf_counter()

    rows = []
    results = {}
    for placement, client in combos:
        r = compare(placement, client, rounds, requests, seconds, tps)
        results[(placement, client)] = r
        transport = "httpx.ASGITransport" if placement == "in-process" else client

        def cpu(value: float | None) -> str:
            return "n/a" if value is None else f"{value:,.0f}"

        rows.append([placement, transport, r["counts"]["fake"], r["fake"],
                     f"{r['fake_range'][0]:,.0f}-{r['fake_range'][1]:,.0f}", r["counts"]["hello"], r["hello"],
                     f"{r['hello_range'][0]:,.0f}-{r['hello_range'][1]:,.0f}", r["ratio"],
                     cpu(r["fake_cpu_us"]), cpu(r["hello_cpu_us"])])

    _bench.emit(_bench.table(
        f"loopback round trips/s at concurrency {CONCURRENCY}, median of {rounds} alternating round(s) "
        f"({_bench.machine()})",
        ["server placement", "client", "fake n", "fake /generate rt/s", "fake min-max", "hello n", "hello-world rt/s",
         "hello min-max", "ratio fake/hello", "fake server CPU us/rt", "hello server CPU us/rt"],
        rows,
    ))
    _bench.emit("")
    placement, client = combos[0]
    head = results[combos[0]]
    _bench.emit(f"fake /generate ({placement} + {client}): {head['fake']:,.0f} round trips/s, ratio to hello-world "
                f"{head['ratio']:.2f} (targets: >= 1,000 and >= 0.5)")
    _bench.emit(f"fake config: tokens_per_second={tps:g}, max_new_tokens={MAX_NEW_TOKENS}, "
                f"max_running_requests={CONCURRENCY}, profile {SGLANG.default_release}; server CPU per round trip from /proc "
                f"(process placement only; includes the warm-up)")
    _bench.emit(f"total time: {time.perf_counter() - t_start:.1f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
