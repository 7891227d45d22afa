"""Proxy overhead: ``/generate`` round trips per second through the Ray backend's recording proxy vs straight to
the engine, in the same run.

The engine is ``python -m fakes.launch_server`` in its own process, started by the backend's supervisor
(``gpu.engine.EngineProcess``) with the launch line the Ray backend uses (built-in tiny model,
``--fake-tokens-per-second 1000``). The proxy is ``gpu.proxy.RecordingProxy`` (``WireRecorder`` around the
forwarding app, uvicorn in a thread of the client's process, as in the driver). Client: aiohttp on a uvloop loop,
64 workers with one keep-alive connection each, requests ``{"text": ..., "sampling_params": {"max_new_tokens":
4}}``. Direct and proxied rounds alternate (``--rounds``); medians are reported, and their ratio.

    python benchmarks/proxy_overhead.py [--quick] [--seconds 2] [--rounds 3]
"""

from __future__ import annotations

import statistics
import time

import _bench

from conformance.wire import WireLog
from gpu.engine import EngineProcess
from gpu.launch import FAKE, EngineSpec
from gpu.proxy import RecordingProxy

CONCURRENCY = 64
CALL_TIMEOUT_S = 10.0


async def round_trips(url: str, seconds: float) -> float:
    """Completed /generate calls per second at CONCURRENCY for ``seconds`` (after a short warm-up)."""
    return await _bench.generate_rate(url, seconds, CONCURRENCY, CALL_TIMEOUT_S)


def main() -> None:
    p = _bench.parser(__doc__.splitlines()[0])
    p.add_argument("--seconds", type=float, default=2.0, help="measured seconds per round (default 2)")
    p.add_argument("--rounds", type=int, default=3, help="alternating direct/proxied rounds (default 3)")
    args = p.parse_args()
    seconds, rounds = (0.5, 1) if args.quick else (args.seconds, args.rounds)
    started = time.perf_counter()
    spec = EngineSpec(model_path="fake-sglang/tiny-llama", fake_args=("--fake-tokens-per-second", "1000"))
    engine = EngineProcess(spec, FAKE, name="benchmark-engine")
    engine.start(health_timeout_s=30)
    wire = WireLog()
    proxy = RecordingProxy(engine.url, 0, wire).start()
    rates: dict[str, list[float]] = {"direct": [], "proxied": []}
    try:
        for _ in range(rounds):
            rates["direct"].append(_bench.run(round_trips(engine.url, seconds)))
            rates["proxied"].append(_bench.run(round_trips(proxy.url, seconds)))
    finally:
        proxy.stop()
        engine.stop()
    direct, proxied = statistics.median(rates["direct"]), statistics.median(rates["proxied"])
    print(f"# proxy overhead ({_bench.machine()}; {rounds} round(s) of {seconds:g} s, concurrency {CONCURRENCY})")
    print("| path | round trips/s (median) | rounds |")
    print("|---|---:|---|")
    print(f"| baseline: straight to the engine | {direct:,.0f} | {', '.join(f'{r:,.0f}' for r in rates['direct'])} |")
    print(f"| through the recording proxy | {proxied:,.0f} | {', '.join(f'{r:,.0f}' for r in rates['proxied'])} |")
    print(f"recorded calls: {wire.completed()}")
    print(f"proxied /generate: {proxied:,.0f} round trips/s, ratio to direct {proxied / direct:.2f}")
    print(f"total time: {time.perf_counter() - started:.1f} s")


if __name__ == "__main__":
    main()
