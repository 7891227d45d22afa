"""Recording what crosses the wire between the integration and each engine.

:class:`WireRecorder` is ASGI middleware. On the fake backend it wraps the fake engine's app in process; on a
real backend it wraps a forwarding proxy. Either way the integration talks real HTTP to its URL and every
exchange becomes a :class:`~conformance.history.WireCall`. Requests carrying the ``x-conformance-probe``
header (the suite's own probes and the aborts it injects) are not recorded; requests carrying
``x-conformance-sentinel`` (the suite's own long-lived requests, :mod:`conformance.situations.sentinels`) are recorded with
``origin="sentinel"``, so checkers can tell them from the integration's.

The recorder only records. What the suite does at the wire besides (a refusal, a held call, a held answer) is
asked of a :class:`~conformance.wire_control.WireControl` the recorder is given.
"""

from __future__ import annotations

import itertools
import json
import threading
import time
from dataclasses import replace
from typing import Any, Awaitable, Callable

from .dialect import SGLANG_DIALECT, Dialect
from .history import WireCall
from .wire_control import WireControl

ASGIApp = Callable[[dict, Callable[[], Awaitable[dict]], Callable[[dict], Awaitable[None]]], Awaitable[None]]
PROBE_HEADER = "x-conformance-probe"
SENTINEL_HEADER = "x-conformance-sentinel"


def _decode(raw: bytes, content_type: str) -> Any:
    if not raw:
        return None
    text = raw.decode("utf-8", "replace")
    if "text/event-stream" in content_type:
        events = [line[5:].strip() for line in text.splitlines() if line.startswith("data:")]
        events = [e for e in events if e and e != "[DONE]"]
        text = events[-1] if events else ""
    try:
        return json.loads(text)
    except ValueError:
        return text


class WireLog:
    """Thread-safe, append-only list of wire calls shared by every engine's recorder; ``clock`` stamps them
    (monotonic seconds; the replay passes its virtual clock)."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self.calls: list[WireCall] = []
        self._seq = itertools.count()
        self._lock = threading.Lock()
        self._listeners: list[Callable[[WireCall, bool], None]] = []
        self._syncs: list[Callable[[], None]] = []

    def sync_with(self, sync: Callable[[], None]) -> Callable[[], None]:
        """Call ``sync()`` before each stamp, so what another recorder saw happen before a call's start or answer is
        stamped before it (:meth:`conformance.fswatch.DirectoryWatch.sync`); returns the function that stops."""
        return self._register(self._syncs, sync)

    def _sync(self) -> None:
        """Run every :meth:`sync_with` function (before a stamp is read)."""
        with self._lock:
            syncs = list(self._syncs)
        for sync in syncs:
            sync()

    def control(self) -> WireControl:
        """A new :class:`WireControl` for this log's recorders: on its clock, its holds woken by its calls."""
        return WireControl(self.clock, self.listen)

    def listen(self, listener: Callable[[WireCall, bool], None]) -> Callable[[], None]:
        """Call ``listener(call, answered)`` (from the recorder's thread) when a call is sent (``answered`` False)
        and when it gets its answer (True); returns the function that stops listening."""
        return self._register(self._listeners, listener)

    def _register(self, into: list[Any], item: Any) -> Callable[[], None]:
        """Add ``item`` to ``into`` (under the lock); the function that removes it again."""
        with self._lock:
            into.append(item)

        def stop() -> None:
            with self._lock:
                if item in into:
                    into.remove(item)
        return stop

    def open(self, engine: int, method: str, path: str, payload: Any, origin: str = "integration",
             sent_as: str | None = None, announce: bool = True) -> WireCall:
        """Record a call as it arrives; listeners hear of it now, or, with ``announce`` false, once it goes on to its
        engine (:meth:`went_on`)."""
        self._sync()
        with self._lock:
            call = WireCall(next(self._seq), engine, method, path, payload, self.clock(), origin=origin,
                            sent_as=sent_as)
            self.calls.append(call)
        if announce:
            self._notify(call, False)
        return call

    def went_on(self, call: WireCall, held: bool) -> None:
        """``call`` goes on to its engine: listeners hear that it was sent; one that was ``held`` at the recorder has
        its start stamped now (a listener that reacts to a pause, e.g. by no longer renewing a long-lived request,
        must not react while the pause is still held back from the engine)."""
        if held:
            self._sync()
            with self._lock:
                call.t_start = self.clock()
        self._notify(call, False)

    def close(self, call: WireCall, status: int | None, response: Any) -> None:
        self._sync()
        with self._lock:
            call.t_end, call.status, call.response = self.clock(), status, response
        self._notify(call, True)

    def _notify(self, call: WireCall, answered: bool) -> None:
        with self._lock:
            listeners = list(self._listeners)
        for listener in listeners:
            listener(call, answered)

    def in_flight(self, path: str = "/generate", min_age_s: float = 0.0, before: float | None = None) -> dict[int, int]:
        """The integration's open calls per engine (opened at least ``min_age_s`` ago, and before ``before``)."""
        now = self.clock()
        newest = now - min_age_s if before is None else min(before, now - min_age_s)
        with self._lock:
            counts: dict[int, int] = {}
            for c in self.calls:
                if c.path == path and c.t_end is None and c.t_start <= newest and c.origin == "integration":
                    counts[c.engine] = counts.get(c.engine, 0) + 1
            return counts

    def completed(self, path: str = "/generate") -> int:
        with self._lock:
            return sum(1 for c in self.calls if c.path == path and c.t_end is not None and c.origin == "integration")

    def open_calls(self) -> list[WireCall]:
        """Every call still waiting for its answer (the integration's and the sentinels'), oldest first."""
        with self._lock:
            return [c for c in self.calls if c.t_end is None]

    def snapshot(self) -> list[WireCall]:
        with self._lock:
            return list(self.calls)

    def frozen(self) -> list[WireCall]:
        """Copies of the calls as they stand now: a call answered later (at the teardown) does not change them, so a
        history's times stay on its own clock once rebased."""
        with self._lock:
            return [replace(call) for call in self.calls]


