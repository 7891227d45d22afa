"""Version lifecycle: V1 (labels agree), V2 (publish only after success), V3 (nothing before the first update),
V4/S1 (never backwards, staleness never negative)."""

from __future__ import annotations

from typing import Iterable

from ..anomaly import Anomaly
from ..history import TRANSFER_PATHS, History, WireCall
from .effective import effective
from .registry import check
from .verdict import Verdict, verdict


@check("V1", "versions agree",
       needs={"cycle"},
       holds="after every update (disk, tensor, distributed, LoRA): engine label == trainer counter == manager "
             "version; engines never stamped fail plainly",
       reads="the labels the engines report (`/model_info`) after each cycle; whether any bump or transfer carried "
             "a version")
def versions_agree(h: History) -> Verdict:
    """V1: after every successful update (every mode, LoRA too) engine label == trainer counter == manager. An
    integration that never stamps the engines at all (client-side versions) fails with that, said plainly."""
    failures: list[Anomaly] = []
    ok = [c for c in h.cycles if c.ok]
    stamped = any(_stamps(h.integration_calls(), h.profile))
    if ok and not stamped:
        labels = sorted({str(label) for c in ok for label in c.labels_after})
        kinds = ", ".join(sorted({"LoRA" if c.lora else c.transport for c in ok}))
        failures.append(Anomaly(
            "never-stamped",
            f"the engines were never stamped: no /update_weight_version and no weight_version in any "
            f"transfer in {len(ok)} successful cycle(s) ({kinds}), so every engine still reports "
            f"weight_version "
            f"{', '.join(labels)} while the trainer counter reached {ok[-1].returned}; SGLang's "
            f"meta_info.weight_version and /model_info never show the version"
            + ("" if h.stamps_engines else " (the integration declares client-side versions)"),
            versions=(ok[-1].returned,)))
    for c in ok if stamped else []:
        kind = "LoRA" if c.lora else c.transport
        if c.returned != c.counter_after or c.published_after != c.returned:
            failures.append(Anomaly(
                "counter-mismatch",
                f"cycle {c.index} ({kind}, cell {c.cell}): updater returned {c.returned}, its counter is "
                f"{c.counter_after}, the manager holds {c.published_after}",
                cycle=c.index, versions=(c.returned, c.counter_after, c.published_after)))
        for engine, label in enumerate(c.labels_after):
            if label != str(c.returned):
                failures.append(Anomaly(
                    "label-mismatch",
                    f"cycle {c.index} ({kind}, cell {c.cell}): the trainer counter is {c.returned} but "
                    f"engine {engine} reports weight_version {label!r} after the update",
                    engine=engine, cycle=c.index, versions=(c.returned, label)))
    return verdict(failures, vacuous=None if ok else "no update cycle succeeded",
                   metrics={"successful_cycles": len(ok)})


@check("V2", "publish only after success",
       needs={"cycle"},
       holds="a version is stamped only after that engine's whole transfer succeeded, and a failed update changes "
             "no label and publishes nothing",
       reads="`/update_weight_version` and `weight_version` inside transfer bodies (a stamp in an early bucket "
             "relabels before later buckets land), against each transfer's answer; a cycle with a refusal it never "
             "recovered from is failed, whatever `update()` returned")
