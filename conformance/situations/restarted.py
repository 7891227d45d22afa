"""An engine the suite restarted: it dies under the integration's requests and comes back on its address from its
start-up weights, labelled ``default``, as a crashed server relaunched by a framework's fault tolerance does (miles
#1724, #1805: the recovered engine joined the router before the weight sync and served its start-up weights). Built
by the backend's own relaunch (:func:`restart`; a backend without one skips the scenario, saying so); shown by the
injected restart the history records (:data:`SITUATION`)."""

from __future__ import annotations

import asyncio

from ..backends import Backend
from ..history import Injected
from .scene import Scene, Situation


def _cannot_restart(backend: Backend) -> str | None:
    if callable(getattr(backend, "restart", None)):
        return None
    return (f"the {backend.name} backend cannot restart an engine in the middle of a scenario (the fake backend "
            f"can: a real engine's relaunch is not built here)")


SITUATION = Situation("restarted", "engine the suite restarted", lambda h: any(i.kind == "restart" for i in h.injected),
                      _cannot_restart)


async def restart(scene: Scene, engine: int) -> None:
    """Restart ``engine`` (the backend's ``restart``: its requests answered as a crashed engine answers them, a
    fresh engine on the same address), recorded as injected from the crash until the new engine serves."""
    clock = scene.backend.wire.clock
    injected = Injected(clock(), "restart", engine, "the suite restarted the engine (a crash, then a relaunch from "
                        "its start-up weights, labelled default)")
    scene.history.injected.append(injected)
    await asyncio.wait_for(asyncio.to_thread(scene.backend.restart, engine),  # type: ignore[attr-defined]
                           scene.deadlines.wait_s)
    injected.t_end = clock()
