"""In-flight requests: I1/I2 (no abort by a version bump or an update cycle), I4 (aborted groups never train)."""

from __future__ import annotations

from ..history import DISTURBING_PATHS, History, WireCall
from .labels import finish_type
from .verdict import Verdict, verdict


_ACTION = {"/pause_generation": "paused", "/update_weight_version": "relabelled"}


def _cause(h: History, call: WireCall) -> str:
    """What the integration sent to the engine last before ``call`` ended: the likely cause of its abort."""
    end = call.t_end if call.t_end is not None else float("inf")
    before = [w for w in h.integration_calls(engine=call.engine) if w.path in DISTURBING_PATHS and w.t_start <= end]
    if not before:
        return ""
    w = before[-1]
    payload = w.payload if isinstance(w.payload, dict) else {}
    if w.path == "/update_weight_version":
        what = f"version {payload.get('new_version')!r} was published to it"
    elif w.path == "/pause_generation":
        what = "it was paused"
    else:
        what = f"it was sent {w.path}"
    shown = {k: payload[k] for k in _FIELDS_SHOWN if k in payload}
    return f"; {what} at t={w.t_start:.3f}s with {shown}"


_FIELDS_SHOWN = ("mode", "abort_all_requests", "flush_cache", "weight_version")
"""The payload fields that decide whether a call aborts requests (a transfer body also carries the weights)."""


def no_aborts_on_update(h: History) -> Verdict:
    """I1/I2: a version bump never aborts (``abort_all_requests: false`` on the wire) and a whole update cycle
    aborts none of the requests in the engines. Every cycle must show it: on every engine a request (the
    integration's, or the suite's long-lived sentinel) was resident when the cycle first touched that engine (its
    pause, else its transfer or bump); otherwise the run proves nothing there and the answer is unknown. Reports
    the aborted-sample rate and how often the integration's own requests were resident at the pause."""
    failures: list[str] = []
    for engine, calls in sorted(_unsafe_bumps(h).items()):
        failures.append(
            f"engine {engine}: {len(calls)} POST /update_weight_version call(s) do not send \"abort_all_requests\": "
            f"false (first: {calls[0].payload} at t={calls[0].t_start:.3f}s), so SGLang's default (True) aborts "
            f"every request in the scheduler")
    total = aborted = 0
    for call in h.wire:
        if call.path != "/generate":
            continue
        outs = call.generate_outputs()
        total += max(1, len(outs)) if call.origin == "integration" else 0
        for out in outs:
            if finish_type(out) != "abort" or any(i.excuses(call) for i in h.injected):
                continue
            meta = out["meta_info"]
            cycle = next((c for c in h.cycles if call.overlaps(c.t_start, c.t_end)), None)
            where = (f"during update cycle {cycle.index} (cell {cycle.cell}, {'LoRA' if cycle.lora else cycle.transport}"
                     f", pause {cycle.pause_mode})") if cycle else "outside any update cycle"
            reason = meta["finish_reason"].get("message") if isinstance(meta.get("finish_reason"), dict) else ""
            tokens = meta.get("completion_tokens", len(out.get("output_ids") or []))
            if call.origin == "integration":
                aborted += 1
                who = f"request {meta.get('id')} (engine {call.engine})"
            else:
                who = f"the suite's long-lived request {meta.get('id')} (engine {call.engine})"
            failures.append(f"{who}, sent at t={call.t_start:.3f}s, was aborted at t={call.t_end:.3f}s {where} after "
                            f"{tokens} tokens (finish_reason abort: {reason!r}){_cause(h, call)}")
    if aborted:
        failures.insert(0, f"{aborted} of {total} requests ({aborted / total:.0%}) were aborted during update cycles")
    pairs, idle, own = 0, [], 0
    for c in h.cycles:
        for engine in sorted({w.engine for w in h.cycle_calls(c)}):
            first = h.disturbing_call(c, engine)
            if first is None:
                continue
            pairs += 1
            resident = h.resident_at(engine, first.t_start)
            own += any(w.origin == "integration" for w in resident)
            if not resident:
                idle.append(f"engine {engine}: no request was resident when it was "
                            f"{_ACTION.get(first.path, 'sent new weights')} in cycle {c.index} (t={first.t_start:.3f}s)")
    metrics = {"requests": total, "aborted": aborted, "aborted_sample_rate": aborted / total if total else 0.0,
               "aborts_per_update": aborted / max(1, len(h.cycles)), "engine_cycles": pairs,
               "overlap_at_pause": (pairs - len(idle)) / pairs if pairs else None,
               "integration_overlap_at_pause": own / pairs if pairs else None}
    vacuous = "; ".join(idle) + ": the run proves nothing there" if idle else None
    if not pairs:
        vacuous = "no update cycle touched an engine" if h.cycles else "no update cycle ran"
    return verdict("I1/I2 no abort on update", failures, vacuous=vacuous, metrics=metrics)


def _unsafe_bumps(h: History) -> dict[int, list[WireCall]]:
    """Per engine, the version bumps that do not send ``abort_all_requests: false``."""
    unsafe: dict[int, list[WireCall]] = {}
    for call in h.integration_calls("/update_weight_version"):
        payload = call.payload if isinstance(call.payload, dict) else {}
        if payload.get("abort_all_requests") is not False:
            unsafe.setdefault(call.engine, []).append(call)
    return unsafe


def aborted_never_trained(h: History) -> Verdict:
    """I4: a group with an aborted turn never reaches training unchanged (drop it, or recycle it pristine)."""
    outputs = h.outputs_by_rid()
    aborted_rids = {rid for rid, (_, out) in outputs.items() if finish_type(out) == "abort"}
    failures: list[str] = []
    trained = 0
    for rec in h.batches:
        for group in rec.batch.groups:
            for sample in group.samples:
                trained += 1
                bad = [t.rid for t in sample.turns if t.rid in aborted_rids or t.finish_reason == "abort"]
                if bad:
                    failures.append(
                        f"batch {rec.index}: prompt {group.prompt_index} sample {sample.index} reached training with "
                        f"turn(s) {bad} that the engine finished with finish_reason abort (partial output)")
    vacuous = None if aborted_rids else "no request was aborted during the run, so the recycle path never ran"
    return verdict("I4 aborted groups never train", failures, vacuous=vacuous,
                   metrics={"aborted_requests": len(aborted_rids), "trained_samples": trained})
