"""Adopting the reference cycle with one step done your way: subclass the reference updater, override that step.

Many frameworks flush the prefix cache after loading the new weights rather than before (SGLang itself flushes
after loading by default). The reference flushes right after the pause; this adapter moves the flush to just before
the version bump, while the engines are still paused, and keeps every other step of the reference cycle (pause,
sessions, transfer, bump, continue, publish, the failure paths). It is also a factory, so the choice can be made
from the command line:

    pytest -m cpu --conformance-integration examples.override_one_step:integration
    pytest -m cpu --conformance-integration examples.override_one_step:integration --conformance-integration-option flush=before_load
"""

from __future__ import annotations

from conformance.reference import ReferenceIntegration, ReferenceUpdater
from conformance.reference.concurrency import gather_all


class FlushAfterLoadUpdater(ReferenceUpdater):
    """The reference cycle, with the cache flushed after the transfer instead of before it (never under in_place:
    its resident requests make SGLang refuse, C2)."""

    def flush_needed(self) -> bool:
        return False  # not right after the pause

    async def stamp(self, new: int) -> None:
        if self.pause_mode != "in_place":
            await gather_all(*(engine.flush_cache() for engine in self.engines))
        await super().stamp(new)


FLUSH_STEPS = {"after_load": FlushAfterLoadUpdater, "before_load": ReferenceUpdater}


def integration(flush: str = "after_load") -> ReferenceIntegration:
    """The reference integration with the flush ``after_load`` (this adapter's step) or ``before_load``."""
    if flush not in FLUSH_STEPS:
        raise ValueError(f"flush must be one of {sorted(FLUSH_STEPS)}, got {flush!r}")
    return ReferenceIntegration(name=f"override-one-step[flush={flush}]", updater_cls=FLUSH_STEPS[flush])
