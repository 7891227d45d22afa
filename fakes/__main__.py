"""`python -m fakes` (or the vendored package's name): fake SGLang engines (and a router in front of them) on 127.0.0.1, in one process.

Prints one URL per line once everything listens — the engines first, then the router — and serves until
SIGINT or SIGTERM, then shuts down cleanly and exits 0.

    python -m fakes --engines 2 --router --profile 0.5.23 --tokens-per-second 200
"""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import sys
from typing import Any


def build_parser() -> argparse.ArgumentParser:
    from .profiles import DEFAULT_PROFILE, PROFILES

    parser = argparse.ArgumentParser(
        prog=f"python -m {__package__ or 'fakes'}",
        description="Serve fake SGLang engines (and optionally a fake sglang router) on loopback. Prints one URL "
                    "per line (engines, then the router) when all listen; SIGINT/SIGTERM stops them (exit 0).",
    )
    parser.add_argument("--engines", type=int, default=1, metavar="E", help="number of fake engines (default 1)")
    parser.add_argument("--router", action="store_true", help="also serve a FakeRouter in front of the engines")
    parser.add_argument("--router-flavor", default="0.3.2", choices=("0.3.2", "spec"),
                        help="router behaviour: as measured on sglang-router 0.3.2 (default) or as spec §8 reads")
    parser.add_argument("--policy", default="round_robin", choices=("round_robin", "random"),
                        help="router policy (default round_robin)")
    parser.add_argument("--profile", default=DEFAULT_PROFILE, choices=sorted(PROFILES),
                        help=f"SGLang version profile (default {DEFAULT_PROFILE})")
    parser.add_argument("--tokens-per-second", type=float, default=100.0, metavar="R",
                        help="decode speed of every request on the real-time clock (default 100)")
    parser.add_argument("--max-running-requests", type=int, default=64, metavar="N",
                        help="scheduler running-batch capacity per engine (default 64)")
    parser.add_argument("--enable-lora", action="store_true", help="accept LoRA adapter loads (--enable-lora)")
    parser.add_argument("--weight-version", default="default", help="initial weight version label (default "
                                                                     "'default', as --weight-version)")
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
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await send({"type": "lifespan.shutdown.complete"})
                return
    while (await receive()).get("more_body", False):
        pass
    await send({"type": "http.response.start", "status": 200, "headers": _HELLO_WORLD_HEADERS})
    await send({"type": "http.response.body", "body": HELLO_WORLD_BODY, "more_body": False})


async def serve(args: argparse.Namespace, stop: asyncio.Event | None = None,
                announce: Any = None) -> int:
    """Run engines (+ router) until `stop` is set (or SIGINT/SIGTERM); `announce(urls)` once all listen."""
    from .engine import FakeEngine
    from .faults import FaultPlan
    from .router import FakeRouter
    from .server import _url, bind_loopback, make_uvicorn_server, uvicorn_config

    if args.engines < 1:
        raise SystemExit("--engines must be >= 1")
    loop = asyncio.get_running_loop()
    stop = stop if stop is not None else asyncio.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        try:
            loop.add_signal_handler(sig, stop.set)
        except (NotImplementedError, RuntimeError):  # not the main thread / not supported
            pass
    plan_dicts = json.loads(args.faults) if args.faults else None
    engines = [
        FakeEngine(
            profile=args.profile,
            tokens_per_second=args.tokens_per_second,
            max_running_requests=args.max_running_requests,
            enable_lora=args.enable_lora,
            seed=args.seed + i,
            faults=FaultPlan.from_dicts(plan_dicts, seed=args.seed + i) if plan_dicts else None,
            engine_id=f"e{i}",
            weight_version=args.weight_version,
        )
        for i in range(args.engines)
    ]
    sockets = [bind_loopback(args.host, args.port + i if args.port else 0) for i in range(args.engines)]
    urls = [_url(args.host, s.getsockname()[1]) for s in sockets]
    apps: list[Any] = [hello_world_app if args.hello_world else e.app for e in engines]
    router = None
    if args.router:
        router = FakeRouter(urls, policy=args.policy, flavor=args.router_flavor, seed=args.seed)
        sockets.append(bind_loopback(args.host, args.port + args.engines if args.port else 0))
        urls.append(_url(args.host, sockets[-1].getsockname()[1]))
        apps.append(router.app)
    started = asyncio.Event()
    pending = len(apps)

    def on_started(_server: Any) -> None:
        nonlocal pending
        pending -= 1
        if pending == 0:
            started.set()

    servers = []
    for app, sock in zip(apps, sockets):
        config = uvicorn_config(app, args.host, sock.getsockname()[1], graceful_timeout=3.0)
        servers.append(make_uvicorn_server(config, on_started=on_started))
    tasks = [asyncio.ensure_future(s.serve(sockets=[sock])) for s, sock in zip(servers, sockets)]
    stopper = asyncio.ensure_future(stop.wait())
    try:
        starting = asyncio.ensure_future(started.wait())
        done, _ = await asyncio.wait([starting, stopper, *tasks], return_when=asyncio.FIRST_COMPLETED)
        if starting not in done:
            starting.cancel()
            failed = [t for t in tasks if t.done()]
            if failed and not stopper.done():
                raise RuntimeError(f"a server failed to start: {failed[0].exception()!r}")
        elif not all(s.started for s in servers):
            raise RuntimeError("a server failed to start")
        else:
            if announce is not None:
                announce(urls)
            await asyncio.wait([stopper, *tasks], return_when=asyncio.FIRST_COMPLETED)
    finally:
        for server in servers:
            server.request_exit()
        await asyncio.wait(tasks, timeout=10.0)
        for server in servers:
            server.request_exit(force=True)
        stopper.cancel()
        for engine in engines:
            await engine.aclose()
        if router is not None:
            await router.aclose()
        for sock in sockets:
            sock.close()
    return 0


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    from .server import new_event_loop

    def announce(urls: list[str]) -> None:
        sys.stdout.write("".join(url + "\n" for url in urls))
        sys.stdout.flush()

    loop = new_event_loop()
    asyncio.set_event_loop(loop)
    try:
        return loop.run_until_complete(serve(args, announce=announce))
    finally:
        asyncio.set_event_loop(None)
        loop.close()


if __name__ == "__main__":
    raise SystemExit(main())
