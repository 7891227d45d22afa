"""Tiny hand-rolled ASGI helpers: routes as data, request reading, JSON / plain-text / SSE replies."""

from __future__ import annotations

import asyncio
import contextlib
import json
from dataclasses import dataclass, field
from typing import Any, AsyncIterator, Awaitable, Callable
from urllib.parse import parse_qsl

Scope = dict[str, Any]
Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]

NOT_FOUND_BODY = {"detail": "Not Found"}  # FastAPI/Starlette default 404
METHOD_NOT_ALLOWED_BODY = {"detail": "Method Not Allowed"}


@dataclass
class Reply:
    """An HTTP answer: ``body`` dict/list → JSON, str → text/plain, None → empty; or an SSE ``stream``."""

    status: int = 200
    body: Any = None
    stream: AsyncIterator[Any] | None = None
    headers: dict[str, str] = field(default_factory=dict)

    @property
    def is_stream(self) -> bool:
        return self.stream is not None


class _JSONNull:
    """The body of a FastAPI handler that returns None: JSON ``null``."""

    def __repr__(self) -> str:
        return "JSON_NULL"


JSON_NULL = _JSONNull()


@dataclass
class HTTPRequest:
    """What a handler needs from one HTTP request."""

    method: str
    path: str
    query: dict[str, str]
    """Each query parameter's last value."""
    body: bytes
    receive: Receive
    raw_query: str = ""
    """The query string as sent (a parameter given several times: ``urllib.parse.parse_qs``)."""
    headers: dict[str, str] = field(default_factory=dict)
    """The request's headers, names in lower case (a header sent twice: its last value)."""

    def text(self) -> str:
        return self.body.decode("utf-8", errors="replace")


Handler = Callable[[HTTPRequest], Awaitable[Reply]]


@dataclass(frozen=True)
class Route:
    """One route: exact ``path``, allowed ``methods``, the handler, and whether it is a control call."""

    path: str
    methods: tuple[str, ...]
    handler: Handler
    control: bool = True


_ENCODER = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False)  # what json.dumps(...) builds per call


def dumps(obj: Any) -> bytes:
    """Compact JSON like SGLang's ORJSONResponse."""
    return _ENCODER.encode(obj).encode("utf-8")


async def read_body(receive: Receive) -> bytes:
    chunks: list[bytes] = []
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            break
        chunks.append(message.get("body", b""))
        if not message.get("more_body", False):
            break
    return b"".join(chunks)


_JSON, _TEXT, _OCTETS, _SSE = (
    "application/json", "text/plain; charset=utf-8", "application/octet-stream", "text/event-stream; charset=utf-8"
)
_CONTENT_TYPES = {t: t.encode() for t in (_JSON, _TEXT, _OCTETS, _SSE)}


async def _start(send: Send, status: int, content_type: str | None, headers: dict[str, str]) -> None:
    raw = [(k.lower().encode(), v.encode()) for k, v in headers.items()]
    if content_type is not None:
        raw.append((b"content-type", _CONTENT_TYPES.get(content_type) or content_type.encode()))
    await send({"type": "http.response.start", "status": status, "headers": raw})


async def send_reply(send: Send, reply: Reply) -> None:
    """Write ``reply`` to the ASGI ``send`` channel (SSE: ``data: <json>\\n\\n`` ... ``data: [DONE]\\n\\n``)."""
    if reply.stream is not None:
        stream = reply.stream
        try:
            await _start(send, reply.status, _SSE, reply.headers)
            async for item in stream:
                await send({"type": "http.response.body", "body": b"data: " + dumps(item) + b"\n\n", "more_body": True})
            await send({"type": "http.response.body", "body": b"data: [DONE]\n\n", "more_body": False})
        finally:
            aclose = getattr(stream, "aclose", None)
            if aclose is not None:
                await aclose()  # runs the generator's cleanup (aborts unfinished requests) on early exit
        return
    if reply.body is None:
        payload, content_type = b"", None
    elif reply.body is JSON_NULL:
        payload, content_type = b"null", _JSON
    elif isinstance(reply.body, str):
        payload, content_type = reply.body.encode("utf-8"), _TEXT
    elif isinstance(reply.body, bytes):
        payload, content_type = reply.body, _OCTETS
    else:
        payload, content_type = dumps(reply.body), _JSON
    headers = {"content-length": str(len(payload)), **reply.headers}
    await _start(send, reply.status, content_type, headers)
    await send({"type": "http.response.body", "body": payload, "more_body": False})


