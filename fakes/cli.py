"""`python -m fakes` (or the vendored package's name): fake SGLang engines (and a router in front of them) on
127.0.0.1, in one process.

(One engine per process, started with SGLang's own launch flags: `python -m fakes.launch_server`.)

Prints one URL per line once everything listens — the engines first, then the router — and serves until
SIGINT or SIGTERM, then shuts down cleanly and exits 0.

    python -m fakes --engines 2 --router --profile 0.5.23 --tokens-per-second 200
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from collections.abc import Callable
from typing import Any, NoReturn


class UsageParser(argparse.ArgumentParser):
    """An ArgumentParser whose usage errors are one line on stderr (`prog: error: what is wrong`), exit 2."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see --help)\n")


def build_parser() -> argparse.ArgumentParser:
    from .profiles import DEFAULT_PROFILE, PROFILES

    parser = UsageParser(
        prog=f"python -m {__package__ or 'fakes'}",
        description="Serve fake SGLang engines (and optionally a fake sglang router) on loopback. Prints one URL "
                    "per line (engines, then the router) when all listen; SIGINT/SIGTERM stops them (exit 0).",
    )
    parser.add_argument("--engines", type=int, default=1, metavar="E", help="number of fake engines (default 1)")
    parser.add_argument("--router", action="store_true", help="also serve a FakeRouter in front of the engines")
    parser.add_argument("--router-flavor", default="0.3.2", choices=("0.3.2", "spec"),
                        help="router behaviour: as measured on sglang-router 0.3.2 (default) or as the "
                             "sgl-model-gateway source reads")
    parser.add_argument("--policy", default="round_robin", choices=("round_robin", "random"),
                        help="router policy (default round_robin)")
    parser.add_argument("--profile", default=DEFAULT_PROFILE, choices=list(PROFILES),
                        help=f"SGLang version profile (default {DEFAULT_PROFILE})")
    parser.add_argument("--tokens-per-second", type=float, default=100.0, metavar="R",
                        help="decode speed of every request on the real-time clock (default 100)")
    parser.add_argument("--max-running-requests", type=int, default=64, metavar="N",
                        help="scheduler running-batch capacity per engine (default 64)")
    parser.add_argument("--enable-lora", action="store_true", help="accept LoRA adapter loads (--enable-lora)")
    parser.add_argument("--weight-version", default="default", help="initial weight version label (default "
                                                                     "'default', as --weight-version)")
    parser.add_argument("--model-path", default=None, metavar="DIR",
                        help="serve this model directory (config.json + safetensors/.bin weights) instead of the "
                             "built-in tiny model")
    parser.add_argument("--dtype", default="auto", choices=("auto", "half", "float16", "bfloat16", "float",
                                                            "float32"),
                        help="dtype the --model-path parameters are held in (default auto, as SGLang resolves it)")
    parser.add_argument("--strict-weights", action="store_true",
                        help="refuse updates naming parameters the model lacks and partial sharded checkpoints "
                             "(SGLang skips unknown names with a warning and loads what is there)")
    parser.add_argument("--host", default="127.0.0.1", help="interface to bind (default 127.0.0.1)")
    parser.add_argument("--port", type=int, default=0, metavar="P",
                        help="first port: engine i on P+i, the router on P+E; 0 (default) = OS-chosen ports")
    parser.add_argument("--seed", type=int, default=0, metavar="S", help="seed of weights, rids and faults")
    parser.add_argument("--faults", default=None, metavar="JSON",
                        help='fault plan for every engine, a JSON list of Fault fields, e.g. '
                             '\'[{"endpoint": "/flush_cache", "kind": "flush_fail", "times": 1}]\'')
    # Benchmarks only (benchmarks/loopback_roundtrips.py): serve a bare hello-world ASGI app instead of each
    # engine, on the very same server stack, so the fake's /generate can be compared with it.
    parser.add_argument("--hello-world", action="store_true", help=argparse.SUPPRESS)
    return parser


HELLO_WORLD_BODY = b'{"text":"hello"}'
_HELLO_WORLD_HEADERS = [(b"content-type", b"application/json"),
                        (b"content-length", str(len(HELLO_WORLD_BODY)).encode())]


