"""F3: disk transports publish only complete checkpoints, and delete one only after every engine loaded it."""

from __future__ import annotations

from pathlib import PurePath

from ..anomaly import Anomaly
from ..history import History
from .registry import check
from .verdict import Verdict, verdict


@check("F3", "atomic checkpoints",
       holds="disk checkpoints are published atomically (rename) and kept until every engine loaded them",
       reads="the `model_path` of each `/update_weights_from_disk` against inotify events of the checkpoint "
             "directory",
       model_based="it needs disk updates (the disk scenarios), which the model-based run mixes with the other "
                   "transports")
def atomic_checkpoints(h: History) -> Verdict:
    """F3: every checkpoint an engine is told to load arrived at its path by an atomic rename (never written in
    place, where a reader can see it half-written: seed 004), and is not removed before the last engine loaded it."""
    loads = [w for w in h.integration_calls("/update_weights_from_disk") if isinstance(w.payload, dict)]
    if not loads:
        return verdict([], vacuous="no disk update ran")
    if h.fs is None:
        return verdict([], vacuous="this platform cannot watch the checkpoint directory")
    failures: list[Anomaly] = []
    names = {PurePath(str(w.payload.get("model_path", ""))).name for w in loads}
    for name in sorted(names):
        arrivals = [e for e in h.fs if e.name == name and e.kind in ("created", "moved_in")]
        if not arrivals:
            failures.append(Anomaly(
                "checkpoint-not-seen",
                f"checkpoint {name!r} was sent to the engines but never appeared in the watched "
                f"checkpoint directory (written elsewhere?)"))
        mine = [w for w in loads if PurePath(str(w.payload.get("model_path"))).name == name]
        last_load, first_load = max((w.t_end or w.t_start) for w in mine), min(w.t_start for w in mine)
        for e in arrivals:
            if e.kind == "created":
                failures.append(Anomaly(
                    "checkpoint-in-place",
                    f"checkpoint {name!r} was created in place at t={e.t:.3f}s, not renamed into place, "
                    f"so while it is being written a reader of the directory sees it incomplete (the "
                    f"first engine was told to load it at t={first_load:.3f}s); write it to a temp dir and "
                    f"rename it",
                    times=(e.t, first_load)))
        for e in h.fs:
            if e.name == name and e.kind in ("deleted", "moved_out") and first_load <= e.t < last_load:
                failures.append(Anomaly(
                    "checkpoint-removed",
                    f"checkpoint {name!r} was removed at t={e.t:.3f}s before the last engine finished "
                    f"loading it at t={last_load:.3f}s",
                    times=(e.t, last_load)))
    return verdict(failures, metrics={"checkpoints": len(names)})