def published_only_after_success(h: History) -> Verdict:
    """V2: a failed update changes no label and publishes nothing (failed as the updater says, or as the wire does: a
    refusal the cycle never recovered from); a version is stamped on an engine only after
    that engine's whole transfer succeeded, wherever the stamp travels: ``/update_weight_version``, or
    ``weight_version`` inside a transfer body (per bucket, SGLang relabels on the first bucket that lands)."""
    failures: list[Anomaly] = []
    for c in h.cycles:
        refused = h.refused(c)
        if c.ok and refused and c.published_after != c.published_before:
            (engine, path), calls = next(iter(refused.items()))
            failures.append(Anomaly(
                "published-despite-refusal",
                f"cycle {c.index}: engine {engine} answered {calls[0].status} {calls[0].response!r} to {path} and "
                f"never accepted it after, yet the update returned and the manager's version moved "
                f"{c.published_before} → {c.published_after} (the wire says the cycle failed)",
                engine=engine, cycle=c.index, versions=(c.published_before, c.published_after),
                times=(calls[0].t_start,)))
        if not c.ok:
            if c.published_after != c.published_before:
                failures.append(Anomaly(
                    "published-on-failure",
                    f"cycle {c.index} failed ({c.error}) yet the manager's version moved "
                    f"{c.published_before} → {c.published_after}",
                    cycle=c.index, versions=(c.published_before, c.published_after)))
            for engine, (before, after) in enumerate(zip(c.labels_before, c.labels_after)):
                if before != after:
                    failures.append(Anomaly(
                        "relabelled-on-failure",
                        f"cycle {c.index} failed ({c.error}) yet engine {engine}'s label moved "
                        f"{before!r} → {after!r}",
                        engine=engine, cycle=c.index, versions=(before, after)))
        for engine in sorted({w.engine for w in h.cycle_calls(c)}):
            calls = h.cycle_calls(c, engine)
            transfers = [w for w in calls if w.path in TRANSFER_PATHS]
            for stamp, at, version, how in _stamps(calls, h.profile):
                pending = [w for w in transfers if w is not stamp and (w.t_end is None or w.t_end > at or not w.ok)]
                if pending:
                    w = pending[0]
                    state = ("failed" if w.t_end is not None and not w.ok else
                             "had not finished" if w.t_start <= at
                             else f"was still to come (sent at t={w.t_start:.3f}s)")
                    failures.append(Anomaly(
                        "stamped-early",
                        f"cycle {c.index}: engine {engine} was relabelled to {version!r} {how} at "
                        f"t={at:.3f}s while its transfer {w.path} {state}",
                        engine=engine, cycle=c.index, versions=(version,), times=(at,)))
    failed = sum(not c.ok for c in h.cycles)
    return verdict(failures,
                   vacuous=None if h.cycles else "no update cycle ran", metrics={"failed_cycles": failed})


def _stamps(calls: Iterable[WireCall], profile: str) -> list[tuple[WireCall, float, str, str]]:
    """Where an engine's label changed in these calls: (call, when, version, how). A bump relabels when it is sent;
    a transfer carrying ``weight_version`` relabels when it succeeds (SGLang sets the version only on success), and so
    does vLLM's ``/finish_weight_update`` carrying one (recorded as ``/end_weight_update``)."""
    stamps = []
    for w in calls:
        if w.path == "/update_weight_version":
            stamps.append((w, w.t_start, effective(w, "new_version", profile), "by /update_weight_version"))
        elif w.path in TRANSFER_PATHS and w.ok and w.t_end is not None:
            version = effective(w, "weight_version", profile)
            if version is not None:
                stamps.append((w, w.t_end, version, f"by its transfer {w.path} (weight_version in the body)"))
        elif w.path == "/end_weight_update" and w.sent_as is not None and w.ok and w.t_end is not None \
                and isinstance(w.payload, dict) and w.payload.get("weight_version") is not None:
            # vLLM's /finish_weight_update publishes the version it carries once it succeeded (SGLang's end takes none)
            stamps.append((w, w.t_end, str(w.payload["weight_version"]), f"by {w.sent_as} (weight_version in the body)"))
    return stamps


@check("V3", "no version before the first update",
       needs={"consumed-before-update"},
       holds="no current version before the first update: filter off, no staleness metrics (or, for an "
             "integration that publishes a version for its initial weights, that version)",
       reads="the batches consumed before the first successful cycle published (its last engine call answered: "
             "from then until `update()` returns, a batch may carry the new version)",
       model_based="it needs batches drained before the first update with the staleness filter on (the first-drain "
                   "scenario)")
