"""Serving the fake over real HTTP (loopback uvicorn) or in-process (httpx ASGITransport, respx).

* `LoopbackServer(app)` — uvicorn on 127.0.0.1, port 0 by default (the bound port is read back), in a daemon
  thread with its own event loop (`mode="thread"`), or `python -m <this package>` in a subprocess
  (`mode="process"`, the CLI's printed URLs are read back). Any client works against `.url`: `requests`,
  `httpx`, `aiohttp`. Start waits on uvicorn's startup (a condition with a deadline, never a blind sleep);
  stop is bounded (graceful shutdown with a timeout, then force).
* `asgi_client(app)` — an `httpx.AsyncClient` talking to the ASGI app in-process, no sockets. Note that
  httpx's ASGITransport buffers a response until the app finishes it (a streamed /generate arrives whole).
* `mount_respx(router, base_url, app)` — routes every request under `base_url` of a `respx` router to the
  app (async httpx clients only; respx's `ASGIHandler`).

Heavy imports (uvicorn, httpx, respx) happen inside the functions that need them.
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import os
import queue
import socket
import subprocess
import sys
import threading
from collections.abc import Callable, Coroutine, Sequence
from pathlib import Path
from typing import Any

from .serving import (  # noqa: F401  (re-exported: the server stack used to live here)
    DEFAULT_STOP_TIMEOUT,
    KEEP_ALIVE_S,
    ASGIApp,
    _has_module,
    bind_loopback,
    http_url,
    make_uvicorn_server,
    new_event_loop,
    terminate,
    uvicorn_config,
)

DEFAULT_START_TIMEOUT = 15.0


class LoopbackServer:
    """A fake engine (or router, or any ASGI app) on 127.0.0.1, reachable by any HTTP client.

        with LoopbackServer(FakeEngine().app) as server:
            requests.post(server.url + "/generate", json={...})
            server.run_coroutine(engine.step(3), timeout=5)      # call into the server's loop

    `mode="thread"`: uvicorn in a daemon thread with its own loop (`.loop`); pass `app`, or `factory` (a
    zero-argument callable returning the app, run inside that loop, for apps that bind to the running loop
    at construction). `mode="process"`: `python -m <package> <cli_args>` in a subprocess; `.urls` are the URLs
    it prints (engines, then the router), `.url` the first; `app` must be None. `keep_alive_s`: how long an idle
    connection stays open (thread mode; the engine's own idle limit by default).
    """

    def __init__(
        self,
        app: ASGIApp | None = None,
        host: str = "127.0.0.1",
        port: int = 0,
        mode: str = "thread",
        *,
        factory: Callable[[], ASGIApp] | None = None,
        cli_args: Sequence[str] = ("--engines", "1"),
        start_timeout: float = DEFAULT_START_TIMEOUT,
        stop_timeout: float = DEFAULT_STOP_TIMEOUT,
        env: dict[str, str] | None = None,
        keep_alive_s: float = KEEP_ALIVE_S,
    ) -> None:
        if mode not in {"thread", "process"}:
            raise ValueError(f"mode must be 'thread' or 'process', not {mode!r}")
        if mode == "thread" and (app is None) == (factory is None):
            raise ValueError("thread mode needs exactly one of app= or factory=")
        if mode == "process" and (app is not None or factory is not None):
            raise ValueError("process mode serves this package's CLI (`python -m <package>`); pass cli_args, not an app")
        self.app = app
        self.host = host
        self.port = port
        self.mode = mode
        self.factory = factory
        self.cli_args = list(cli_args)
        self.start_timeout = start_timeout
        self.stop_timeout = stop_timeout
        self.env = env
        self.keep_alive_s = keep_alive_s
        self.urls: list[str] = []
        self.loop: asyncio.AbstractEventLoop | None = None
        self.process: subprocess.Popen[str] | None = None
        self.returncode: int | None = None
        self._server: Any = None
        self._thread: threading.Thread | None = None
        self._sock: socket.socket | None = None
        self._thread_error: BaseException | None = None
        self._stderr_tail: collections.deque[str] = collections.deque(maxlen=50)
        self._readers: list[threading.Thread] = []

    # -------------------------------------------------------------------------------------------- public

    @property
    def url(self) -> str:
        if not self.urls:
            raise RuntimeError("the server is not started")
        return self.urls[0]

    @property
    def running(self) -> bool:
        if self.mode == "thread":
            return self._thread is not None and self._thread.is_alive()
        return self.process is not None and self.process.poll() is None

    def start(self) -> LoopbackServer:
        if self.urls:
            raise RuntimeError("already started")
        if self.mode == "thread":
            self._start_thread()
        else:
            self._start_process()
        return self

    def stop(self) -> None:
        """Stop serving; bounded by `stop_timeout` (graceful), then forced. Idempotent."""
        if self.mode == "thread":
            self._stop_thread()
        else:
            self._stop_process()

    def run_coroutine(self, coro: Coroutine[Any, Any, Any], timeout: float | None = 10.0) -> Any:
        """Run `coro` on the server's event loop (thread mode) and return its result, waiting at most `timeout`."""
        if self.loop is None or not self.running:
            coro.close()
            raise RuntimeError("run_coroutine needs a started thread-mode server")
        future = asyncio.run_coroutine_threadsafe(coro, self.loop)
        try:
            return future.result(timeout)
        except concurrent.futures.TimeoutError:
            future.cancel()
            raise TimeoutError(f"coroutine did not finish within {timeout} s on the server loop") from None

    def call_soon(self, fn: Callable[..., Any], *args: Any) -> None:
        """Schedule a plain callback on the server's loop (thread mode)."""
        if self.loop is None:
            raise RuntimeError("call_soon needs a started thread-mode server")
        self.loop.call_soon_threadsafe(fn, *args)

    def __enter__(self) -> LoopbackServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def __repr__(self) -> str:
        return f"LoopbackServer(mode={self.mode!r}, urls={self.urls!r}, running={self.running})"

    # -------------------------------------------------------------------------------------------- thread

    def _start_thread(self) -> None:
        self._sock = bind_loopback(self.host, self.port)
        port = self._sock.getsockname()[1]
        loop = new_event_loop()
        self.loop = loop
        ready = threading.Event()  # set when uvicorn listens, or when the thread failed before it could

        def run() -> None:
            asyncio.set_event_loop(loop)
            try:
                loop.run_until_complete(self._serve(ready))
            except BaseException as e:  # reported by start()/stop()
                self._thread_error = e
            finally:
                ready.set()
                try:
                    _cancel_leftovers(loop)
                    loop.run_until_complete(loop.shutdown_asyncgens())
                finally:
                    asyncio.set_event_loop(None)
                    loop.close()

        self._thread = threading.Thread(target=run, name=f"fakes-loopback-{port}", daemon=True)
        self._thread.start()
        if not ready.wait(self.start_timeout):
            self._stop_thread()
            raise TimeoutError(f"uvicorn did not start within {self.start_timeout} s on port {port}")
        if self._thread_error is not None or self._server is None or not self._server.started:
            error = self._thread_error
            self._stop_thread()
            raise RuntimeError(f"uvicorn failed to start on port {port}: {error!r}") from error
        self.urls = [http_url(self.host, port)]

    async def _serve(self, ready: threading.Event) -> None:
        app = self.factory() if self.factory is not None else self.app
        self.app = app
        config = uvicorn_config(app, self.host, self._sock.getsockname()[1], graceful_timeout=self.stop_timeout,
                                keep_alive_s=self.keep_alive_s)
        self._server = make_uvicorn_server(config, ready)
        await self._server.serve(sockets=[self._sock])

    def _stop_thread(self) -> None:
        thread, server = self._thread, self._server
        if thread is not None and server is not None and thread.is_alive():
            server.request_exit(self.loop)
            thread.join(self.stop_timeout + 1.0)
            if thread.is_alive():
                server.request_exit(self.loop, force=True)
                thread.join(2.0)
            if thread.is_alive():
                raise RuntimeError(f"loopback server thread {thread.name} did not stop; it is at:\n"
                                   + thread_stack(thread))
        if self._sock is not None:
            self._sock.close()
            self._sock = None
        self._thread = None
        self.urls = []

    # -------------------------------------------------------------------------------------------- process

    def _expected_urls(self) -> int:
        from .cli import build_parser

        args = build_parser().parse_args(self.cli_args)
        return args.engines + (1 if args.router else 0)

    def _start_process(self) -> None:
        package = __package__ or "fakes"
        package_root = str(Path(__file__).resolve().parent.parent)
        env = dict(os.environ if self.env is None else self.env)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (package_root, env.get("PYTHONPATH", "")) if p)
        env["PYTHONUNBUFFERED"] = "1"
        args = list(self.cli_args)
        if self.port and "--port" not in args:
            args += ["--port", str(self.port)]
        if self.host != "127.0.0.1" and "--host" not in args:
            args += ["--host", self.host]
        expected = self._expected_urls()
        self.process = subprocess.Popen(
            [sys.executable, "-m", package, *args],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
            start_new_session=True,
        )
        lines: queue.Queue[str | None] = queue.Queue()
        self._readers = [
            threading.Thread(target=_pump, args=(self.process.stdout, lines.put, lambda: lines.put(None)), daemon=True),
            threading.Thread(target=_pump, args=(self.process.stderr, self._stderr_tail.append), daemon=True),
        ]
        for reader in self._readers:
            reader.start()
        deadline = _Deadline(self.start_timeout)
        urls: list[str] = []
        while len(urls) < expected:
            try:
                line = lines.get(timeout=deadline.left())
            except queue.Empty:
                self._stop_process()
                raise TimeoutError(f"`python -m {package}` printed {len(urls)}/{expected} URLs within "
                                   f"{self.start_timeout} s; stderr: {self.stderr_tail()}") from None
            if line is None:  # stdout closed: the process died
                self._stop_process()
                raise RuntimeError(f"`python -m {package}` exited ({self.returncode}) before printing its URLs; "
                                   f"stderr: {self.stderr_tail()}")
            line = line.strip()
            if line.startswith("http://"):
                urls.append(line)
        self.urls = urls

    def stderr_tail(self) -> str:
        return "".join(self._stderr_tail)[-4000:]

    def _stop_process(self) -> None:
        proc = self.process
        if proc is None:
            return
        terminate(proc, self.stop_timeout + 2.0)
        self.returncode = proc.returncode
        for reader in self._readers:
            reader.join(2.0)
        for stream in (proc.stdout, proc.stderr):
            if stream is not None:
                stream.close()
        self._readers = []
        self.process = None
        self.urls = []


