"""F3: no engine reads a checkpoint that is not complete and final, and none is deleted before every engine loaded
it."""

from __future__ import annotations

from pathlib import PurePath

from ..anomaly import Anomaly
from ..history import FsEvent, History, WireCall
from .registry import check
from .verdict import Verdict, verdict


@check("F3", "atomic checkpoints",
       needs={"disk"},
       holds="no engine reads a checkpoint file that is not complete and final: nothing is written into a "
             "checkpoint once an engine was told to load it (whatever the publish protocol: a directory rename, "
             "files renamed into place, a marker written last; a reused path is replaced by a rename), and it is kept "
             "until every engine loaded it; judged per load",
       reads="the `model_path` of each `/update_weights_from_disk` (other than the engines' own base model, "
             "which a restore may load) against inotify events of the checkpoint directory and of the inside of each "
             "checkpoint renamed into it",
       model_based="it needs disk updates (the disk scenarios), which the model-based run mixes with the other "
                   "transports")
def atomic_checkpoints(h: History) -> Verdict:
    """F3, per load: every checkpoint an engine is told to load is complete and final by then, whatever the publish
    protocol (renamed into place whole, or created in place with its files renamed in and a marker written last):
    nothing is written into it once an engine was told to load it (a save still running as the engines read it; a
    path reused across versions rewritten inside rather than replaced by a rename), and it is not removed before
    the last engine told to load it finished. A path that receives a new checkpoint is judged per arrival."""
    loads = [w for w in h.integration_calls("/update_weights_from_disk") if isinstance(w.payload, dict)
             and (h.served_model is None or w.payload.get("model_path") != h.served_model)]
    if not loads:
        return verdict([], vacuous="no disk update ran")
    if h.fs is None:
        return verdict([], vacuous="this platform cannot watch the checkpoint directory")
    failures: list[Anomaly] = []
    names = {PurePath(str(w.payload.get("model_path", ""))).name for w in loads}
    loaded_arrivals = 0
    for name in sorted(names):
        events = [e for e in h.fs if e.name == name]
        arrivals = [e for e in events if e.kind in ("created", "moved_in")]
        if not arrivals:
            failures.append(Anomaly(
                "checkpoint-not-seen",
                f"checkpoint {name!r} was sent to the engines but never appeared in the watched "
                f"checkpoint directory (written elsewhere?)"))
        mine = [w for w in loads if PurePath(str(w.payload.get("model_path"))).name == name]
        failures += _told_after_removal(name, mine, events)
        for arrival in arrivals:  # each arrival at the path is its own checkpoint, until it is moved or deleted away
            gone = next((e for e in events if e.kind in ("deleted", "moved_out") and e.t > arrival.t), None)
            until = gone.t if gone is not None else float("inf")
            told = [w for w in mine if arrival.t <= w.t_start < until]
            if not told:
                continue
            loaded_arrivals += 1
            first_load, last_load = min(w.t_start for w in told), max((w.t_end or w.t_start) for w in told)
            removal = next((e for e in events if e.kind in _REMOVAL and e.t > arrival.t), None)
            if removal is not None and first_load <= removal.t < last_load:
                failures.append(Anomaly(
                    "checkpoint-removed",
                    f"checkpoint {name!r} was removed at t={removal.t:.3f}s"
                    + (f" (its file {removal.inner!r} deleted first)" if removal.inner else "")
                    + f" before the last engine finished loading it at t={last_load:.3f}s",
                    times=(removal.t, last_load)))
            written = [e for e in events if e.kind == "written" and first_load <= e.t < until]
            if written:
                engines = sorted({w.engine for w in told if w.t_start <= written[0].t})
                how = (f"created in place at t={arrival.t:.3f}s and still being written: an engine reads files that "
                       f"are not complete and final; tell the engines to load it only once every file is written "
                       f"(rename it into place whole, or write a marker last and wait for it)"
                       if arrival.kind == "created" else
                       "a path reused across versions must be replaced by renaming a complete checkpoint into "
                       "place, never rewritten inside, or a reader sees old and new files mixed")
                failures.append(Anomaly(
                    "checkpoint-written-after-load" if arrival.kind == "created" else "checkpoint-rewritten",
                    f"checkpoint {name!r} was written into at t={written[0].t:.3f}s ({written[0].inner}; "
                    f"{len(written)} write(s) in all) after engine(s) {engines} had been told to load it (first at "
                    f"t={first_load:.3f}s): {how}",
                    engine=engines[0] if engines else None, times=(written[0].t, first_load)))
    return verdict(failures, metrics={"checkpoints": len(names)})


_REMOVAL = ("deleted_inside", "deleted", "moved_out")
"""The events that show a checkpoint's removal under way: its files deleted, or the checkpoint itself gone."""


def _told_after_removal(name: str, loads: list[WireCall], events: list[FsEvent]) -> list[Anomaly]:
    """Loads of ``name`` sent while no checkpoint was at that path because an earlier one had been removed (the
    engine reads a missing folder: SGLang answers 400, or loads whatever a later writer left half-done)."""
    found = []
    for w in loads:
        last = next((e for e in reversed(events) if e.t <= w.t_start and e.kind != "written"), None)
        if last is not None and last.kind in _REMOVAL:
            found.append(Anomaly(
                "checkpoint-removed",
                f"engine {w.engine} was told to load checkpoint {name!r} at t={w.t_start:.3f}s, after it was "
                f"removed at t={last.t:.3f}s (freed before every engine had loaded it)",
                engine=w.engine, times=(last.t, w.t_start)))
    return found[:1]
