"""The forwarding proxy in the driver: the integration's URL for one remote engine, recorded by the WireRecorder.

:class:`ForwardingProxy` is an ASGI app that forwards every HTTP request to one engine and streams the answer back
chunk by chunk as the engine sends it (a streamed ``/generate`` is never buffered). Request and response headers
are forwarded as they are, except the hop-by-hop ones (RFC 9110 §7.6.1) and those the two HTTP stacks set
themselves (``host``, ``content-length`` of the request, ``date``/``server`` of the answer). Bodies pass through
byte for byte (no decompression). When the integration's client goes away mid-answer, the proxy closes its
connection to the engine, so the engine sees the disconnect as it would without the proxy (SGLang aborts a
request whose client disconnected). Each request goes to the engine on a connection of its own: an engine's server
closes a connection after a 500 its safety-net handler sent (vLLM 0.32.0: ``app.exception_handler(Exception)``,
``entrypoints/serve/exception_handling/register.py``, answers in Starlette's ``ServerErrorMiddleware``, which raises
again, and uvicorn then closes the transport: a failed ``/collective_rpc`` reload), and a pooled connection reused at
that moment fails the next call with no answer (measured: the relabel right after a failed reload, 3 of 3 times
direct, ``ReadError``; a 502 through a pooling proxy).
The integration's own connections to the proxy are its client's to manage.

:func:`recording_proxy` serves ``WireRecorder(ForwardingProxy(...))`` on loopback: every exchange becomes a
``WireCall``, refusals injected with ``WireLog.refuse`` are answered at the recorder, and probes pass unrecorded.

When the backend knows an engine is gone, :meth:`ForwardingProxy.fail` makes every later request answer 502 at
once with the reason, instead of each one waiting on a dead address.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any, Callable

from conformance.dialect import SGLANG_DIALECT, Dialect
from conformance.wire import WireLog, WireRecorder
from conformance.wire_control import WireControl
from fakes.asgi import lifespan

HOP_BY_HOP = frozenset({"connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "te", "trailer",
                        "trailers", "transfer-encoding", "upgrade", "proxy-connection"})
REQUEST_SET_BY_CLIENT = frozenset({"host", "content-length"})
RESPONSE_SET_BY_SERVER = frozenset({"date", "server"})
CONNECT_TIMEOUT_S = 10.0
KEEP_ALIVE_S = 300.0
"""How long the proxy keeps an integration's idle connection open. Not the engine's 5 s: the proxy runs in the
suite's own process, whose event loops a busy machine stalls for seconds (measured on real vLLM), and a stall that
delays the integration reading an answer by 3 s lets the proxy close the connection as the next request goes out on
it, though the client's own expiry (2 s, ``KEEPALIVE_EXPIRY_S``) is well below the engine's limit: the request is
lost with no answer (``RemoteProtocolError: Server disconnected without sending a response``, a pause of
``staleness`` in the real-vLLM CI stage). The engine's own idle limit is its server's: the proxy dials it anew per
request."""


class ForwardingProxy:
    """ASGI app forwarding each HTTP request to ``target`` (``http://host:port``), streaming the answer back."""

    def __init__(self, target: str, connect_timeout_s: float = CONNECT_TIMEOUT_S,
                 on_unreachable: Callable[[str], None] | None = None) -> None:
        self.target = target.rstrip("/")
        self.connect_timeout_s = connect_timeout_s
        self.on_unreachable = on_unreachable
        """Called with the error each time the engine cannot be reached or drops an answer (the recorder still
        holds the call open, so the wire shows what was in flight at that moment)."""
        self.failure: str | None = None
        self._session: Any = None

    def fail(self, reason: str) -> None:
        """Answer every later request with 502 and ``reason`` (the engine is known to be gone)."""
        self.failure = reason

    async def __call__(self, scope: dict, receive: Callable, send: Callable) -> None:
        if scope["type"] == "lifespan":
            await self._lifespan(receive, send)
        elif scope["type"] == "http":
            await self._http(scope, receive, send)

    async def _lifespan(self, receive: Callable, send: Callable) -> None:
        await lifespan(receive, send, self.aclose)

    def _client(self) -> Any:
        import aiohttp

        if self._session is None:
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=0, force_close=True),
                timeout=aiohttp.ClientTimeout(total=None, sock_connect=self.connect_timeout_s),
                auto_decompress=False, skip_auto_headers=("User-Agent", "Accept", "Accept-Encoding", "Content-Type"))
        return self._session

    async def aclose(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def _http(self, scope: dict, receive: Callable, send: Callable) -> None:
        body = bytearray()
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            body += message.get("body", b"")
            if not message.get("more_body", False):
                break
        if self.failure is not None:
            await _answer(send, 502, {"error": self.failure})
            return
        forward = asyncio.ensure_future(self._forward(scope, bytes(body), send))
        disconnect = asyncio.ensure_future(_disconnected(receive))
        try:
            await asyncio.wait([forward, disconnect], return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in (forward, disconnect):
                if not task.done():
                    task.cancel()
            await asyncio.gather(forward, disconnect, return_exceptions=True)
        if forward.done() and not forward.cancelled() and forward.exception() is not None:
            raise forward.exception()

    async def _forward(self, scope: dict, body: bytes, send: Callable) -> None:
        import aiohttp

        url = self.target + (scope.get("raw_path") or scope["path"].encode()).decode("latin-1")
        if scope.get("query_string"):
            url += "?" + scope["query_string"].decode("latin-1")
        headers = [(k.decode("latin-1"), v.decode("latin-1")) for k, v in scope.get("headers", [])
                   if k.decode("latin-1").lower() not in HOP_BY_HOP | REQUEST_SET_BY_CLIENT]
        started = False
        try:
            async with self._client().request(scope["method"], aiohttp.client.URL(url, encoded=True),
                                              data=body or None, headers=headers, allow_redirects=False) as resp:
                out = [(k, v) for k, v in resp.raw_headers
                       if k.decode("latin-1").lower() not in HOP_BY_HOP | RESPONSE_SET_BY_SERVER]
                await send({"type": "http.response.start", "status": resp.status, "headers": out})
                started = True
                async for chunk in resp.content.iter_any():
                    await send({"type": "http.response.body", "body": chunk, "more_body": True})
                await send({"type": "http.response.body", "body": b"", "more_body": False})
        except (aiohttp.ClientError, OSError, asyncio.TimeoutError) as exc:
            if self.on_unreachable is not None:
                self.on_unreachable(f"{type(exc).__name__}: {exc}")
            if started:  # the engine went away mid-answer: end the connection as it did
                raise
            reason = self.failure or f"engine at {self.target} unreachable: {type(exc).__name__}: {exc}"
            await _answer(send, 502, {"error": reason})


async def _disconnected(receive: Callable) -> None:
    """Return once the client has gone away."""
    while (await receive())["type"] != "http.disconnect":
        pass


async def _answer(send: Callable, status: int, body: Any) -> None:
    raw = json.dumps(body).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(raw)).encode())]})
    await send({"type": "http.response.body", "body": raw, "more_body": False})


class RecordingProxy:
    """A :class:`ForwardingProxy` to ``target`` behind a ``WireRecorder`` (as engine ``engine`` of ``wire``, refusing
    and holding as ``control`` says), on 127.0.0.1 in its own thread and event loop. ``url`` is what the integration
    talks to."""

    def __init__(self, target: str, engine: int, wire: WireLog, control: WireControl | None = None,
                 dialect: Dialect = SGLANG_DIALECT, on_unreachable: Callable[[str], None] | None = None) -> None:
        from fakes.server import LoopbackServer

        self.proxy = ForwardingProxy(target, on_unreachable=on_unreachable)
        self.control = wire.control() if control is None else control
        self.server = LoopbackServer(factory=lambda: WireRecorder(self.proxy, engine, wire, self.control, dialect),
                                     keep_alive_s=KEEP_ALIVE_S)

    @property
    def url(self) -> str:
        return self.server.url

    def start(self) -> "RecordingProxy":
        self.server.start()
        return self

    def stop(self) -> None:
        self.server.stop()