def nothing_before_first_update(h: History) -> Verdict:
    """V3: before the first update there is no current version: filter off, no staleness metrics. An integration
    that publishes a version for its initial weights (``History.initial_version``, e.g. 0) is judged against that:
    its batches before the first update carry that version, and staleness is measured against it."""
    failures: list[Anomaly] = []
    first = next((c for c in h.cycles if c.ok), None)
    # the first version may be published once the first successful cycle's last engine call was answered: a batch
    # consumed from then until update() returned may carry it (the integration published, then cleaned up)
    published = None if first is None else first.returned
    early = [b for b in h.batches if first is None or b.t < first.t_end and not (
        b.t >= h.settled(first) and b.batch.weight_version is not None and b.batch.weight_version == published)]
    if h.initial_version is not None:
        for rec in early:
            if rec.batch.weight_version != h.initial_version:
                failures.append(Anomaly(
                    "version-before-update",
                    f"batch {rec.index} was consumed before any update with current version "
                    f"{rec.batch.weight_version!r}, yet the integration published {h.initial_version!r} for its "
                    f"initial weights", batch=rec.index, versions=(rec.batch.weight_version,), times=(rec.t,)))
        return verdict(failures, vacuous=None if early else "no batch was consumed before the first update",
                       metrics={"batches_before_first_update": len(early), "initial_version": h.initial_version})
    for rec in early:
        b = rec.batch
        if b.weight_version is not None:
            failures.append(Anomaly(
                "version-before-update",
                f"batch {rec.index} was consumed before any update, yet the manager's current version is "
                f"{b.weight_version!r} (must be None)",
                batch=rec.index, versions=(b.weight_version,), times=(rec.t,)))
        stale_keys = sorted(k for k in b.metrics if "staleness" in k)
        if stale_keys:
            failures.append(Anomaly(
                "staleness-before-update",
                f"batch {rec.index} was consumed before any update, yet reports staleness metrics "
                f"{ {k: b.metrics[k] for k in stale_keys} }",
                batch=rec.index, times=(rec.t,)))
        if b.metrics.get("stale_groups_filtered"):
            failures.append(Anomaly(
                "filtered-before-update",
                f"batch {rec.index}: {b.metrics['stale_groups_filtered']} group(s) filtered as stale "
                f"before any update",
                batch=rec.index, times=(rec.t,)))
        for g in b.groups:
            if g.staleness is not None:
                failures.append(Anomaly(
                    "staleness-before-update",
                    f"batch {rec.index}: prompt {g.prompt_index} has staleness {g.staleness} before "
                    f"any update (must be None: 'no version yet' is not version 0)",
                    batch=rec.index, prompt=g.prompt_index, times=(rec.t,)))
    return verdict(failures,
                   vacuous=None if early else "no batch was consumed before the first update",
                   metrics={"batches_before_first_update": len(early)})


@check("V4-S1", "never backwards",
       needs={"cycle"},
       holds="the published version never goes backwards (failover included); staleness never negative",
       reads="the manager's version after each cycle and at each batch")
def never_backwards(h: History) -> Verdict:
    """V4/S1: the published version never goes backwards (failover included) and staleness is never negative.
    A regression must be re-based or fail loudly; a cycle that raised on it is fine."""
    failures: list[Anomaly] = []
    published: list[tuple[float, str, int]] = []
    for c in h.cycles:
        if c.published_after is not None:
            published.append((c.t_end, f"after cycle {c.index} (cell {c.cell})", c.published_after))
    for rec in h.batches:
        if rec.batch.weight_version is not None:
            published.append((rec.t, f"at batch {rec.index}", rec.batch.weight_version))
        for g in rec.batch.groups:
            if g.staleness is not None and g.staleness < 0:
                failures.append(Anomaly(
                    "negative-staleness",
                    f"batch {rec.index}: prompt {g.prompt_index} was admitted with negative staleness "
                    f"{g.staleness} (current {rec.batch.weight_version}, oldest {g.oldest_version})",
                    batch=rec.index, prompt=g.prompt_index, versions=(rec.batch.weight_version, g.oldest_version),
                    times=(rec.t,)))
    high: tuple[str, int] | None = None
    for _, where, v in sorted(published, key=lambda p: p[0]):
        if high is not None and v < high[1]:
            failures.append(Anomaly(
                "version-backwards",
                f"the manager's version went backwards: {high[1]} ({high[0]}) → {v} ({where})",
                versions=(high[1], v)))
        if high is None or v >= high[1]:
            high = (where, v)
    cells = {c.cell for c in h.cycles}
    return verdict(failures,
                   vacuous=None if h.cycles else "no update cycle ran",
                   metrics={"cells": len(cells), "max_published": high[1] if high else None})
