"""What a history can hold that a check needs: the situations a scenario builds and a check is judged on.

A check declares the situations it needs (``registry.check(needs=...)``), a scenario the situations its script builds
(``Scenario.builds``): every check whose needs a scenario builds judges it, so no scenario keeps a hand-picked list.
On the run's history each needed situation is also looked for: a check judged where its situation never came answers
``unknown`` with the reason (``missing``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Iterable

from ..history import LORA_LOAD_PATHS, History


@dataclass(frozen=True)
class Situation:
    """Something a scenario builds and a history shows."""

    name: str
    doc: str
    """What it is, as a reason reads: "the history holds no <doc>"."""
    shown: Callable[[History], bool]


def _resident(h: History) -> bool:
    """A cycle's first pause, bump or transfer reached an engine while one of the integration's requests was decoding
    there: what I1-I2 judges. Not the cycle's start: on a starved machine a short turn open when the cycle began
    can end before the cycle's first call reaches its engine (real vLLM 0.32.0 in CI, 0.15 s turns), and one sent
    after the start can be the one the pause meets (the suite holds that call until it does: ``Run.holds_young``)."""
    return any(w.origin == "integration" for _, engine, first in h.disturbing_calls()
               for w in h.resident_at(engine, first.t_start))


def _consumed_before_update(h: History) -> bool:
    first = next((c.t_start for c in h.cycles if c.ok), float("inf"))
    return any(b.t < first for b in h.batches)


def _held_window(h: History) -> bool:
    return any(i.kind == "window" for i in h.injected)


SITUATIONS: dict[str, Situation] = {s.name: s for s in [
    Situation("cycle", "update cycle", lambda h: bool(h.cycles)),
    Situation("resident", "update cycle whose first pause, bump or transfer reached an engine while one of the "
              "integration's requests was decoding there", _resident),
    Situation("consumed", "consumed batch", lambda h: bool(h.batches)),
    Situation("consumed-before-update", "batch consumed before the first successful update", _consumed_before_update),
    Situation("failed-cycle", "update cycle the engines refused", lambda h: any(c.expect_failure for c in h.cycles)),
    Situation("full-update", "full-weight update cycle", lambda h: any(not c.lora for c in h.cycles)),
    Situation("lora", "adapter load", lambda h: any(c.path in LORA_LOAD_PATHS for c in h.integration_calls())),
    Situation("disk", "disk load", lambda h: next(h.integration_calls("/update_weights_from_disk"), None) is not None),
    Situation("in-place", "update cycle run with pause mode in_place",
              lambda h: any(c.pause_mode == "in_place" for c in h.cycles)),
    Situation("at-bound", "staleness bound (the scenario brings groups at and past it to consumption; S3 itself "
              "says whether groups at exactly the bound came)", lambda h: h.max_staleness is not None),
    Situation("aborted", "request the suite aborted",
              lambda h: any(i.kind == "abort" and i.rid is None for i in h.injected)),
    Situation("window", "window held open on purpose (one engine's call kept in progress while the others "
              "finished)", _held_window),
]}
"""Situation name → situation."""


def unknown_situations(names: Iterable[str]) -> list[str]:
    return sorted(set(names) - set(SITUATIONS))


def missing(needs: Iterable[str], h: History) -> list[str]:
    """The reasons ``h`` does not hold what a check needing ``needs`` reads ("no <situation>"), in order."""
    return [f"the history holds no {SITUATIONS[n].doc}" for n in sorted(needs) if not SITUATIONS[n].shown(h)]
