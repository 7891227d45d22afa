"""What the suite does at the wire, apart from recording it: make one engine refuse a call, hold calls before
they reach their engines, hold answers before they reach the integration.

The :class:`~conformance.wire.WireRecorder` of each engine asks its backend's :class:`WireControl` about every call
it records (refuse it? hold it? hold its answer?); the control never writes the record. A refusal is SGLang's failure
answer for that endpoint: the engine never sees the request, and the exchange is recorded like any other; or, where a
family's failure changes the engine (a vLLM reload that fails leaves it without weights), the request goes on with a
body the engine itself fails on. Being at the wire, the same fault and the same hold work in front of fake and real
engines.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from .history import WireCall
from .situations.waiting import Listen, wait_until


Rewrite = Callable[[Any], Any]
"""A call's JSON body → the body its engine gets instead (a fault the engine itself then answers)."""


@dataclass
class Refusal:
    """How calls on one (engine, path) are refused: answered at the wire with ``status``/``body``, or, with
    ``rewrite``, sent on to the engine with a body it fails on."""

    status: int
    body: Any
    left: int | None
    """Calls still to refuse; None: every one."""
    rewrite: Rewrite | None = None
    used: int = 0


@dataclass(frozen=True)
class Expired:
    """A held call that went on at its bound, ``ready`` still false (:meth:`WireControl.release_holds`)."""

    at: float
    """When it went on."""
    held_s: float
    """How long it was held."""
    then: bool | None
    """Whether ``then`` came true before it went on (None: the hold had no ``then``)."""


@dataclass
class _Hold:
    paths: frozenset[str]
    ready: Callable[[int, bool], bool]
    timeout_s: float
    then: Callable[[int], bool] | None = None
    then_timeout_s: float = 0.0
    passed: set[int] = field(default_factory=set)
    """Engines whose first held call arrived."""
    went: set[int] = field(default_factory=set)
    """Engines whose first held call went on to the engine."""
    expired: dict[int, Expired] = field(default_factory=dict)
    """Engines whose first held call went on at the bound, ``ready`` still false: when and how."""


_GENERATE = frozenset({"/generate"})


@dataclass
class AnswerHold:
    """The integration's answers on ``paths`` (from ``engine``, or every engine; only the first with ``first_only``)
    held back from it until ``release()`` is true (at most ``timeout_s``, a bound that starts again while
    ``waiting()`` is true): :meth:`WireControl.hold_answers`."""

    release: Callable[[], bool]
    timeout_s: float
    paths: frozenset[str] = _GENERATE
    engine: int | None = None
    first_only: bool = False
    waiting: Callable[[], bool] | None = None
    """While true, the bound does not run (e.g. a pause that drains waits for a request the suite knows will end)."""
    held: int = 0
    """Answers held so far."""
    held_at: float | None = None
    """When the first answer was held."""
    released_at: float | None = None
    """When the answers went on (None while they are held)."""
    released_by: str | None = None
    """``ready`` (``release()`` came true), ``timeout`` or ``end`` (:meth:`WireControl.release_holds` first)."""

    def applies(self, call: WireCall) -> bool:
        return (call.origin == "integration" and call.path in self.paths
                and (self.engine is None or call.engine == self.engine) and not (self.first_only and self.held))

    def go(self, by: str, now: float) -> None:
        if self.released_at is None:
            self.released_at, self.released_by = now, by


