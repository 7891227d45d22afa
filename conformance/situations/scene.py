"""What a situation is (:class:`Situation`: something a history shows, by one predicate) and what its builder works
with (:class:`Scene`: a scenario's run, as the builders see it)."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any, Callable, Protocol

from ..backends import Backend, probe_post
from ..history import History, WireCall
from ..interface import RolloutConfig
from .timing import Deadlines, turn_s


@dataclass(frozen=True)
class Situation:
    """Something a scenario builds and a history shows: ``shown`` is the one predicate the builder aims at and the
    checks that need it read."""

    name: str
    doc: str
    """What it is, as a reason reads: "the history holds no <doc>"."""
    shown: Callable[[History], bool]
    why_not: Callable[[Backend], str | None] = lambda backend: None
    """Why a backend cannot build it (a scenario that builds it is then skipped with that reason), or None."""


class Scene(Protocol):
    """What a builder works with: a scenario's :class:`~conformance.scenarios.run.Run`."""

    backend: Backend
    history: History
    rollout: RolloutConfig
    deadlines: Deadlines

    async def drain(self, n: int = 1) -> None:
        """Consume ``n`` batches, as the trainer does."""

    def unmet(self, checks: tuple[str, ...], reason: str) -> None:
        """Record that a situation ``checks`` need could not be built."""


def generates(scene: Scene) -> list[WireCall]:
    """The integration's ``/generate`` calls on the wire so far (live: open ones close as they are answered)."""
    return [c for c in scene.backend.wire.snapshot() if c.path == "/generate" and c.origin == "integration"]


def used_engines(scene: Scene) -> list[int]:
    """The engines the integration has sent ``/generate`` calls to so far (a sticky or least-loaded router may use
    only some of them)."""
    return sorted({c.engine for c in generates(scene)})


def turn(scene: Scene) -> float:
    """How long one of the integration's turns decodes on the scene's backend (:func:`~.timing.turn_s`)."""
    return turn_s(scene.rollout.max_new_tokens, scene.backend)


async def post_all(scene: Scene, path: str, body: Any) -> None:
    """A call of the suite's own (not recorded) to every engine, in their dialect."""
    backend = scene.backend
    await asyncio.gather(*(probe_post(url, path, body, dialect=backend.dialect) for url in backend.urls))
