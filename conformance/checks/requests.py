"""In-flight requests: I1/I2 (no abort by a version bump or an update cycle), I4 (aborted groups never train)."""

from __future__ import annotations

from ..history import History
from .labels import finish_type
from .verdict import Verdict, verdict


def _injected_abort_windows(h: History) -> list[tuple[float, int | None]]:
    return [(i.t, i.engine) for i in h.injected if i.kind == "abort"]


def no_aborts_on_update(h: History) -> Verdict:
    """I1/I2: a version bump never aborts (``abort_all_requests: false`` on the wire) and a whole update
    cycle under retract / in_place aborts none of the requests in flight. Reports the aborted-sample rate."""
    unsafe_bumps: dict[int, list] = {}
    for call in h.integration_calls("/update_weight_version"):
        payload = call.payload if isinstance(call.payload, dict) else {}
        if payload.get("abort_all_requests") is not False:
            unsafe_bumps.setdefault(call.engine, []).append(call)
    failures: list[str] = []
    injected = _injected_abort_windows(h)
    generates = [c for c in h.integration_calls("/generate")]
    total = aborted = overlapping = 0
    for call in generates:
        outs = call.generate_outputs()
        total += max(1, len(outs))
        cycles = [c for c in h.cycles if call.overlaps(c.t_start, c.t_end)]
        overlapping += bool(cycles)
        for out in outs:
            if finish_type(out) != "abort":
                continue
            if any(t >= call.t_start and (e is None or e == call.engine) for t, e in injected):
                continue
            aborted += 1
            meta = out["meta_info"]
            where = (f"was in flight during update cycle {cycles[0].index} (cell {cycles[0].cell}, "
                     f"{cycles[0].transport}, pause {cycles[0].pause_mode})") if cycles else "was in flight"
            bumps = [b for b in h.integration_calls("/update_weight_version", call.engine)
                     if call.overlaps(b.t_start, b.t_start + 1e-9)]
            bump = (f"; version {bumps[0].payload.get('new_version') if isinstance(bumps[0].payload, dict) else '?'}"
                    f" was published to it at t={bumps[0].t_start:.3f}s") if bumps else ""
            failures.append(
                f"request {meta.get('id')} (engine {call.engine}) {where}{bump} and finished with finish_reason "
                f"abort ({meta['finish_reason'].get('message') if isinstance(meta.get('finish_reason'), dict) else ''}) "
                f"after {meta.get('completion_tokens', len(out.get('output_ids') or []))} tokens")
    for engine, calls in sorted(unsafe_bumps.items()):
        failures.append(
            f"engine {engine}: {len(calls)} POST /update_weight_version call(s) do not send \"abort_all_requests\": "
            f"false (first: {calls[0].payload} at t={calls[0].t_start:.3f}s), so SGLang's default (True) aborts "
            f"every request in the scheduler")
    updates = max(1, len(h.cycles))
    if aborted:
        failures.insert(0, f"{aborted} of {total} requests ({aborted / total:.0%}) were aborted during update cycles")
    metrics = {"requests": total, "aborted": aborted, "aborted_sample_rate": aborted / total if total else 0.0,
               "aborts_per_update": aborted / updates, "requests_spanning_updates": overlapping}
    vacuous = None if overlapping else "no request was in flight during any update cycle: the run proves nothing"
    if not h.cycles:
        vacuous = "no update cycle ran"
    return verdict("I1/I2 no abort on update", failures, vacuous=vacuous, metrics=metrics)


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