class WireControl:
    """Refusals and holds for every engine's recorder of one backend (thread-safe); ``clock`` as the wire log's."""

    def __init__(self, clock: Callable[[], float] = time.monotonic, listen: Listen | None = None) -> None:
        self.clock = clock
        self.listen = listen
        """The wire log's ``listen``: a held call or answer is looked at again whenever the wire records one."""
        self._lock = threading.Lock()
        self._refusals: dict[tuple[int, str], Refusal] = {}
        self._hold: _Hold | None = None
        self._answers: AnswerHold | None = None
        self._holding = 0
        self._frozen: list[tuple[float, float]] = []
        self._frozen_since: float | None = None
        self.freeze: Callable[[bool], None] | None = None
        """Called with True when :meth:`hold_first` starts holding a call (or :meth:`stall` starts) and with False
        once none is held: a fake backend stops its engines' decoding meanwhile, so the requests resident when a
        disturbing call arrived are resident when it goes on, however long the hold and however loaded the machine
        (real engines cannot)."""
        self.keep_engines: Callable[[bool], None] | None = None
        """Real engines' own pause that keeps their requests where they are (True), and its resume (False), called
        past the wire: how :meth:`keep` stops engines that cannot :meth:`stall` (None: the backend has no such
        pause)."""
        self._kept_since: float | None = None
        self.keep_failed: str | None = None
        """Why the last :meth:`keep` on real engines failed to pause them (None: it did not)."""
        self.left_paused: str | None = None
        """Why the last :meth:`keep` may have left an engine paused: its resume failed (None: it did not). What the
        integration does after is then the suite's doing: the run breaks."""

    def refuse(self, engine: int, path: str, status: int, body: Any, times: int | None = 1,
               rewrite: Rewrite | None = None) -> None:
        """Answer the next ``times`` ``path`` calls to ``engine`` (every one until cleared with None) with
        ``status``/``body`` (JSON), not forwarding them; with ``rewrite``, forward them with the body it makes."""
        with self._lock:
            self._refusals[(engine, path)] = Refusal(status, body, times, rewrite)

    def take_refusal(self, engine: int, path: str) -> Refusal | None:
        """The refusal of this call, consumed once; None when there is none."""
        with self._lock:
            refusal = self._refusals.get((engine, path))
            if refusal is None or refusal.left == 0:
                return None
            refusal.used += 1
            if refusal.left is not None:
                refusal.left -= 1
            return refusal

    def clear_refusals(self) -> list[tuple[int, str]]:
        """Forget the refusals; the (engine, path) of those no call used."""
        with self._lock:
            unused = sorted(key for key, refusal in self._refusals.items() if not refusal.used)
            self._refusals.clear()
            return unused

    def hold_first(self, paths: frozenset[str], ready: Callable[[int, bool], bool], timeout_s: float,
                   then: Callable[[int], bool] | None = None, then_timeout_s: float = 0.0) -> None:
        """Hold the integration's first call to one of ``paths`` on each engine, before it goes on to the engine,
        until ``ready(engine, another_went)`` is true (``another_went``: another engine's held call already went
        on), at most ``timeout_s``, until :meth:`release_holds`. With ``then``, a call whose bound passed with
        ``ready`` false is held on while ``then(engine)`` is false, at most ``then_timeout_s`` more (the least the
        situation needs, e.g. some request resident there)."""
        with self._lock:
            self._hold = _Hold(paths, ready, timeout_s, then, then_timeout_s)

    def holding(self) -> tuple[set[int], set[int]] | None:
        """While :meth:`hold_first` holds: the engines whose first call is held now, and those whose call went on."""
        with self._lock:
            hold = self._hold
            return None if hold is None else (hold.passed - hold.went, set(hold.went))

    def hold_answers(self, release: Callable[[], bool], timeout_s: float, paths: frozenset[str] = _GENERATE,
                     engine: int | None = None, first_only: bool = False,
                     waiting: Callable[[], bool] | None = None) -> AnswerHold:
        """Hold back every answer to the integration's calls on ``paths`` (from ``engine``, or every engine; only the
        first with ``first_only``), once the engine produced it, until ``release()`` is true (looked at as the wire
        records calls; at most ``timeout_s`` after ``waiting()``, if given, was last true), until
        :meth:`release_holds`. The call's end is stamped when its answer goes on (when the integration could read
        it)."""
        hold = AnswerHold(release, timeout_s, frozenset(paths), engine, first_only, waiting)
        with self._lock:
            self._answers = hold
        return hold

    @property
    def can_stall(self) -> bool:
        """Whether the engines behind this wire can be stopped (a fake backend's: :attr:`freeze`; real engines
        cannot be slowed)."""
        return self.freeze is not None

    def stall(self, seconds: float) -> Callable[[], None] | None:
        """Stop every engine's decoding for ``seconds``, as a slow engine would: a pause that waits for the requests
        in flight drains that much longer, and a request the cycle retracted or froze ends that much later. Returns
        the function that ends the stall sooner (stalls overlap: decoding goes on once none is left), or None where
        the backend cannot stall (:attr:`can_stall`)."""
        if not self.can_stall:
            return None
        self._held_one(+1)
        return _once_within(seconds, lambda: self._held_one(-1), wait=False)

    def keep(self, seconds: float) -> Callable[[], None] | None:
        """Stop every engine's decoding for at most ``seconds``, keeping its requests where they are: :meth:`stall`
        where the backend can, else the engines' own keep-pause (:attr:`keep_engines`; a pause that failed is
        resumed). Returns the function that ends it sooner (the resume is answered when it returns), or None where
        neither is possible."""
        if self.can_stall:
            return self.stall(seconds)
        hook, self.keep_failed, self.left_paused = self.keep_engines, None, None
        if hook is None:
            return None
        try:
            hook(True)
        except Exception as exc:  # an engine that could not be paused: none stays paused, the builder aims as it can
            self.keep_failed = f"the engines' keep-pause failed ({type(exc).__name__}: {exc})"
            self._resume(hook)
            return None
        with self._lock:
            self._kept_since = self.clock()

        def unkeep() -> None:
            self._resume(hook)
            with self._lock:
                self._frozen.append((self._kept_since, self.clock()))  # type: ignore[arg-type]
                self._kept_since = None
        return _once_within(seconds, unkeep)

    def _resume(self, hook: Callable[[bool], None]) -> None:
        try:
            hook(False)
        except Exception as exc:  # an engine left paused is the suite's doing: said by left_paused
            self.left_paused = f"the engines' resume after a keep-pause failed ({type(exc).__name__}: {exc})"

    def release_holds(self) -> dict[int, Expired]:
        """End every hold; the engines whose first call :meth:`hold_first` held went on at its bound, not ready (and
        when and how)."""
        with self._lock:
            hold, self._hold = self._hold, None
            answers, self._answers = self._answers, None
        if answers is not None:
            answers.go("end", self.clock())
        return dict(hold.expired) if hold is not None else {}

    async def answer_held(self, call: WireCall) -> None:
        """Wait while the answer to ``call`` is held (:meth:`hold_answers`)."""
        with self._lock:
            hold = self._answers
            if hold is None or not hold.applies(call):
                return
            hold.held += 1
            if hold.held_at is None:
                hold.held_at = self.clock()
        ready = await wait_until(hold.release, hold.timeout_s, wake=self.listen, clock=self.clock,
                                 standing=lambda: hold.released_at is None, restart=hold.waiting)
        hold.go("ready" if ready else "timeout", self.clock())  # no-op where another answer's wait released it

    async def held(self, call: WireCall) -> bool:
        """Wait while ``call`` is held (:meth:`hold_first`); whether it was (the recorder then stamps its start when
        it goes on)."""
        with self._lock:
            hold = self._hold
            if hold is None or call.origin != "integration" or call.path not in hold.paths \
                    or call.engine in hold.passed:
                return False
            hold.passed.add(call.engine)
        self._held_one(+1)
        try:
            arrived = self.clock()
            standing = lambda: self._hold is hold  # noqa: E731
            ready = await wait_until(lambda: hold.ready(call.engine, bool(hold.went - {call.engine})),
                                     hold.timeout_s, wake=self.listen, clock=self.clock, standing=standing)
            then = None
            if not ready and hold.then is not None:
                then = await wait_until(lambda: hold.then(call.engine), hold.then_timeout_s, wake=self.listen,
                                        clock=self.clock, standing=standing)
            with self._lock:
                hold.went.add(call.engine)
                if not ready and self._hold is hold:
                    now = self.clock()
                    hold.expired[call.engine] = Expired(now, now - arrived, then)
        finally:
            self._held_one(-1)
        return True

    def _held_one(self, change: int) -> None:
        """Count the calls :meth:`held` holds now (and a stall); :attr:`freeze` as the count leaves or reaches 0."""
        with self._lock:
            before = self._holding
            self._holding += change
            edge = self.freeze is not None and (before == 0) != (self._holding == 0)
            frozen = self._holding > 0
            if edge and frozen:
                self._frozen_since = self.clock()
            elif edge and self._frozen_since is not None:
                self._frozen.append((self._frozen_since, self.clock()))
                self._frozen_since = None
        if edge:
            self.freeze(frozen)  # type: ignore[misc]  (edge implies a hook)

    def decode_time(self, t0: float, t1: float) -> float:
        """Seconds of ``[t0, t1]`` in which the engines decoded: less the time :attr:`freeze` or :meth:`keep` stopped
        them (a request sent at ``t0`` has decoded this long at ``t1``, as far as the clock can tell)."""
        with self._lock:
            spans = [*self._frozen, *[(since, t1) for since in (self._frozen_since, self._kept_since)
                                      if since is not None]]
        return (t1 - t0) - sum(max(0.0, min(b, t1) - max(a, t0)) for a, b in spans)


def _once_within(seconds: float, finish: Callable[[], None], wait: bool = True) -> Callable[[], None]:
    """``finish`` run once: by the function returned, or after ``seconds`` (a daemon timer) if that is not called
    first. With ``wait`` every call returns once ``finish`` has returned (a fake's stall ends at once): a recorder
    thread that ends a keep while another thread's resume is under way must not forward its call before the engines
    are resumed (two engines' pauses, two recorder threads: real vLLM resumed after the integration's own pause, then
    crashed in its weight update)."""
    lock, finished, started = threading.Lock(), threading.Event(), [False]

    def end() -> None:
        with lock:
            first, started[0] = not started[0], True
        if not first:
            if wait:
                finished.wait(FINISH_S)
            return
        timer.cancel()
        try:
            finish()
        finally:
            finished.set()
    timer = threading.Timer(seconds, end)
    timer.daemon = True
    timer.start()
    return end


FINISH_S = 60.0
"""The most a second caller of a stall's or keep's end waits for the first one's resume (each engine's answer is
bounded by the backend's own timeout)."""