class Router:
    """Exact-path routing over a list of ``Route``s, plus ``/prefix/{name:path}`` routes (any non-empty rest);
    404/405 bodies as FastAPI writes them."""

    def __init__(self, routes: list[Route]) -> None:
        self.routes: dict[str, Route] = {}
        self.prefixes: list[tuple[str, Route]] = []
        for route in routes:
            if route.path in self.routes:
                raise ValueError(f"duplicate route {route.path}")
            self.routes[route.path] = route
            if route.path.endswith(":path}"):
                self.prefixes.append((route.path[: route.path.rindex("{")], route))

    def match(self, method: str, path: str) -> Route | Reply:
        route = self.routes.get(path)
        if route is None:
            route = next((r for prefix, r in self.prefixes if path.startswith(prefix) and len(path) > len(prefix)),
                         None)
        if route is None:
            return Reply(404, NOT_FOUND_BODY)
        if method not in route.methods:
            return Reply(405, METHOD_NOT_ALLOWED_BODY)
        return route


def request_from_scope(scope: Scope, body: bytes, receive: Receive) -> HTTPRequest:
    raw_query = scope.get("query_string", b"")
    query = dict(parse_qsl(raw_query.decode("latin-1"), keep_blank_values=True)) if raw_query else {}
    headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers") or ()}
    return HTTPRequest(method=scope["method"], path=scope["path"], query=query, body=body, receive=receive,
                       raw_query=raw_query.decode("latin-1"), headers=headers)


async def lifespan(receive: Receive, send: Send, on_shutdown: Callable[[], Awaitable[None]] | None = None) -> None:
    """Acknowledge ASGI lifespan startup; run ``on_shutdown`` before acknowledging shutdown."""
    while True:
        message = await receive()
        if message["type"] == "lifespan.startup":
            await send({"type": "lifespan.startup.complete"})
        elif message["type"] == "lifespan.shutdown":
            if on_shutdown is not None:
                await on_shutdown()
            await send({"type": "lifespan.shutdown.complete"})
            return


async def until_disconnect(serving: Awaitable[None], receive: Receive) -> None:
    """Run ``serving``; if the client disconnects first, cancel it (its cleanup aborts the requests, as SGLang's
    ``create_abort_task`` / ``is_disconnected`` checks and vLLM's ``with_cancellation`` do).

    ``serving`` runs in the calling task (one watcher task per call, not two tasks and an ``asyncio.wait``): the
    watcher cancels this task on disconnect, and that one cancellation is absorbed here. Python < 3.11 (no
    ``Task.uncancel``) keeps the two-task form."""
    task = asyncio.current_task()
    if task is None or not hasattr(task, "uncancel"):
        await _until_disconnect_two_tasks(serving, receive)
        return
    state = [False, False]  # [serving over, this task cancelled by the watcher]

    async def disconnected() -> None:
        try:
            while (await receive())["type"] != "http.disconnect":
                pass
        finally:  # the client left (or receive failed) while serving: stop serving
            if not state[0]:
                state[1] = True
                task.cancel()

    watcher = asyncio.ensure_future(disconnected())
    try:
        await serving
    except asyncio.CancelledError:
        if not state[1] or task.uncancel() > 0:  # not (only) the client leaving: propagate
            raise
    else:
        if state[1]:  # serving swallowed the cancellation: forget it was requested
            task.uncancel()
    finally:
        state[0] = True
        watcher.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await watcher


async def _until_disconnect_two_tasks(serving: Awaitable[None], receive: Receive) -> None:
    work = asyncio.ensure_future(serving)

    async def disconnected() -> None:
        while (await receive())["type"] != "http.disconnect":
            pass

    watcher = asyncio.ensure_future(disconnected())
    try:
        await asyncio.wait({work, watcher}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        if not work.done():
            work.cancel()
        watcher.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await watcher
        with contextlib.suppress(asyncio.CancelledError):
            await work
