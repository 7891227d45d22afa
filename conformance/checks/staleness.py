"""Staleness accounting: S2 (oldest over every sample, turn and span) and S3 (bound at consumption)."""

from __future__ import annotations

from ..history import History
from ..interface import Group
from .labels import output_versions
from .verdict import Verdict, verdict


def _true_oldest(group: Group, outputs: dict) -> tuple[int | None, list[str]]:
    """The oldest numeric version that produced any token of the group, from what the engines answered."""
    versions: list[int] = []
    missing: list[str] = []
    for sample in group.samples:
        for turn in sample.turns:
            found = outputs.get(turn.rid)
            if found is None:
                missing.append(turn.rid)
                continue
            versions.extend(output_versions(found[1]))
    return (min(versions) if versions else None), missing


def oldest_version(h: History) -> Verdict:
    """S2/V6: a group's oldest version is the minimum over every sample, turn and per-token span, ignoring
    non-numeric labels ("default")."""
    outputs = h.outputs_by_rid()
    failures: list[str] = []
    groups = unjoined = 0
    for rec in h.batches:
        for g in rec.batch.groups:
            groups += 1
            truth, missing = _true_oldest(g, outputs)
            if missing:
                unjoined += 1
                failures.append(f"batch {rec.index}: prompt {g.prompt_index} names turn rid(s) {missing[:3]} that no "
                                f"engine answered (the suite cannot verify its versions)")
                continue
            if g.oldest_version != truth:
                labels = {t.rid: (t.weight_version, t.weight_versions) for s in g.samples for t in s.turns}
                failures.append(f"batch {rec.index}: prompt {g.prompt_index} was generated under versions as old as "
                                f"{truth} but the integration recorded oldest {g.oldest_version} (turn labels {labels})")
    return verdict("S2 oldest version", failures, vacuous=None if groups else "no batch was consumed",
                   metrics={"groups": groups, "unjoined_groups": unjoined})


def staleness_bound(h: History) -> Verdict:
    """S3/S1: with the filter on, every trained group has 0 <= current - oldest <= max_staleness, measured
    against the version current at consumption."""
    if h.max_staleness is None:
        return verdict("S3 staleness bound", [], vacuous="the scenario runs without a staleness bound")
    outputs = h.outputs_by_rid()
    failures: list[str] = []
    measured: list[int] = []
    for rec in h.batches:
        current = rec.published_truth
        for g in rec.batch.groups:
            oldest, _ = _true_oldest(g, outputs)
            if current is None or oldest is None:
                continue
            staleness = current - oldest
            measured.append(staleness)
            if staleness > h.max_staleness:
                failures.append(f"batch {rec.index}: prompt {g.prompt_index} was trained with staleness {staleness} "
                                f"(generated under version {oldest}, consumed at version {current}) > bound "
                                f"{h.max_staleness}")
            elif staleness < 0:
                failures.append(f"batch {rec.index}: prompt {g.prompt_index} has negative staleness {staleness}")
    filtered = sum(int(r.batch.metrics.get("stale_groups_filtered", 0)) for r in h.batches)
    metrics = {"groups_measured": len(measured), "staleness_max": max(measured, default=None),
               "staleness_mean": sum(measured) / len(measured) if measured else None, "stale_groups_filtered": filtered}
    vacuous = None if (filtered or any(s > 0 for s in measured)) else \
        "no group was ever stale: the bound was never exercised"
    return verdict("S3 staleness bound", failures, vacuous=vacuous, metrics=metrics)