class WireRecorder:
    """ASGI middleware recording every HTTP exchange with ``app`` as engine ``engine`` into ``log``, in the suite's
    vocabulary (``dialect``: the engine family's, :mod:`conformance.dialect`); with ``control``, each call is refused
    or held as it says."""

    def __init__(self, app: ASGIApp, engine: int, log: WireLog, control: WireControl | None = None,
                 dialect: Dialect = SGLANG_DIALECT) -> None:
        self.app, self.engine, self.log = app, engine, log
        self.control = log.control() if control is None else control
        self.dialect = dialect.fresh()

    async def __call__(self, scope: dict, receive: Callable, send: Callable) -> None:
        names = {k.decode().lower() for k, _ in scope.get("headers", [])}
        if scope["type"] != "http" or PROBE_HEADER in names:
            await self.app(scope, receive, send)
            return
        body = bytearray()
        more = True
        while more:
            message = await receive()
            body += message.get("body", b"")
            more = message.get("more_body", False)
        headers = {k.decode().lower(): v.decode() for k, v in scope.get("headers", [])}
        query = scope.get("query_string", b"").decode()
        path, payload = self.dialect.recorded(scope["method"], scope["path"], query,
                                              _decode(bytes(body), headers.get("content-type", "application/json")))
        sent_as = None if self.dialect is SGLANG_DIALECT else \
            f"{scope['method']} {scope['path']}{'?' + query if query else ''}"
        call = self.log.open(self.engine, scope["method"], path, payload,
                             origin="sentinel" if SENTINEL_HEADER in names else "integration", sent_as=sent_as,
                             announce=False)
        self.log.went_on(call, held=await self.control.held(call))
        refusal = self.control.take_refusal(self.engine, path)
        if refusal is not None and refusal.rewrite is None:
            await self._refuse(call, send, refusal.status, refusal.body)
            return
        if refusal is not None and refusal.rewrite is not None:  # the engine fails it itself
            body = bytearray(json.dumps(refusal.rewrite(_decode(bytes(body), "application/json"))).encode())
        replayed = False

        async def replay() -> dict:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": bytes(body), "more_body": False}
            return await receive()

        status: int | None = None
        content_type = ""
        chunks = bytearray()

        async def record(message: dict) -> None:
            nonlocal status, content_type
            if message["type"] == "http.response.start":
                await self.control.answer_held(call)
                status = message["status"]
                content_type = next((v.decode() for k, v in message.get("headers", [])
                                     if k.lower() == b"content-type"), "")
            elif message["type"] == "http.response.body":
                chunks.extend(message.get("body", b""))
                if not message.get("more_body", False):
                    self.log.close(call, status, self._answer(call, chunks, content_type))
            await send(message)

        try:
            await self.app(scope, replay, record)
        finally:
            if call.t_end is None:
                self.log.close(call, status, self._answer(call, chunks, content_type) if status else None)

    def _answer(self, call: WireCall, chunks: bytearray, content_type: str) -> Any:
        return self.dialect.answered(call.path, call.payload, _decode(bytes(chunks), content_type))

    async def _refuse(self, call: WireCall, send: Callable, status: int, body: Any) -> None:
        raw = json.dumps(body).encode()
        await send({"type": "http.response.start", "status": status,
                    "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(raw)).encode())]})
        await send({"type": "http.response.body", "body": raw})
        self.log.close(call, status, body)
