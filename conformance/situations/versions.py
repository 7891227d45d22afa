"""Consumed groups across versions, as S2 and S3 read them: a group generated under more than one version, one
generated entirely under a failover cell's versions, one as old as the aborted part of a turn resumed under a newer
version. Their builders are the scenario scripts that update while samples decode and drain until one is shown
(``conformance.scenarios.catalogue``); these are the predicates they stop on."""

from __future__ import annotations

from ..checks.staleness import call_versions
from ..history import History


def mixed_group(history: History) -> bool:
    """Whether a consumed group was generated under more than one version (per turn and span, or with client-side
    versions per the version each call was sent under)."""
    outputs = history.outputs_by_rid()
    for rec in history.batches:
        for group in rec.batch.groups:
            versions = {v for s in group.samples for t in s.turns if t.rid in outputs
                        for v in call_versions(history, *outputs[t.rid])}
            if len(versions) > 1:
                return True
    return False


def from_cell(history: History, cell: int) -> bool:
    """Whether a consumed group was generated entirely after trainer cell ``cell`` first published a version (every
    call of it sent later), so its oldest version is one the new cell published."""
    published = [c.t_end for c in history.cycles if c.cell == cell and c.ok]
    if not published:
        return False
    outputs = history.outputs_by_rid()
    return any(all(t.rid in outputs and outputs[t.rid][0].t_start > published[0] for s in g.samples for t in s.turns)
               for rec in history.batches for g in rec.batch.groups)


def resumed_across_an_update(history: History) -> bool:
    """Whether a consumed group's oldest version comes only from the aborted parts of turns resumed under a newer one
    (partial rollout across an update: the group is as old as the tokens generated before the abort)."""
    outputs = history.outputs_by_rid()

    def oldest(rids: list[str]) -> int:
        return min((v for rid in rids if rid in outputs for v in call_versions(history, *outputs[rid])),
                   default=10 ** 9)
    for rec in history.batches:
        for g in rec.batch.groups:
            turns = [t for s in g.samples for t in s.turns]
            if oldest([old for t in turns for old in t.continues]) < oldest([t.rid for t in turns]):
                return True
    return False
