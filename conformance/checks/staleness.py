"""Staleness accounting: S2 (oldest over every sample, turn and span) and S3 (bound at consumption)."""

from __future__ import annotations


from ..anomaly import Anomaly
from ..history import History, WireCall
from ..interface import Group
from .labels import output_versions
from .registry import check
from .verdict import Verdict, verdict


def call_versions(h: History, call: WireCall, output: dict, *, newest: bool = False) -> list[int]:
    """The versions that produced an output's tokens. With engine stamps: what the engine reported (every span on
    0.5.23, else the output-time label). With client-side versions: the version published when the call was sent
    (the dispatch rule of V6), read off the cycle timeline, or, for a call held at SGLang's pause gate, the version
    the cycle that admitted it installed (:meth:`History.client_truth`: the oldest plausible one where the wire
    cannot tell, or with ``newest`` the newest)."""
    if h.stamps_engines:
        return output_versions(output)
    truth = h.client_truth(call, newest=newest)
    return [] if truth is None else [truth]


def _true_oldest(h: History, group: Group, outputs: dict, *, newest: bool = False) -> tuple[int | None, list[str]]:
    """The oldest numeric version that produced any token of the group (continued calls included), from the wire
    (with client-side versions, from the oldest or with ``newest`` the newest plausible version of each call)."""
    versions: list[int] = []
    missing: list[str] = []
    for sample in group.samples:
        for turn in sample.turns:
            for rid in [turn.rid, *turn.continues]:
                found = outputs.get(rid)
                if found is None:
                    missing.append(rid)
                    continue
                versions.extend(call_versions(h, *found, newest=newest))
    return (min(versions) if versions else None), missing


def _plausible(h: History, group: Group, outputs: dict, truth: int | None) -> bool:
    """Whether a client-side group's recorded oldest version lies between the oldest and the newest version its calls
    may have been generated under (where the wire cannot tell: :meth:`History.client_truth`). Before the first
    update the oldest candidate is "no version yet" (None): a call sent between the publish and ``update()``
    returning may then carry the new version or none."""
    if h.stamps_engines or not isinstance(group.oldest_version, int):
        return False
    candidates = [v for v in (truth, _true_oldest(h, group, outputs, newest=True)[0]) if v is not None]
    return bool(candidates) and min(candidates) <= group.oldest_version <= max(candidates)


@check("S2", "oldest version",
       needs={"cycle", "consumed"},
       holds="a group's oldest version = min over every sample, turn (and the calls it continued) and per-token "
             "span",
       reads="`meta_info.weight_version(s)` of each turn's `/generate` answer; with client-side versions "
             "(`stamps_engines=False`), the version published when each call was sent (a call held at SGLang's pause "
             "gate: the version current when it was admitted)")
def oldest_version(h: History) -> Verdict:
    """S2/V6: a group's oldest version is the minimum over every sample, turn (with the calls it continued) and
    per-token span, ignoring non-numeric labels ("default"); with client-side versions, over the versions
    published when each call was sent."""
    outputs = h.outputs_by_rid()
    failures: list[Anomaly] = []
    groups = unjoined = 0
    for rec in h.batches:
        for g in rec.batch.groups:
            groups += 1
            truth, missing = _true_oldest(h, g, outputs)
            if missing:
                unjoined += 1
                failures.append(Anomaly(
                    "unjoined-group",
                    f"batch {rec.index}: prompt {g.prompt_index} names turn rid(s) {missing[:3]} that no "
                    f"engine answered (the suite cannot verify its versions)",
                    rids=tuple(missing[:3]), batch=rec.index, prompt=g.prompt_index, times=(rec.t,)))
                continue
            if g.oldest_version != truth and not _plausible(h, g, outputs, truth):
                if h.stamps_engines:
                    recorded = {t.rid: (t.weight_version, t.weight_versions) for s in g.samples for t in s.turns}
                    source, what = "turn labels", "was generated under versions as old as"
                else:
                    recorded = {t.rid: t.policy_version for s in g.samples for t in s.turns}
                    held = [t.rid for s in g.samples for t in s.turns
                            if t.rid in outputs and h.gate_cycle(outputs[t.rid][0]) is not None]
                    source, what = "turn versions", "was sent under versions as old as" if not held else (
                        f"was generated (call(s) {held[:3]} held at SGLang's pause gate, so admitted under the weights "
                        f"the cycle that continued the engine installed) under versions as old as")
                failures.append(Anomaly(
                    "oldest-version",
                    f"batch {rec.index}: prompt {g.prompt_index} {what} {truth} but the integration "
                    f"recorded oldest {g.oldest_version} ({source} {recorded})",
                    batch=rec.index, prompt=g.prompt_index, versions=(truth, g.oldest_version), times=(rec.t,)))
    return verdict(failures, vacuous=None if groups else "no batch was consumed",
                   metrics={"groups": groups, "unjoined_groups": unjoined})


@check("S3", "staleness bound",
       needs={"at-bound", "consumed"},
       holds="staleness bound enforced at consumption; groups at exactly the bound trained (passing over waiting "
             "ones fails), at bound + 1 rejected",
       reads="the same truth, against the version current when each batch was consumed",
       measures=True)
