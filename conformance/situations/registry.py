"""What a history can hold that a check needs: the situations a scenario builds and a check is judged on.

A check declares the situations it needs (``registry.check(needs=...)``), a scenario the situations its script builds
(``Scenario.builds``): every check whose needs a scenario builds judges it, so no scenario keeps a hand-picked list.
On the run's history each needed situation is also looked for: a check judged where its situation never came answers
``unknown`` with the reason (:func:`missing`). The situations a builder makes on purpose are defined with it (one
module each); the rest are shapes every run's history has or lacks."""

from __future__ import annotations

from typing import Iterable

from ..history import LORA_LOAD_PATHS, History
from . import aborted, drain, prefix, refused, resident, restarted, slow
from .scene import Situation


def _consumed_before_update(h: History) -> bool:
    first = next((c.t_start for c in h.cycles if c.ok), float("inf"))
    return any(b.t < first for b in h.batches)


SITUATIONS: dict[str, Situation] = {s.name: s for s in [
    Situation("cycle", "update cycle", lambda h: bool(h.cycles)),
    resident.SITUATION,
    Situation("consumed", "consumed batch", lambda h: bool(h.batches)),
    Situation("consumed-before-update", "batch consumed before the first successful update", _consumed_before_update),
    refused.SITUATION,
    Situation("full-update", "full-weight update cycle", lambda h: any(not c.lora for c in h.cycles)),
    Situation("lora", "adapter load", lambda h: any(c.path in LORA_LOAD_PATHS for c in h.integration_calls())),
    Situation("disk", "disk load", lambda h: next(h.integration_calls("/update_weights_from_disk"), None) is not None),
    Situation("in-place", "update cycle run with pause mode in_place",
              lambda h: any(c.pause_mode == "in_place" for c in h.cycles)),
    Situation("at-bound", "staleness bound (the scenario brings groups at and past it to consumption; S3 itself "
              "says whether groups at exactly the bound came)", lambda h: h.max_staleness is not None),
    aborted.SITUATION,
    slow.SITUATION,
    drain.SITUATION,
    restarted.SITUATION,
    prefix.SITUATION,
]}
"""Situation name → situation."""


def unknown_situations(names: Iterable[str]) -> list[str]:
    return sorted(set(names) - set(SITUATIONS))


def missing(needs: Iterable[str], h: History) -> list[str]:
    """The reasons ``h`` does not hold what a check needing ``needs`` reads ("no <situation>"), in order."""
    return [f"the history holds no {SITUATIONS[n].doc}" for n in sorted(needs) if not SITUATIONS[n].shown(h)]
