"""Resident requests at a disturbing call: a cycle's first pause, bump or transfer reaches each engine while one of
the integration's requests is decoding there (what I1-I2 judges). The judge reads it off the wire (:data:`SITUATION`:
a request open on that engine when the call went on, :func:`~conformance.history.resident_at`); the builder holds
that call at the wire until the same predicate holds, aiming at a request with decode time to spare so that it is
still decoding when a cycle that goes from engine to engine reaches the others."""

from __future__ import annotations

import math
from typing import Callable

from ..history import DISTURBING_PATHS, History, Injected, WireCall, resident_at
from ..wire_control import Expired
from .producer import Producer, busy_everywhere
from .scene import Scene, Situation, generates, turn
from .timing import LAST_CHANCE, SETTLE_S, SPARE, START_TIMEOUT_S, decode_rate
from .waiting import wait_until


def _shown(h: History) -> bool:
    """A cycle's first pause, bump or transfer reached an engine while one of the integration's requests was decoding
    there. Not the cycle's start: on a starved machine a short turn open when the cycle began can end before the
    cycle's first call reaches its engine (real vLLM 0.32.0 in CI, 0.15 s turns), and one sent after the start can be
    the one the pause meets (the builder holds that call until it does: :func:`holds_young`)."""
    return any(w.origin == "integration" for _, engine, first in h.disturbing_calls()
               for w in h.resident_at(engine, first.t_start))


SITUATION = Situation("resident", "update cycle whose first pause, bump or transfer reached an engine while one of "
                      "the integration's requests was decoding there", _shown)


def lasts(scene: Scene, call: WireCall) -> float:
    """How long ``call`` decodes: its ``max_new_tokens`` (else the scenario's) at :func:`~.timing.decode_rate`."""
    params = call.payload.get("sampling_params") if isinstance(call.payload, dict) else None
    budget = params.get("max_new_tokens") if isinstance(params, dict) else None
    return (budget if isinstance(budget, int) else scene.rollout.max_new_tokens) / decode_rate(scene.backend)


def young(scene: Scene, call: WireCall, now: float, fraction: float = 0.5) -> bool:
    """Whether ``call`` is resident at ``now`` and was sent less than ``fraction`` of its decode time ago
    (:func:`lasts`), counting only the time the engines decoded (``WireControl.decode_time``)."""
    return bool(resident_at([call], call.engine, now)) and \
        scene.backend.control.decode_time(call.t_start, now) <= lasts(scene, call) * fraction


def holds_any(scene: Scene, engine: int) -> bool:
    """Whether ``engine`` holds a request (the integration's or the suite's long-lived one) resident since
    :data:`~.timing.SETTLE_S` ago with at least :data:`~.timing.SPARE` of its decode time left: what a held first
    pause, bump or transfer waits for once no young request of the integration came. A long-lived request near its
    budget's end is waited out: it is sent again as it ends, so the call never goes on in the instant a request there
    ends on its own (real vLLM 0.32.0 in CI: a long-lived request ended with its budget in the millisecond its
    engine's held pause went on, and I1-I2 answered unknown)."""
    wire = scene.backend.wire
    now = wire.clock()
    return any(young(scene, c, now, 1.0 - SPARE) for c in resident_at(wire.open_calls(), engine, now - SETTLE_S))


def last_chance(scene: Scene, engine: int, keep_s: float = 0.0) -> bool:
    """Whether, of the integration's requests resident on ``engine``, the one with the most decode time left has just
    enough left: :data:`~.timing.SPARE` of its decode time and ``keep_s`` (what the situation needs after the call),
    and less than :data:`~.timing.LAST_CHANCE` of it more."""
    now = scene.backend.wire.clock()
    left = [(lasts(scene, c) - scene.backend.control.decode_time(c.t_start, now), lasts(scene, c))
            for c in resident_at(generates(scene), engine, now)]
    if not left:
        return False
    best, whole = max(left)
    need = max(SPARE * whole, keep_s)
    return need <= best < need + LAST_CHANCE * whole


def holds_young(scene: Scene, engine: int, another_went: bool = False, keep_s: float = 0.0) -> bool:
    """Whether the cycle's first pause, bump or transfer may go on to ``engine`` (or it is not one the integration
    uses, so none of its requests will come): one of the integration's requests is resident there, sent less than half
    its decode time ago, while every other engine it uses holds one with at least :data:`~.timing.SPARE` of its decode
    time left (a cycle that goes from engine to engine reaches them soon after; two engines whose samples chain turns
    out of phase always meet such a moment). Once another engine's call went on, any of its requests resident there is
    enough: a cycle that pauses engine after engine can leave every group waiting on the paused one, so no younger
    request comes.

    On engines that cannot be stalled (real ones) the held call also goes on at the last moment the integration's
    request resident there with the most decode time left still has :data:`~.timing.SPARE` of it left, and ``keep_s``
    (:func:`last_chance`): no younger one came, and waiting longer loses the one there. An integration whose
    requests wait for its pause's answer (the vLLM reference pausing in place) sends none while the pause is held, so
    on real vLLM 0.32.0, whose turns last 0.15 s, the hold otherwise let every one end (I1-I2 unknown in CI). The fake
    is stalled while a call is held, so its requests do not age there and it waits for a young one as before."""
    now, calls = scene.backend.wire.clock(), generates(scene)
    used = {c.engine for c in calls}

    def holds(e: int, fraction: float) -> bool:
        return any(young(scene, c, now, fraction) for c in resident_at(calls, e, now))
    if engine not in used:
        return True
    if another_went:
        return holds(engine, math.inf)
    if not scene.backend.control.can_stall and last_chance(scene, engine, keep_s):
        return True
    return holds(engine, 0.5) and all(holds(e, 1.0 - SPARE) for e in used - {engine})


