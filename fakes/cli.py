"""`python -m fakes` (or the vendored package's name): fake SGLang engines (and a router in front of them) on
127.0.0.1, in one process.

(One engine per process, started with SGLang's own launch flags: `python -m fakes.launch_server`.)

Prints one URL per line once everything listens — the engines first, then the router — and serves until
SIGINT or SIGTERM, then shuts down cleanly and exits 0.

An engine that crashes (e.g. an `/update_weights_from_disk` whose rollback re-reads a folder that still fails, or a
`crash` fault) goes the way of a crashed SGLang server, whose launcher kills its process tree (measured on real
0.5.15/0.5.23 on CPU: the call that killed it gets no answer, later ones are refused; ``python -m gpu.fidelity``),
not answering 500 "engine crashed" as an in-process `FakeEngine` does. With one engine (`--engines 1`, router
or not) the process exits 1 at once, dropping its connections, as `python -m fakes.launch_server` does. With
several, the dead engine's port closes (its listening socket and every connection to it, the killing call's
unanswered) while the other engines and the router keep serving; one stderr line names its URL and the reason.

    python -m fakes --engines 2 --router --profile 0.5.23 --tokens-per-second 200
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import sys
from collections.abc import Callable, Sequence
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


def exit_on_crash(reason: str) -> NoReturn:
    """A crashed engine's server exits at once, dropping the connections it holds: what a client of real SGLang
    sees when its scheduler dies (the launcher kills its process tree; measured on real 0.5.15/0.5.23 on CPU:
    the call that killed it gets no answer, later ones are refused; ``python -m gpu.fidelity``)."""
    logging.getLogger(__name__).error("Scheduler hit an exception: %s", reason)
    sys.stderr.flush()
    os._exit(1)


class CrashDoor:
    """One engine's ASGI app among several: when the engine crashes its port goes dead, as when SGLang's process
    dies (see `exit_on_crash`): the listening socket closes, every connection to it drops, answers unsent."""

    DROP_TIMEOUT = 5.0

    def __init__(self, engine: Any) -> None:
        self.engine = engine
        self.server: Any = None  # the uvicorn.Server serving it (`attach`)
        self.closed = False

    def attach(self, server: Any) -> None:
        self.server = server
        if self.closed:
            self.close()

    def close(self) -> None:
        """Stop listening and abort every open connection, the killing call's too (what uvicorn's own shutdown reaches
        through: `servers`, `server_state.connections`)."""
        self.closed = True
        if self.server is None:
            return
        for listener in getattr(self.server, "servers", ()):  # set once it listens
            listener.close()
        for connection in list(self.server.server_state.connections):
            connection.transport.abort()

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.engine.app(scope, receive, send)
            return
        if not self.closed:
            async def send_while_open(message: dict) -> None:
                if not self.closed:
                    await send(message)

            await self.engine.app(scope, receive, send_while_open)
        if self.closed:
            await self._dropped(receive)

    async def _dropped(self, receive: Any) -> None:
        """Return once the server saw the connection go (so it sends nothing in the app's place)."""
        self.close()

        async def disconnect() -> None:
            while (await receive())["type"] != "http.disconnect":
                pass

        await asyncio.wait_for(disconnect(), self.DROP_TIMEOUT)


async def serve(args: argparse.Namespace, stop: asyncio.Event | None = None,
                announce: Callable[[list[str]], None] | None = None) -> int:
    """Run engines (+ router) until `stop` is set (or SIGINT/SIGTERM); `announce(urls)` once all listen. A crash
    closes that engine's port, or with one engine exits the process (see the module docstring)."""
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
    engine_urls = [http_url(args.host, s.getsockname()[1]) for s in sockets]
    doors = [CrashDoor(e) for e in engines] if args.engines > 1 and not args.hello_world else []
    for i, (engine, url) in enumerate(zip(engines, engine_urls)):
        engine.on_crash = _crash_handler(engine, url, doors[i] if doors else None)
    apps: list[Any] = [hello_world_app] * args.engines if args.hello_world else list(doors or (e.app for e in engines))
    closers = [e.aclose for e in engines]
    if args.router:
        router = FakeRouter(engine_urls, policy=args.policy, flavor=args.router_flavor, seed=args.seed)
        sockets.append(bind_loopback(args.host, args.port + args.engines if args.port else 0))
        apps.append(router.app)
        closers.append(router.aclose)
    urls = [http_url(args.host, s.getsockname()[1]) for s in sockets]

    def attach(servers: Sequence[Any]) -> None:
        for door, server in zip(doors, servers):  # the engines' servers come first
            door.attach(server)

    async def listening() -> None:
        if announce is not None:
            announce(urls)

    await serve_apps(apps, sockets, stop=stop, on_listening=listening, on_close=closers, on_servers=attach)
    return 0


def _crash_handler(engine: Any, url: str, door: CrashDoor | None) -> Callable[[str], None]:
    """`engine.on_crash`: one stderr line naming the engine, then its door closes (or, alone, the process exits)."""

    def on_crash(reason: str) -> None:
        then = "exiting" if door is None else "its port is closed, the rest serve on"
        sys.stderr.write(f"python -m {__package__ or 'fakes'}: engine {engine.engine_id} at {url} crashed ({then}): "
                         f"{reason}\n")
        sys.stderr.flush()
        if door is None:
            exit_on_crash(reason)
        door.close()

    return on_crash


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