async def hello_world_app(scope: dict, receive: Any, send: Any) -> None:
    """The floor of the loopback benchmarks: a bare ASGI app that reads the request body and answers a small
    JSON object, whatever the path (lifespan acknowledged like the fake's apps)."""
    if scope["type"] == "lifespan":
        from .asgi import lifespan

        await lifespan(receive, send)
        return
    while (await receive()).get("more_body", False):
        pass
    await send({"type": "http.response.start", "status": 200, "headers": _HELLO_WORLD_HEADERS})
    await send({"type": "http.response.body", "body": HELLO_WORLD_BODY, "more_body": False})


async def serve(args: argparse.Namespace, stop: asyncio.Event | None = None,
                announce: Callable[[list[str]], None] | None = None) -> int:
    """Run engines (+ router) until `stop` is set (or SIGINT/SIGTERM); `announce(urls)` once all listen."""
    from .engine import FakeEngine
    from .router import FakeRouter
    from .served_model import load_served_model
    from .serving import bind_loopback, http_url, serve_apps

    model = load_served_model(args.model_path, args.dtype) if args.model_path else None
    engines = [
        FakeEngine(
            model=model,
            strict_weights=args.strict_weights,
            profile=args.profile,
            tokens_per_second=args.tokens_per_second,
            max_running_requests=args.max_running_requests,
            enable_lora=args.enable_lora,
            seed=args.seed + i,
            faults=args.faults(args.seed + i) if args.faults else None,
            engine_id=f"e{i}",
            weight_version=args.weight_version,
        )
        for i in range(args.engines)
    ]
    sockets = [bind_loopback(args.host, args.port + i if args.port else 0) for i in range(args.engines)]
    apps: list[Any] = [hello_world_app if args.hello_world else e.app for e in engines]
    closers = [e.aclose for e in engines]
    if args.router:
        engine_urls = [http_url(args.host, s.getsockname()[1]) for s in sockets]
        router = FakeRouter(engine_urls, policy=args.policy, flavor=args.router_flavor, seed=args.seed)
        sockets.append(bind_loopback(args.host, args.port + args.engines if args.port else 0))
        apps.append(router.app)
        closers.append(router.aclose)
    urls = [http_url(args.host, s.getsockname()[1]) for s in sockets]

    async def listening() -> None:
        if announce is not None:
            announce(urls)

    await serve_apps(apps, sockets, stop=stop, on_listening=listening, on_close=closers)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.engines < 1:
        parser.error(f"--engines must be >= 1, got {args.engines}")
    if args.tokens_per_second <= 0:
        parser.error(f"--tokens-per-second must be > 0, got {args.tokens_per_second}")
    if args.max_running_requests < 1:
        parser.error(f"--max-running-requests must be >= 1, got {args.max_running_requests}")
    if args.faults is not None:
        args.faults = fault_plan_factory(parser, "--faults", args.faults)
    from .served_model import ModelPathError
    from .serving import run

    def announce(urls: list[str]) -> None:
        sys.stdout.write("".join(url + "\n" for url in urls))
        sys.stdout.flush()

    try:
        return run(serve(args, announce=announce))
    except ModelPathError as e:
        parser.exit(2, f"{parser.prog}: error: {e}\n")
    except OSError as e:  # e.g. the port is taken
        parser.exit(2, f"{parser.prog}: error: cannot serve on {args.host}: {e.strerror or e}\n")


def fault_plan_factory(parser: argparse.ArgumentParser, option: str, text: str) -> Callable[[int], Any]:
    """Check a `--faults` JSON fault plan now (usage error, exit 2, when bad); returns `seed -> FaultPlan`."""
    from .faults import FaultPlan

    try:
        plan = json.loads(text)
        FaultPlan.from_dicts(plan, seed=0)
    except (ValueError, TypeError, KeyError) as e:
        parser.error(f"{option}: not a valid fault plan ({e}); expected a JSON list of Fault fields, e.g. "
                     '\'[{"endpoint": "/flush_cache", "kind": "flush_fail", "times": 1}]\'')
    return lambda seed: FaultPlan.from_dicts(plan, seed=seed)
