"""Protocol: I6 (pause paired with resume, sessions closed), P5 (engine failures fatal), C2 (flush contract),
P1 (order inside a cycle)."""

from __future__ import annotations

from ..history import TRANSFER_PATHS, History, WireCall
from .verdict import Verdict, verdict


def _by_engine(h: History, paths: set[str]) -> dict[int, list[WireCall]]:
    out: dict[int, list[WireCall]] = {}
    for call in h.wire:
        if call.path in paths:
            out.setdefault(call.engine, []).append(call)
    return out


def pause_paired_with_resume(h: History) -> Verdict:
    """I6: every pause is followed by a continue on the same engine before its cycle ends (also when the cycle
    failed), and every weight-update session opened in a cycle is closed in it. Pausing an engine that is
    already paused means an earlier cycle left it paused."""
    failures: list[str] = []
    pairs = (("/pause_generation", "/continue_generation", "paused"),
             ("/begin_weight_update", "/end_weight_update", "mid-session"))
    windows = [(c.t_start, c.t_end, c) for c in h.cycles] + [(float("-inf"), float("inf"), None)]
    for opened_path, closed_path, state in pairs:
        for engine, calls in _by_engine(h, {opened_path, closed_path}).items():
            for t0, t1, cycle in windows:
                inside = [w for w in calls if w.ok and t0 <= w.t_start <= t1]
                open_call: WireCall | None = None
                for call in inside:
                    if call.path == opened_path and open_call is not None and cycle is None:
                        failures.append(f"engine {engine}: {opened_path} at t={call.t_start:.3f}s while still {state} "
                                        f"since t={open_call.t_start:.3f}s")
                    if call.path == opened_path:
                        open_call = open_call or call
                    else:
                        open_call = None
                if open_call is not None:
                    where = (f"in cycle {cycle.index} ({'failed: ' + str(cycle.error) if not cycle.ok else 'ok'})"
                             if cycle else "and by the end of the run")
                    failures.append(f"engine {engine}: {opened_path} at t={open_call.t_start:.3f}s {where} was not "
                                    f"followed by {closed_path}: the engine was left {state}")
    pauses = sum(1 for c in h.wire if c.path == "/pause_generation")
    return verdict("I6 pause paired with resume", failures, vacuous=None if pauses else "no engine was ever paused",
                   metrics={"pauses": pauses})


def failures_are_fatal(h: History) -> Verdict:
    """P5: an engine-reported failure (non-200, ``success: false``) during a cycle makes the update raise,
    unless the same call was retried on that engine and succeeded (a flush back-off)."""
    failures: list[str] = []
    seen = 0
    for c in h.cycles:
        calls = [w for w in h.wire if c.t_start <= w.t_start <= c.t_end and w.path != "/generate"]
        for i, w in enumerate(calls):
            if w.ok or w.status is None and w.t_end is None:
                continue
            recovered = any(later.ok and later.path == w.path and later.engine == w.engine for later in calls[i + 1:])
            if recovered:
                continue
            seen += 1
            if c.ok:
                failures.append(f"engine {w.engine} answered {w.status} {w.response!r} to {w.path} in cycle {c.index}, "
                                f"yet the updater returned version {c.returned} and published it")
    return verdict("P5 engine failures are fatal", failures,
                   vacuous=None if seen else "no engine reported a failure during any cycle", metrics={"failures": seen})


def flush_contract(h: History) -> Verdict:
    """C2: never flush while an engine is paused in place (its resident requests make SGLang refuse or crash)."""
    failures: list[str] = []
    in_place = 0
    for engine, calls in _by_engine(h, {"/pause_generation", "/continue_generation", "/flush_cache"}).items():
        paused_in_place = False
        for call in calls:
            if call.path == "/pause_generation" and call.ok:
                paused_in_place = isinstance(call.payload, dict) and call.payload.get("mode") == "in_place"
                in_place += paused_in_place
            elif call.path == "/continue_generation" and call.ok:
                paused_in_place = False
            elif call.path == "/flush_cache" and paused_in_place:
                failures.append(f"engine {engine}: /flush_cache at t={call.t_start:.3f}s while paused in_place "
                                f"(answered {call.status}): SGLang refuses it with requests resident (0.5.23) or crashes "
                                f"the scheduler (<=0.5.16)")
    for c in h.wire:
        payload = c.payload if isinstance(c.payload, dict) else {}
        if c.path in TRANSFER_PATHS and payload.get("flush_cache") is True:
            cycle = h.cycle_at(c.t_start)
            if cycle and cycle.pause_mode == "in_place":
                failures.append(f"engine {c.engine}: {c.path} with flush_cache=true under pause in_place "
                                f"(cycle {cycle.index})")
    return verdict("C2 flush contract", failures, vacuous=None if in_place else "no engine was paused in place",
                   metrics={"in_place_pauses": in_place})


def cycle_order(h: History) -> Verdict:
    """P1: pause → (flush) → (begin) → transfer → version → (end) → continue, per engine, inside each cycle."""
    rank = {"/pause_generation": 0, "/flush_cache": 1, "/begin_weight_update": 2, **{p: 3 for p in TRANSFER_PATHS},
            "/update_weight_version": 4, "/end_weight_update": 5, "/continue_generation": 6}
    failures: list[str] = []
    for c in h.cycles:
        if not c.ok:
            continue
        for engine in {w.engine for w in h.wire}:
            calls = [w for w in h.wire if w.engine == engine and c.t_start <= w.t_start <= c.t_end and w.path in rank]
            steps = [w.path for w in calls if w.ok or w.path != "/flush_cache"]
            for a, b in zip(steps, steps[1:]):
                if rank[b] < rank[a] and not (a in TRANSFER_PATHS and b in TRANSFER_PATHS):
                    failures.append(f"cycle {c.index}, engine {engine}: {b} came after {a} (calls: {steps})")
                    break
    return verdict("P1 cycle order", failures, vacuous=None if h.cycles else "no update cycle ran")