def _pump(stream: Any, put: Callable[[str], None], on_end: Callable[[], None] | None = None) -> None:
    """Forward a text stream line by line until it closes (a reader thread of process mode)."""
    try:
        for line in iter(stream.readline, ""):
            put(line)
    except (OSError, ValueError):
        pass
    finally:
        if on_end is not None:
            on_end()


class _Deadline:
    def __init__(self, seconds: float) -> None:
        import time

        self._time = time.monotonic
        self.end = self._time() + seconds

    def left(self) -> float:
        return max(0.0, self.end - self._time())


def thread_stack(thread: threading.Thread) -> str:
    """Where ``thread`` is now (its Python stack, innermost last): the witness of a thread that does not stop."""
    import traceback

    frame = sys._current_frames().get(thread.ident or -1)
    return "".join(traceback.format_stack(frame)) if frame is not None else "(the thread has ended)\n"


def _cancel_leftovers(loop: asyncio.AbstractEventLoop) -> None:
    pending = [t for t in asyncio.all_tasks(loop) if not t.done()]
    for task in pending:
        task.cancel()
    if pending:
        loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))


# ------------------------------------------------------------------------------------------------ in-process


def asgi_client(app: ASGIApp, base_url: str = "http://fake", **kwargs: Any) -> Any:
    """An `httpx.AsyncClient` that sends every request to `app` in-process (no sockets)."""
    import httpx

    kwargs.setdefault("timeout", 30.0)
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url=base_url, **kwargs)


