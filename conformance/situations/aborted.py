"""Requests the suite aborted: every engine aborts what it holds mid-rollout, as an operator or a crash would (not
the integration's doing). Built by freezing the engines first, so that some are held, and aborting everything
(:func:`abort_in_flight`); shown by the injected aborts the history records (:data:`SITUATION`)."""

from __future__ import annotations

from typing import Awaitable, Callable

from ..breaks import ScenarioTimeout
from ..history import Injected, finish_type
from .producer import until_in_flight
from .scene import Scene, Situation, generates, post_all, used_engines

SITUATION = Situation("aborted", "request the suite aborted",
                      lambda h: any(i.kind == "abort" and i.rid is None for i in h.injected))


async def abort_in_flight(scene: Scene, then: Callable[[], Awaitable[int | None]] | None = None) -> int | None:
    """Abort the requests every engine holds. So that some are held, the suite freezes the engines first (``pause``
    in place, its own call; on ≤0.5.4 that pause already aborts everything), checks on the wire that each engine the
    integration uses held one of its requests sent before, aborts everything (SGLang answers frozen requests once
    they continue) and continues the engines; it retries while an engine held nothing. With ``then`` (an update
    cycle) the engines are not continued by the suite: ``then`` runs while they are frozen, and its own continue
    releases the aborted answers, so whatever the integration resumes of them runs under the cycle's new weights
    (returns what ``then`` returned)."""
    clock, engines = scene.backend.wire.clock, range(len(scene.backend.urls))
    deadline = clock() + scene.deadlines.wait_s
    while True:
        await until_in_flight(scene, 1)
        used = set(used_engines(scene))
        mark = clock()
        injected = [Injected(mark, "abort", engine, "the suite froze the engine (pause in_place) and aborted every "
                             "request it held (abort_all)") for engine in engines]
        scene.history.injected += injected
        await post_all(scene, "/pause_generation", {"mode": "in_place"})
        held = {c.engine for c in generates(scene) if c.t_start < mark and (
            c.t_end is None or any(finish_type(o) == "abort" for o in c.generate_outputs()))}
        await post_all(scene, "/abort_request", {"abort_all": True})
        for item in injected:
            item.t_end = clock()
        if then is not None and used <= held:
            return await then()
        await post_all(scene, "/continue_generation", {})
        if used <= held:
            return None
        if clock() > deadline:
            raise ScenarioTimeout(f"no request was held by every engine the integration uses ({sorted(used)}) to "
                                  f"abort within {scene.deadlines.wait_s:.0f}s (engines holding one: {sorted(held)})")