async def until_resident(scene: Scene, cycle: int) -> None:
    """Before cycle ``cycle``: wait until every engine the integration uses holds one of its ``/generate`` calls sent
    less than half its decode time ago, so it is still decoding when the cycle reaches that engine, whatever the cycle
    does first. After six turns without that moment (engines whose samples chain turns out of phase are never all
    that young at once), a call still decoding on each engine is enough: :func:`hold` then holds the cycle's first
    disturbing call on each engine until that engine holds a young one. Batches are consumed only while an engine the
    integration uses has none of its requests open (the producer stalls on a full buffer). When that does not happen
    within the wait deadline the cycle runs all the same and I1-I2 answers unknown for it (an integration whose own
    requests never overlap an update is not shown to spare them)."""
    wire, producer, before = scene.backend.wire, Producer(scene), len(scene.history.batches)
    start, missing = wire.clock(), list[int]()

    def ready() -> bool:
        now, calls = wire.clock(), generates(scene)
        used = sorted({c.engine for c in calls})
        fraction = 0.5 if now - start < 6 * turn(scene) else 1.0
        missing[:] = [e for e in used if not any(young(scene, c, now, fraction) for c in resident_at(calls, e, now))]
        return bool(used) and not missing

    async def keep_going() -> None:
        busy, engines = busy_everywhere(scene)
        await producer.unstall(busy, engines)
    if not await wait_until(ready, scene.deadlines.wait_s, wake=wire.listen, clock=wire.clock, between=keep_going):
        scene.unmet(("I1-I2",), f"before update cycle {cycle}, engine(s) {missing or 'all'} held "
                    f"none of the integration's requests still decoding within {scene.deadlines.wait_s:.0f}s "
                    f"({len(scene.history.batches) - before} batch(es) consumed meanwhile): what its cycles do to its "
                    f"own requests in flight is not shown")


def hold(scene: Scene, resident: bool, keep_s: float = 0.0) -> None:
    """Hold the cycle's first pause, bump or transfer on each engine at the wire: with ``resident`` until
    :func:`holds_young` (a request there keeping ``keep_s`` of decoding after it; for at most two turns, at least
    0.5 s, at most a quarter of the update deadline), then until :func:`holds_any`; otherwise until :func:`holds_any`
    (a long-lived request that just ended is sent again meanwhile), at most :data:`~.timing.START_TIMEOUT_S`."""
    control = scene.backend.control
    if resident:
        control.hold_first(DISTURBING_PATHS, lambda engine, went: holds_young(scene, engine, went, keep_s),
                           min(max(0.5, 2 * turn(scene)), scene.deadlines.update_s / 4),
                           then=lambda engine: holds_any(scene, engine), then_timeout_s=START_TIMEOUT_S)
    else:
        control.hold_first(DISTURBING_PATHS, lambda engine, _: holds_any(scene, engine), START_TIMEOUT_S)


REACHES = DISTURBING_PATHS | {"/begin_weight_update"}
"""The calls by which a cycle reaches an engine's requests in flight: a pause, bump or transfer, or the begin of
SGLang's weight-update session (it waits for the requests in flight unless the engine is paused: 0.5.23
``tokenizer_control_mixin.py`` ``_weight_update_session_call``)."""


def keep_resident(scene: Scene) -> Callable[[], None]:
    """From the cycle's start until its first call that reaches an engine's requests goes on (:data:`REACHES`; at
    most a quarter of the update deadline), the engines decode nothing (``WireControl.keep``: the fake's are stalled,
    real vLLM is paused in its own ``keep`` mode past the wire and resumed before that call goes on): the requests
    :func:`until_resident` found young are still young when that call arrives, however long the cycle works before it
    (a checkpoint written on a loaded machine: 2.4 s on real vLLM) and whether or not the integration sends more
    meanwhile (one that stops sending during a sync). Where neither is possible the builder's aim does what it can.
    Returns the function that ends it (and stops following the wire); a pause that failed is recorded (``keep-failed``),
    a resume that failed is :attr:`WireControl.left_paused`, which breaks the run."""
    backend = scene.backend
    control = backend.control
    end = control.keep(scene.deadlines.update_s / 4)
    if control.keep_failed is not None:
        scene.history.injected.append(Injected(backend.wire.clock(), "keep-failed", None, control.keep_failed))
    if end is None:
        return lambda: None
    if not control.can_stall:
        scene.history.injected.append(Injected(backend.wire.clock(), "keep", None, (
            "every engine paused in its own keep mode past the wire from the cycle's start until its first pause, "
            "bump, transfer or weight-update session went on (resumed first)")))

    def follow(call: WireCall, answered: bool) -> None:
        if not answered and call.origin == "integration" and call.path in REACHES:
            end()  # type: ignore[misc]  (not None here)
    stop = backend.wire.listen(follow)

    def done() -> None:
        stop()
        end()  # type: ignore[misc]
    return done


def record_expired(scene: Scene, expired: dict[int, Expired], cycle: int, held_until: str) -> None:
    """Record each first disturbing call that went on at its hold's bound: it built less than it aimed at."""
    for engine, how in sorted(expired.items()):
        waited = "" if how.then is None else (
            f", then until a request resident there had {SPARE:.0%} of its decode time left" if how.then else
            f", then {START_TIMEOUT_S:.0f}s more: no request resident there had {SPARE:.0%} of its decode time left")
        scene.history.injected.append(Injected(how.at, "hold-expired", engine, (
            f"update cycle {cycle}: {held_until}; none was, it went on at the hold's bound (held {how.held_s:.2f}s"
            f"{waited})")))