def mount_respx(router: Any, base_url: str, app: ASGIApp) -> Any:
    """Route every request under `base_url` on a `respx` router (e.g. `respx.mock`) to `app`; returns the route.

        with respx.mock(assert_all_called=False) as router:
            mount_respx(router, "http://engine-0:30000", engine.app)
            await httpx.AsyncClient().post("http://engine-0:30000/generate", json=...)
    """
    import respx

    return router.route(url__startswith=base_url.rstrip("/")).mock(side_effect=respx.ASGIHandler(app))


# ------------------------------------------------------------------------------------------------ real router


def real_router_available() -> bool:
    """Whether the real sglang router (`pip install sglang-router`, a CPU Rust wheel) is importable."""
    return _has_module("sglang_router")


class RealRouterProcess:
    """The REAL sglang router (`python -m sglang_router.launch_router`) in front of `worker_urls`, on loopback.

        with RealRouterProcess([engine_a.url, engine_b.url]) as router:
            httpx.post(router.url + "/generate", json=...)

    Start waits (bounded) until `/readiness` reports every worker healthy — `/health` answers before the
    workers are registered. Its Prometheus exporter gets its own free port (the default one is fixed, so two
    routers at once would collide). Note: its "first healthy worker" is the first in `GET /workers`, i.e. the
    order the workers finished registering, not the `worker_urls` order.
    """

    def __init__(self, worker_urls: Sequence[str], policy: str = "round_robin", *, host: str = "127.0.0.1",
                 extra_args: Sequence[str] = (), start_timeout: float = 30.0, stop_timeout: float = 10.0) -> None:
        self.worker_urls = list(worker_urls)
        self.policy = policy
        self.host = host
        self.extra_args = list(extra_args)
        self.start_timeout = start_timeout
        self.stop_timeout = stop_timeout
        self.process: subprocess.Popen[str] | None = None
        self.url = ""
        self.returncode: int | None = None
        self._output: collections.deque[str] = collections.deque(maxlen=200)

    def start(self) -> RealRouterProcess:
        import json as _json
        import time
        import urllib.error
        import urllib.request

        def free_port() -> int:
            with bind_loopback(self.host, 0) as sock:
                return sock.getsockname()[1]

        port = free_port()
        cmd = [sys.executable, "-m", "sglang_router.launch_router", "--host", self.host, "--port", str(port),
               "--worker-urls", *self.worker_urls, "--policy", self.policy, "--log-level", "error",
               "--shutdown-grace-period-secs", "0", "--prometheus-host", self.host,
               "--prometheus-port", str(free_port()), *self.extra_args]
        self.process = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                        stderr=subprocess.STDOUT, text=True, start_new_session=True)
        reader = threading.Thread(target=_pump, args=(self.process.stdout, self._output.append), daemon=True)
        reader.start()
        self.url = http_url(self.host, port)
        deadline = _Deadline(self.start_timeout)
        while True:  # poll readiness until every worker is registered and healthy (bounded)
            if self.process.poll() is not None:
                output = "".join(self._output)[-3000:]
                self.stop()
                raise RuntimeError(f"sglang router exited ({self.returncode}): {output}")
            try:
                with urllib.request.urlopen(self.url + "/readiness", timeout=1.0) as resp:
                    ready = _json.loads(resp.read() or b"{}")
                if ready.get("healthy_workers") == len(self.worker_urls):
                    return self
            except (OSError, ValueError, urllib.error.URLError):
                pass
            if deadline.left() <= 0:
                self.stop()
                raise TimeoutError(f"sglang router not ready within {self.start_timeout} s")
            time.sleep(0.05)

    def stop(self) -> None:
        proc = self.process
        if proc is None:
            return
        terminate(proc, self.stop_timeout)
        self.returncode = proc.returncode
        if proc.stdout is not None:
            proc.stdout.close()
        self.process = None

    def output(self) -> str:
        return "".join(self._output)

    def __enter__(self) -> RealRouterProcess:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
