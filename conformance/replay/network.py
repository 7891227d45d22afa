"""In-process HTTP between an integration and the replay's engines: no sockets, every hop on virtual time.

While :func:`in_process` is active, every ``httpx`` async client (the integration's own, built however it likes)
sends requests for a replay host (``http://engine-3.replay``) straight into that engine's ASGI app; other hosts
go out as usual. Each engine's app sits behind a :class:`~conformance.wire.WireRecorder`, so the history is
recorded at the same place as in the suite. Two delays model what the replay does not run for real:

* the weight transfer: a transfer call (``/update_weights_from_*``) reaches the engine ``transfer_s`` seconds
  after it was sent (inside the recorder: the wire shows the call lasting that long);
* the start of an episode's environment: a ``/generate`` reaches the engine ``start_delay`` seconds after it
  was sent (the replay staggers its first episodes this way, so it starts in a steady state);
* the tool or environment step of an agentic turn: a ``/generate`` answer that is not an abort reaches the
  agent ``tool_delay`` seconds after the engine finished it (outside the recorder: the engine is free meanwhile).
  An aborted turn reaches it at once: the agent extracts no command and ends the episode (seed 000).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from typing import Any, Callable, Iterator, Mapping

import httpx

from ..history import TRANSFER_PATHS
from ..wire import ASGIApp

ToolDelay = Callable[[Any, Any], float]
"""``(request payload, answer) -> seconds`` before a finished turn's answer reaches the agent."""
StartDelay = Callable[[Any], float]
"""``request payload -> seconds`` before a ``/generate`` reaches the engine (an episode's environment starting)."""


REPLAY_DOMAIN = ".replay"
"""The replay's engines' hosts end with this (nothing outside the replay resolves it)."""


def engine_url(i: int) -> str:
    """The URL the integration is given for engine ``i``."""
    return f"http://engine-{i}{REPLAY_DOMAIN}"


class TransferDelay:
    """ASGI middleware: a transfer call reaches ``app`` after ``seconds()`` of virtual time."""

    def __init__(self, app: ASGIApp, seconds: Callable[[], float]) -> None:
        self.app, self.seconds = app, seconds

    async def __call__(self, scope: dict, receive: Callable, send: Callable) -> None:
        if scope.get("type") == "http" and scope.get("path") in TRANSFER_PATHS:
            await asyncio.sleep(self.seconds())
        await self.app(scope, receive, send)


class Network:
    """Routes requests for the replay's hosts to their apps (see the module docstring)."""

    def __init__(self, apps: Mapping[str, ASGIApp], tool_delay: ToolDelay | None = None,
                 start_delay: StartDelay | None = None) -> None:
        self.apps = dict(apps)
        """Host → ASGI app."""
        self.tool_delay, self.start_delay = tool_delay, start_delay

    async def send(self, request: httpx.Request) -> httpx.Response:
        app = self.apps[request.url.host]
        payload = _json(await request.aread()) if request.url.path == "/generate" else None
        if payload is not None and self.start_delay is not None:
            delay = self.start_delay(payload)
            if delay > 0:
                await asyncio.sleep(delay)
        timeout = (request.extensions.get("timeout") or {}).get("read")
        call = self._call(app, request)
        try:
            status, headers, body = await (call if timeout is None else asyncio.wait_for(call, timeout))
        except asyncio.TimeoutError:
            raise httpx.ReadTimeout(f"no answer within {timeout:g}s (virtual time)", request=request) from None
        if payload is not None and self.tool_delay is not None and status == 200:
            delay = self.tool_delay(payload, _json(body))
            if delay > 0:
                await asyncio.sleep(delay)
        return httpx.Response(status, headers=headers, content=body, request=request)

    @staticmethod
    async def _call(app: ASGIApp, request: httpx.Request) -> tuple[int, list[tuple[bytes, bytes]], bytes]:
        body = await request.aread()
        url = request.url
        scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": request.method,
                 "scheme": url.scheme, "path": url.path, "raw_path": url.raw_path.split(b"?")[0],
                 "query_string": url.query, "headers": [(k.lower(), v) for k, v in request.headers.raw],
                 "server": (url.host, url.port or 80), "client": ("127.0.0.1", 0)}
        done = asyncio.Event()
        delivered = False

        async def receive() -> dict:
            nonlocal delivered
            if not delivered:
                delivered = True
                return {"type": "http.request", "body": body, "more_body": False}
            await done.wait()
            return {"type": "http.disconnect"}

        status, headers, chunks = 500, [], []

        async def send(message: dict) -> None:
            nonlocal status, headers
            if message["type"] == "http.response.start":
                status, headers = message["status"], list(message.get("headers", []))
            elif message["type"] == "http.response.body":
                chunks.append(message.get("body", b""))

        try:
            await app(scope, receive, send)
        finally:
            done.set()  # the client is gone (answered or cancelled): the app's disconnect watcher ends
        return status, headers, b"".join(chunks)


def _json(raw: bytes) -> Any:
    try:
        return json.loads(raw) if raw else None
    except ValueError:
        return None


@contextlib.contextmanager
def in_process(network: Network) -> Iterator[None]:
    """Route every ``httpx.AsyncHTTPTransport`` request for ``network``'s hosts into its apps while active."""
    original = httpx.AsyncHTTPTransport.handle_async_request

    async def handle(transport: httpx.AsyncHTTPTransport, request: httpx.Request) -> httpx.Response:
        if request.url.host in network.apps:
            return await network.send(request)
        return await original(transport, request)

    httpx.AsyncHTTPTransport.handle_async_request = handle  # type: ignore[method-assign]
    try:
        yield
    finally:
        httpx.AsyncHTTPTransport.handle_async_request = original  # type: ignore[method-assign]
