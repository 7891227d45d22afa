"""The producer kept busy: the integration's producer decoding on every engine it uses, in flight at once, or
blocked on a full buffer, as a scenario needs it. A producer blocked on a full buffer sends nothing until the
trainer takes a batch (one group restarts per batch taken), so while a builder waits for engine activity that does
not come, it consumes batches as a trainer would (:class:`Producer`)."""

from __future__ import annotations

from typing import Iterable

from ..breaks import ScenarioTimeout
from ..history import WireCall
from .scene import Scene, generates, used_engines
from .timing import QUIET_S, STALL_S
from .waiting import wait_for, wait_until


def open_everywhere(calls: list[WireCall], engines: Iterable[int]) -> bool:
    """Whether each of ``engines`` has one of ``calls`` still open."""
    return all(any(c.engine == e and c.t_end is None for c in calls) for e in engines)


def busy_everywhere(scene: Scene) -> tuple[bool, int]:
    """Whether every engine the integration uses has one of its requests open (and how many engines it uses, at
    least one)."""
    calls = generates(scene)
    used = {c.engine for c in calls}
    return bool(used) and open_everywhere(calls, used), max(1, len(used))


class Producer:
    """Consumes batches once the producer stalled: while the builder's engines are busy the stall clock restarts;
    once they were not for :data:`~.timing.STALL_S`, ``n`` batches are consumed."""

    def __init__(self, scene: Scene) -> None:
        self.scene, self.clock = scene, scene.backend.wire.clock
        self.since = self.clock()

    async def unstall(self, busy: bool, n: int = 1) -> None:
        if busy:
            self.since = self.clock()
        elif self.clock() - self.since > STALL_S:
            await self.scene.drain(n)
            self.since = self.clock()

    async def keep_everywhere(self) -> None:
        """One step of a wait that needs every engine the integration uses busy (:func:`busy_everywhere`)."""
        await self.unstall(*busy_everywhere(self.scene))


async def feed_held(scene: Scene) -> None:
    """While the cycle's first disturbing calls are held and none went on yet, consume a batch whenever an engine the
    integration uses has had none of its requests open for :data:`~.timing.STALL_S`, as a trainer would, so the
    requests the hold waits for come (bounded by the update deadline; the cycle's end releases the holds)."""
    control, producer = scene.backend.control, Producer(scene)

    def over() -> bool:
        state = control.holding()
        return state is None or bool(state[1])

    async def feed() -> None:
        state, calls = control.holding(), generates(scene)
        await producer.unstall(state is None or not state[0] or open_everywhere(calls, {c.engine for c in calls}))
    await wait_until(over, scene.deadlines.update_s, wake=scene.backend.wire.listen, clock=producer.clock,
                     between=feed)


async def until_in_flight(scene: Scene, per_engine: int = 1, min_age_s: float = 0.0) -> None:
    """Wait until every engine the integration uses has ``per_engine`` generates in flight (open for at least
    ``min_age_s``, i.e. decoding by then). While that does not happen, one batch per engine is consumed every
    :data:`~.timing.STALL_S`, as a trainer would: a producer blocked on a full buffer restarts one group per consumed
    batch, so consuming one at a time (or only once it went idle) can leave the engines taking turns forever, never
    decoding at once."""
    wire, before, producer = scene.backend.wire, len(scene.history.batches), Producer(scene)

    def ready() -> bool:
        engines = used_engines(scene)
        return bool(engines) and all(wire.in_flight(min_age_s=min_age_s).get(e, 0) >= per_engine for e in engines)
    if not await wait_until(ready, scene.deadlines.wait_s, wake=wire.listen, clock=wire.clock,
                            between=lambda: producer.unstall(False, max(1, len(used_engines(scene))))):
        raise ScenarioTimeout(f"timed out after {scene.deadlines.wait_s:.0f}s waiting for {per_engine} /generate "
                              f"call(s) in flight on every engine (in flight: {wire.in_flight()}; "
                              f"{len(scene.history.batches) - before} batch(es) consumed meanwhile to unblock the "
                              f"producer)")


async def until_next_call(scene: Scene) -> None:
    """Wait until every engine the integration uses finished one more of its ``/generate`` calls and has a call in
    flight that was sent after it (the next turn of a multi-turn sample, for a producer that keeps its samples on one
    engine). Batches are consumed while an engine it uses has none of its calls open (a producer blocked on a full
    buffer: one engine slower than the other can let the other fill it first)."""
    wire, producer = scene.backend.wire, Producer(scene)
    since = wire.clock()

    def progressed() -> bool:
        calls = generates(scene)
        engines = sorted({c.engine for c in calls})
        for engine in engines:
            done = [c.t_end for c in calls if c.engine == engine and c.t_end is not None and c.t_end >= since]
            if not done or not any(c.engine == engine and c.t_end is None and c.t_start >= min(done) for c in calls):
                return False
        return bool(engines)
    await wait_for(progressed, scene.deadlines.wait_s, "a finished /generate call followed by the next one in flight "
                   "on every engine", wake=wire.listen, between=producer.keep_everywhere)


async def until_producer_blocked(scene: Scene, quiet_s: float = QUIET_S) -> None:
    """Wait until no ``/generate`` has been in flight for ``quiet_s``: the producer is blocked on a full buffer."""
    wire = scene.backend.wire
    quiet_since: list[float | None] = [None]

    def blocked() -> bool:
        now = wire.clock()
        quiet_since[0] = (quiet_since[0] or now) if not wire.in_flight() else None
        return quiet_since[0] is not None and now - quiet_since[0] >= quiet_s
    await wait_for(blocked, scene.deadlines.wait_s, "the producer to fill its buffer (no /generate in flight)",
                   wake=wire.listen)
