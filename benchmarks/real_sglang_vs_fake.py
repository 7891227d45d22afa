"""Real SGLang on CPU vs the fake, in one run: decode tokens/s, and ``/generate`` round trips/s through the recording
proxy (``gpu.proxy.RecordingProxy``) and straight to each engine.

Both engines serve the same tiny Llama (``gpu.tiny_model``) with the same launch line (``gpu.sglang_cpu.CPU_FLAGS``):
real SGLang from its CPU environment (``python -m gpu.sglang_cpu install --release R``), the fake as the drop-in
``python -m fakes.launch_server`` (``--fake-tokens-per-second``, default 1000: the Ray backend's setting). One engine
runs at a time. Decode: greedy ``input_ids`` requests with ``ignore_eos``, 1 and 8 at once, tokens/s =
completion tokens / wall time. Round trips: aiohttp, ``--concurrency`` workers, ``max_new_tokens`` 4, direct and
proxied rounds alternated. Ratios: real / fake, proxied / direct.

    python benchmarks/real_sglang_vs_fake.py [--quick] [--release R] [--seconds 5] [--tokens 256]
"""

from __future__ import annotations

import asyncio
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import _bench

from conformance.wire import WireLog
from fakes.facts import SGLANG as SGLANG_FACTS
from gpu.engine import EngineProcess
from gpu.launch import FAKE, SGLANG, EngineSpec
from gpu.proxy import RecordingProxy
from gpu.sglang_cpu import CPU_ENV, CPU_FLAGS, python_of, status

HEADERS = {"content-type": "application/json"}
CALL_TIMEOUT_S = 600.0


async def decode_rate(url: str, tokens: int, parallel: int) -> float:
    """Completion tokens per second of ``parallel`` greedy requests of ``tokens`` tokens each."""
    import aiohttp

    body = json.dumps({"input_ids": [5, 6, 7, 8], "sampling_params": {
        "max_new_tokens": tokens, "temperature": 0, "ignore_eos": True}}).encode()
    async with aiohttp.ClientSession() as session:
        async def one() -> int:
            async with session.post(url + "/generate", data=body, headers=HEADERS) as r:
                answer = await r.json()
                if r.status != 200:
                    raise RuntimeError(f"HTTP {r.status}: {answer}")
                return int(answer["meta_info"]["completion_tokens"])

        t0 = time.perf_counter()
        done = await _bench.bounded(asyncio.gather(*(one() for _ in range(parallel))), CALL_TIMEOUT_S, "decode")
        return sum(done) / (time.perf_counter() - t0)


async def round_trips(url: str, seconds: float, concurrency: int) -> float:
    """Completed ``/generate`` calls (4 tokens) per second at ``concurrency`` for ``seconds``."""
    return await _bench.generate_rate(url, seconds, concurrency, CALL_TIMEOUT_S)


def measure(engine: EngineProcess, tokens: int, seconds: float, rounds: int, concurrency: int) -> dict[str, float]:
    started = time.perf_counter()
    engine.start(health_timeout_s=300)
    figures = {"start_s": time.perf_counter() - started}
    proxy = RecordingProxy(engine.url, 0, WireLog()).start()
    try:
        figures["decode 1"] = _bench.run(decode_rate(engine.url, tokens, 1))
        figures["decode 8"] = _bench.run(decode_rate(engine.url, tokens, 8))
        direct, proxied = [], []
        for _ in range(rounds):
            direct.append(_bench.run(round_trips(engine.url, seconds, concurrency)))
            proxied.append(_bench.run(round_trips(proxy.url, seconds, concurrency)))
        figures["direct"], figures["proxied"] = statistics.median(direct), statistics.median(proxied)
    finally:
        proxy.stop()
        engine.stop()
    return figures


def main() -> int:
    p = _bench.parser(__doc__.splitlines()[0])
    p.add_argument("--release", default=SGLANG_FACTS.default_release,
                   help=f"the real SGLang release (default {SGLANG_FACTS.default_release})")
    p.add_argument("--venv", type=Path, help="the release's real-SGLang environment (default: the installer's)")
    p.add_argument("--seconds", type=float, default=5.0, help="measured seconds per round-trip round (default 5)")
    p.add_argument("--rounds", type=int, default=2, help="alternating direct/proxied rounds (default 2)")
    p.add_argument("--concurrency", type=int, default=8, help="round-trip workers (default 8)")
    p.add_argument("--fake-tokens-per-second", default="1000")
    p.add_argument("--tokens", type=int, default=256, help="tokens per decode request (default 256)")
    args = p.parse_args()
    env = status(args.release, args.venv, import_check=False)
    if not env.usable:
        print(f"real_sglang_vs_fake: {env.reason}", file=sys.stderr)
        return 2
    tokens, seconds, rounds = (64, 1.0, 1) if args.quick else (args.tokens, args.seconds, args.rounds)
    started = time.perf_counter()
    from gpu.tiny_model import write_model

    with tempfile.TemporaryDirectory(prefix="weightsync-bench-") as tmp:
        model = str(write_model(Path(tmp) / "model"))
        flags = tuple(f for f in CPU_FLAGS if f != "--disable-cuda-graph")
        fake = EngineProcess(EngineSpec(model, extra_args=flags, fake_args=(
            "--fake-profile", args.release, "--fake-tokens-per-second", args.fake_tokens_per_second)),
            FAKE, name="bench-fake")
        real = EngineProcess(EngineSpec(model, extra_args=flags), SGLANG, env=CPU_ENV, name="bench-sglang",
                             python=str(python_of(env.venv)))
        f = measure(fake, tokens, seconds, rounds, args.concurrency)
        r = measure(real, tokens, seconds, rounds, args.concurrency)
    print(f"# real SGLang {args.release} on CPU vs the fake ({_bench.machine()}; decode {tokens} tokens; "
          f"round trips: {rounds} round(s) of {seconds:g} s at concurrency {args.concurrency})")
    print("| figure | real SGLang | fake | real / fake |")
    print("|---|---:|---:|---:|")
    rows = (("engine start, s", "start_s"), ("decode tokens/s, 1 request", "decode 1"),
            ("decode tokens/s, 8 requests", "decode 8"), ("/generate round trips/s, direct", "direct"),
            ("/generate round trips/s, through the proxy", "proxied"))
    for label, key in rows:
        print(f"| {label} | {r[key]:,.1f} | {f[key]:,.1f} | {r[key] / f[key]:.3f} |")
    print(f"proxied / direct: real {r['proxied'] / r['direct']:.2f}, fake {f['proxied'] / f['direct']:.2f}")
    print(f"real SGLang decodes at {r['decode 1'] / f['decode 1']:.2f} of the fake's rate "
          f"(--fake-tokens-per-second {args.fake_tokens_per_second}); through the proxy it serves "
          f"{r['proxied'] / f['proxied']:.3f} of the fake's round trips")
    print(f"total time: {time.perf_counter() - started:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
