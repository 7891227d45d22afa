"""The server stack every fake entry point shares: uvicorn on bound sockets, without its signal handling.

`bind_loopback` (a bound socket, port 0 = the OS picks), `uvicorn_config` (quiet, fast parser when installed),
`make_uvicorn_server` (a `uvicorn.Server` that leaves signals to its owner and stops at once on
`request_exit`), `serve_apps` (several apps on their sockets until a stop event or SIGINT/SIGTERM, with a hook
once all listen), `run` (a coroutine on a fresh event loop, uvloop's when installed) and `terminate` (a child
process, bounded). Used by `python -m fakes` (`cli.py`), `python -m fakes.launch_server` and `LoopbackServer`.
Heavy imports (uvicorn, uvloop) happen inside the functions that need them.
"""

from __future__ import annotations

import asyncio
import signal
import socket
import subprocess
import threading
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from typing import Any, TypeVar

from .facts import SGLANG

ASGIApp = Callable[..., Any]
T = TypeVar("T")

DEFAULT_STOP_TIMEOUT = 5.0
KEEP_ALIVE_S = SGLANG.keep_alive_s
"""How long an idle connection stays open, as SGLang keeps it (``SGLANG.keep_alive_source``)."""


def _has_module(name: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(name) is not None


def new_event_loop() -> asyncio.AbstractEventLoop:
    """A fresh event loop: uvloop's when it is installed, else asyncio's."""
    if _has_module("uvloop"):
        import uvloop

        return uvloop.new_event_loop()
    return asyncio.new_event_loop()


def uvicorn_config(app: ASGIApp, host: str, port: int, *, graceful_timeout: float = DEFAULT_STOP_TIMEOUT,
                   keep_alive_s: float = KEEP_ALIVE_S) -> Any:
    """The uvicorn config every fake server uses: fast parser when installed, quiet, no access log, and no
    X-Forwarded-* rewriting middleware (the fakes never read the client address); idle connections closed after
    ``keep_alive_s``."""
    import uvicorn

    return uvicorn.Config(
        app,
        host=host,
        port=port,
        loop="uvloop" if _has_module("uvloop") else "asyncio",
        http="httptools" if _has_module("httptools") else "h11",
        ws="none",
        lifespan="auto",
        log_level="warning",
        access_log=False,
        proxy_headers=False,
        timeout_graceful_shutdown=graceful_timeout,
        timeout_keep_alive=keep_alive_s,
    )


def bind_loopback(host: str = "127.0.0.1", port: int = 0) -> socket.socket:
    """A TCP socket bound to host:port (port 0: the OS picks), ready for uvicorn's `serve(sockets=[...])`."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.set_inheritable(False)
    except OSError:
        sock.close()
        raise
    return sock


def http_url(host: str, port: int) -> str:
    """`http://host:port` (IPv6 hosts bracketed)."""
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


def make_uvicorn_server(config: Any, ready: threading.Event | None = None,
                        on_started: Callable[[Any], None] | None = None) -> Any:
    """A `uvicorn.Server` that never touches process signals (its owner handles them).

    `.ready` (a threading.Event) is set once startup is over, listening or failed; `on_started(server)` is
    called in the server's loop right after it.
    """
    import contextlib

    import uvicorn

    class _Server(uvicorn.Server):
        async def startup(self, sockets: list[socket.socket] | None = None) -> None:
            try:
                await super().startup(sockets=sockets)
            finally:
                self.ready.set()
                if on_started is not None:
                    on_started(self)

        def capture_signals(self) -> Any:  # uvicorn >= 0.29 would re-raise SIGTERM after serving
            return contextlib.nullcontext()

        async def main_loop(self) -> None:
            """uvicorn's loop (a tick every 0.1 s), but woken at once by `request_exit`."""
            self._wake = asyncio.Event()
            counter = 0
            should_exit = await self.on_tick(counter)
            while not should_exit:
                counter = (counter + 1) % 864000
                try:
                    await asyncio.wait_for(self._wake.wait(), 0.1)
                except asyncio.TimeoutError:
                    pass
                should_exit = await self.on_tick(counter)

        def request_exit(self, loop: asyncio.AbstractEventLoop | None = None, force: bool = False) -> None:
            """Ask the server to stop (from any thread when `loop` is its loop)."""
            self.should_exit = True
            self.force_exit = self.force_exit or force
            wake = getattr(self, "_wake", None)
            if wake is None:
                return
            if loop is None:
                wake.set()
            elif not loop.is_closed():
                try:
                    loop.call_soon_threadsafe(wake.set)
                except RuntimeError:  # the loop closed meanwhile
                    pass

        def install_signal_handlers(self) -> None:  # uvicorn < 0.29
            return None

    server = _Server(config)
    server.ready = ready if ready is not None else threading.Event()
    return server


def terminate(proc: subprocess.Popen, timeout: float) -> None:
    """SIGTERM, wait up to ``timeout``, then SIGKILL: a child process never outlives its owner's stop()."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5.0)


async def serve_apps(
    apps: Sequence[ASGIApp],
    sockets: Sequence[socket.socket],
    *,
    stop: asyncio.Event | None = None,
    on_listening: Callable[[], Awaitable[None]] | None = None,
    on_close: Sequence[Callable[[], Awaitable[None]]] = (),
    on_servers: Callable[[Sequence[Any]], None] | None = None,
    graceful_timeout: float = 3.0,
) -> None:
    """Serve each app on its bound socket until `stop` is set, SIGINT/SIGTERM arrives or a server ends.

    `on_servers(servers)` gets the `uvicorn.Server` of each app (in order) before they start;
    `await on_listening()` runs once every server listens (print URLs, warm up); `on_close` hooks run after
    the servers stopped (engine and router shutdown); the sockets are closed last. A server that fails to start
    raises RuntimeError."""
    loop = asyncio.get_running_loop()
    stop = stop if stop is not None else asyncio.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        try:
            loop.add_signal_handler(sig, stop.set)
        except (NotImplementedError, RuntimeError):  # not the main thread / not supported
            pass
    started = asyncio.Event()
    pending = len(apps)

    def on_started(_server: Any) -> None:
        nonlocal pending
        pending -= 1
        if pending == 0:
            started.set()

    servers = []
    for app, sock in zip(apps, sockets):
        host, port = sock.getsockname()[:2]
        servers.append(make_uvicorn_server(uvicorn_config(app, host, port, graceful_timeout=graceful_timeout),
                                           on_started=on_started))
    if on_servers is not None:
        on_servers(servers)
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
            if on_listening is not None:
                hook = asyncio.ensure_future(on_listening())
                await asyncio.wait([hook, stopper, *tasks], return_when=asyncio.FIRST_COMPLETED)
                if not hook.done():
                    hook.cancel()
                elif hook.exception() is not None:
                    raise hook.exception()  # type: ignore[misc]
            await asyncio.wait([stopper, *tasks], return_when=asyncio.FIRST_COMPLETED)
    finally:
        for server in servers:
            server.request_exit()
        await asyncio.wait(tasks, timeout=10.0)
        for server in servers:
            server.request_exit(force=True)
        stopper.cancel()
        for close in on_close:
            await close()
        for sock in sockets:
            sock.close()


def run(coro: Coroutine[Any, Any, T]) -> T:
    """Run `coro` to completion on a fresh event loop (uvloop's when installed), then close the loop."""
    loop = new_event_loop()
    asyncio.set_event_loop(loop)
    try:
        return loop.run_until_complete(coro)
    finally:
        asyncio.set_event_loop(None)
        loop.close()