def staleness_bound(h: History) -> Verdict:
    """S3/S1: with the filter on, every trained group has 0 <= current - oldest <= max_staleness, measured
    against the version current at consumption. The run must train groups at exactly the bound (a filter off by
    one the strict way trains none: it fails, naming them, when such groups were shown to wait for consumption,
    else unknown); the staleness scenario also brings groups at bound + 1 to consumption, which a filter off by one
    the lax way trains (fail)."""
    if h.max_staleness is None:
        return verdict([], vacuous="the scenario runs without a staleness bound")
    outputs = h.outputs_by_rid()
    failures: list[Anomaly] = []
    measured: list[int] = []
    for rec in h.batches:
        current = rec.published_truth
        for g in rec.batch.groups:
            oldest, _ = _true_oldest(h, g, outputs)
            if current is None or oldest is None:
                continue
            newest = _true_oldest(h, g, outputs, newest=True)[0] if not h.stamps_engines else oldest
            staleness = current - oldest
            if staleness > h.max_staleness and newest is not None:
                staleness = current - newest  # client-side versions the wire cannot tell apart: the benefit of doubt
            measured.append(staleness)
            if staleness > h.max_staleness:
                failures.append(Anomaly(
                    "over-staleness-bound",
                    f"batch {rec.index}: prompt {g.prompt_index} was trained with staleness {staleness} "
                    f"(generated under version {oldest}, consumed at version {current}) > bound "
                    f"{h.max_staleness}",
                    batch=rec.index, prompt=g.prompt_index, versions=(oldest, current), times=(rec.t,)))
            elif staleness < 0:
                failures.append(Anomaly(
                    "negative-staleness",
                    f"batch {rec.index}: prompt {g.prompt_index} has negative staleness {staleness}",
                    batch=rec.index, prompt=g.prompt_index, versions=(oldest, current), times=(rec.t,)))
    at_bound = sum(s == h.max_staleness for s in measured)
    metrics = {"groups_measured": len(measured), "staleness_max": max(measured, default=None),
               "staleness_mean": sum(measured) / len(measured) if measured else None, "groups_at_bound": at_bound}
    vacuous = None
    if not at_bound:
        passed_over = _passed_over_at_bound(h, outputs)
        failures += passed_over
        vacuous = None if passed_over else (f"no group was trained at exactly the bound ({h.max_staleness}; "
                                            f"trained: {sorted(set(measured))}): the run does not show the filter "
                                            f"admits it")
    return verdict(failures, vacuous=vacuous, metrics=metrics)


def _passed_over_at_bound(h: History, outputs: dict) -> list[Anomaly]:
    """Over-filtering: complete groups at exactly the bound that were available at a consumption and not trained.

    A group counts as available at batch B (consumed at version c) when every call of its prompt had finished
    before the update cycle that published c began, while nothing of the integration's was decoding (its producer
    blocked on a full buffer: everything generated was a finished group, as the staleness scenario builds it), all
    of them under version c − bound, and neither B nor a batch before it trained it (called only when no trained
    group was at the bound)."""
    assert h.max_staleness is not None
    calls = [c for c in h.integration_calls("/generate") if h.prompt_of(c) is not None]
    trained: set[int] = set()
    found: list[Anomaly] = []
    for rec in h.batches:
        current = rec.published_truth
        cycle = next((c for c in reversed(h.cycles) if c.ok and c.returned == current and c.t_end <= rec.t), None)
        if current is None or cycle is None or any(c.t_start < cycle.t_start and (c.t_end is None or c.t_end >
                                                                                 cycle.t_start) for c in calls):
            trained |= {g.prompt_index for g in rec.batch.groups}
            continue
        before: dict[int, set[int]] = {}
        for c in calls:
            if c.t_start < cycle.t_start:
                versions = {v for o in c.generate_outputs() for v in call_versions(h, c, o)}
                aborted = any(o.get("meta_info", {}).get("finish_reason", {}).get("type") == "abort"
                              for o in c.generate_outputs() if isinstance(o.get("meta_info", {}).get("finish_reason"),
                                                                           dict))
                before.setdefault(h.prompt_of(c), set()).update(versions | ({-1} if aborted else set()))
        batch = {g.prompt_index for g in rec.batch.groups}
        at_bound = sorted(p for p, vs in before.items() if vs == {current - h.max_staleness}
                          and p not in trained and p not in batch)
        if at_bound:
            found.append(Anomaly(
                "over-filtered",
                f"batch {rec.index} (consumed at version {current}) trained prompts {sorted(batch)} while the "
                f"finished groups of prompts {at_bound[:5]} (generated before update cycle {cycle.index}, under "
                f"version {current - h.max_staleness}: staleness {h.max_staleness}, exactly the bound, admissible) "
                f"waited for consumption: the filter rejects groups at the bound",
                batch=rec.index, prompt=at_bound[0], versions=(current - h.max_staleness, current),
                cycle=cycle.index, times=(rec.t,)))
        trained |= batch
    return found
