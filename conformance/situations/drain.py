"""A drain that a long request outlasts: when a cycle's first pause, bump or transfer reaches an engine, one of the
integration's requests there goes on decoding for :data:`~.timing.DRAIN_S` more, so a pause that waits for the
requests in flight (vLLM's ``wait``) drains at least that long, and a drain that gives up early and aborts the
stragglers is seen (I1-I2). Built on the fake by stalling the engines for that long as the call goes on (a slow
engine: :func:`stall`); real engines cannot be slowed, so there the integration's turns decode twice that long
(:func:`turn_s`) and the cycle starts while one is young. Shown, the same way on both, by the wire
(:data:`SITUATION`)."""

from __future__ import annotations

from typing import Callable

from ..backends import Backend
from ..history import DISTURBING_PATHS, History, Injected, WireCall, finish_type
from .scene import Scene, Situation
from .timing import DRAIN_S, TURN_S


def _outlasted(h: History) -> bool:
    """A request of the integration's resident at a cycle's first pause, bump or transfer on its engine was still
    decoding :data:`~.timing.DRAIN_S` later, or was aborted before (what a drain that gives up does)."""
    for _, engine, first in h.disturbing_calls():
        for w in h.resident_at(engine, first.t_start):
            if w.origin == "integration" and (w.t_end is None or w.t_end >= first.t_start + DRAIN_S or any(
                    finish_type(o) == "abort" for o in w.generate_outputs())):
                return True
    return False


SITUATION = Situation("long-drain", f"update cycle whose first pause, bump or transfer met one of the integration's "
                      f"requests that went on decoding {DRAIN_S:g}s after it", _outlasted)


def turn_s(backend: Backend) -> float:
    """How long the integration's turns decode at least: :data:`~.timing.TURN_S` where the engines can be stalled,
    twice :data:`~.timing.DRAIN_S` where they cannot."""
    return TURN_S if backend.control.can_stall else 2 * DRAIN_S


def stall(scene: Scene) -> Callable[[], None]:
    """Stall every engine for :data:`~.timing.DRAIN_S` as the coming cycle's first pause, bump or transfer goes on
    (recorded as an injected ``stall``), where the backend can; returns the function that stops following the wire."""
    backend, started = scene.backend, [False]

    def follow(call: WireCall, answered: bool) -> None:
        if started[0] or answered or call.origin != "integration" or call.path not in DISTURBING_PATHS:
            return
        started[0] = True
        if backend.control.stall(DRAIN_S) is not None:
            scene.history.injected.append(Injected(backend.wire.clock(), "stall", call.engine, (
                f"every engine's decoding stopped for {DRAIN_S:g}s as the cycle's first {call.path} went on to engine "
                f"{call.engine} (a slow engine: a drain waits that much longer)")))
    return backend.wire.listen(follow)
