"""Recording what crosses the wire between the integration and each engine.

:class:`WireRecorder` is ASGI middleware. On the fake backend it wraps the fake engine's app in process; on a
real backend it wraps a forwarding proxy. Either way the integration talks real HTTP to its URL and every
exchange becomes a :class:`~conformance.history.WireCall`. Requests carrying the ``x-conformance-probe``
header (the suite's own probes and the aborts it injects) are not recorded; requests carrying
``x-conformance-sentinel`` (the suite's own long-lived requests, :mod:`conformance.sentinels`) are recorded with
``origin="sentinel"``, so checkers can tell them from the integration's.

The recorder is also where the suite makes one engine refuse a call (:meth:`WireLog.refuse`): the answer is
SGLang's failure answer for that endpoint, the engine never sees the request, and the exchange is recorded like
any other. Being at the wire, the same fault works in front of fake and real engines.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import threading
import time
from dataclasses import dataclass, field, replace
from typing import Any, Awaitable, Callable

from .history import WireCall

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


@dataclass
class _Refusal:
    status: int
    body: Any
    left: int | None
    """Calls still to refuse; None: every one."""
    used: int = 0


@dataclass
class _Hold:
    paths: frozenset[str]
    ready: Callable[[int, bool], bool]
    timeout_s: float
    passed: set[int] = field(default_factory=set)
    """Engines whose first held call arrived."""
    went: set[int] = field(default_factory=set)
    """Engines whose first held call went on to the engine."""


_GENERATE = frozenset({"/generate"})


@dataclass
class AnswerHold:
    """The integration's answers on ``paths`` (from ``engine``, or every engine; only the first with ``first_only``)
    held back from it until ``release()`` is true (at most ``timeout_s``): :meth:`WireLog.hold_answers`."""

    release: Callable[[], bool]
    timeout_s: float
    paths: frozenset[str] = _GENERATE
    engine: int | None = None
    first_only: bool = False
    held: int = 0
    """Answers held so far."""
    held_at: float | None = None
    """When the first answer was held."""
    released_at: float | None = None
    """When the answers went on (None while they are held)."""
    released_by: str | None = None
    """``ready`` (``release()`` came true), ``timeout`` or ``end`` (:meth:`WireLog.release_holds` first)."""

    def applies(self, call: WireCall) -> bool:
        return (call.origin == "integration" and call.path in self.paths
                and (self.engine is None or call.engine == self.engine) and not (self.first_only and self.held))

    def go(self, by: str, now: float) -> None:
        if self.released_at is None:
            self.released_at, self.released_by = now, by


class WireLog:
    """Thread-safe, append-only list of wire calls shared by every engine's recorder; ``clock`` stamps them
    (monotonic seconds; the replay passes its virtual clock)."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self.calls: list[WireCall] = []
        self._seq = itertools.count()
        self._lock = threading.Lock()
        self._refusals: dict[tuple[int, str], _Refusal] = {}
        self._listeners: list[Callable[[WireCall, bool], None]] = []
        self._hold: _Hold | None = None
        self._answers: AnswerHold | None = None

    def listen(self, listener: Callable[[WireCall, bool], None]) -> Callable[[], None]:
        """Call ``listener(call, answered)`` (from the recorder's thread) when a call is sent (``answered`` False)
        and when it gets its answer (True); returns the function that stops listening."""
        with self._lock:
            self._listeners.append(listener)

        def stop() -> None:
            with self._lock:
                if listener in self._listeners:
                    self._listeners.remove(listener)
        return stop

    def refuse(self, engine: int, path: str, status: int, body: Any, times: int | None = 1) -> None:
        """Answer the next ``times`` ``path`` calls to ``engine`` (every one until cleared with None) with
        ``status``/``body`` (JSON), not forwarding them."""
        with self._lock:
            self._refusals[(engine, path)] = _Refusal(status, body, times)

    def take_refusal(self, engine: int, path: str) -> tuple[int, Any] | None:
        """The refusal answering this call (status, body), consumed once; None when there is none."""
        with self._lock:
            refusal = self._refusals.get((engine, path))
            if refusal is None or refusal.left == 0:
                return None
            refusal.used += 1
            if refusal.left is not None:
                refusal.left -= 1
            return refusal.status, refusal.body

    def clear_refusals(self) -> list[tuple[int, str]]:
        """Forget the refusals; the (engine, path) of those no call used."""
        with self._lock:
            unused = sorted(key for key, refusal in self._refusals.items() if not refusal.used)
            self._refusals.clear()
            return unused

    def hold_first(self, paths: frozenset[str], ready: Callable[[int, bool], bool], timeout_s: float) -> None:
        """Hold the integration's first call to one of ``paths`` on each engine, before it goes on to the engine,
        until ``ready(engine, another_went)`` is true (``another_went``: another engine's held call already went
        on), at most ``timeout_s``, until :meth:`release_holds`."""
        with self._lock:
            self._hold = _Hold(paths, ready, timeout_s)

    def holding(self) -> tuple[set[int], set[int]] | None:
        """While :meth:`hold_first` holds: the engines whose first call is held now, and those whose call went on."""
        with self._lock:
            hold = self._hold
            return None if hold is None else (hold.passed - hold.went, set(hold.went))

    def hold_answers(self, release: Callable[[], bool], timeout_s: float, paths: frozenset[str] = _GENERATE,
                     engine: int | None = None, first_only: bool = False) -> AnswerHold:
        """Hold back every answer to the integration's calls on ``paths`` (from ``engine``, or every engine; only the
        first with ``first_only``), once the engine produced it, until ``release()`` is true (polled; at most
        ``timeout_s``), until :meth:`release_holds`. The call's end is stamped when its answer goes on (when the
        integration could read it)."""
        hold = AnswerHold(release, timeout_s, frozenset(paths), engine, first_only)
        with self._lock:
            self._answers = hold
        return hold

    def release_holds(self) -> None:
        with self._lock:
            self._hold = None
            answers, self._answers = self._answers, None
        if answers is not None:
            answers.go("end", self.clock())

    async def answer_held(self, call: WireCall) -> None:
        """Wait while the answer to ``call`` is held (:meth:`hold_answers`)."""
        with self._lock:
            hold = self._answers
            if hold is None or not hold.applies(call):
                return
            hold.held += 1
            if hold.held_at is None:
                hold.held_at = self.clock()
        deadline = self.clock() + hold.timeout_s
        while hold.released_at is None:
            if hold.release():
                hold.go("ready", self.clock())
            elif self.clock() >= deadline:
                hold.go("timeout", self.clock())
            else:
                await asyncio.sleep(0.001)

    async def held(self, call: WireCall) -> None:
        """Wait while ``call`` is held (:meth:`hold_first`); its start is then stamped when it goes on."""
        with self._lock:
            hold = self._hold
            if hold is None or call.origin != "integration" or call.path not in hold.paths \
                    or call.engine in hold.passed:
                return
            hold.passed.add(call.engine)
        deadline = self.clock() + hold.timeout_s
        while self._hold is hold and self.clock() < deadline and not hold.ready(call.engine,
                                                                                 bool(hold.went - {call.engine})):
            await asyncio.sleep(0.001)
        with self._lock:
            hold.went.add(call.engine)
            call.t_start = self.clock()

    def open(self, engine: int, method: str, path: str, payload: Any, origin: str = "integration") -> WireCall:
        with self._lock:
            call = WireCall(next(self._seq), engine, method, path, payload, self.clock(), origin=origin)
            self.calls.append(call)
        self._notify(call, False)
        return call

    def close(self, call: WireCall, status: int | None, response: Any) -> None:
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
    """ASGI middleware recording every HTTP exchange with ``app`` as engine ``engine``."""

    def __init__(self, app: ASGIApp, engine: int, log: WireLog) -> None:
        self.app, self.engine, self.log = app, engine, log

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
        call = self.log.open(self.engine, scope["method"], scope["path"],
                             _decode(bytes(body), headers.get("content-type", "application/json")),
                             origin="sentinel" if SENTINEL_HEADER in names else "integration")
        await self.log.held(call)
        refusal = self.log.take_refusal(self.engine, scope["path"])
        if refusal is not None:
            await self._refuse(call, send, *refusal)
            return
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
                await self.log.answer_held(call)
                status = message["status"]
                content_type = next((v.decode() for k, v in message.get("headers", [])
                                     if k.lower() == b"content-type"), "")
            elif message["type"] == "http.response.body":
                chunks.extend(message.get("body", b""))
                if not message.get("more_body", False):
                    self.log.close(call, status, _decode(bytes(chunks), content_type))
            await send(message)

        try:
            await self.app(scope, replay, record)
        finally:
            if call.t_end is None:
                self.log.close(call, status, _decode(bytes(chunks), content_type) if status else None)

    async def _refuse(self, call: WireCall, send: Callable, status: int, body: Any) -> None:
        raw = json.dumps(body).encode()
        await send({"type": "http.response.start", "status": status,
                    "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(raw)).encode())]})
        await send({"type": "http.response.body", "body": raw})
        self.log.close(call, status, body)
