"""In-flight requests: I1/I2 (no abort by a version bump or an update cycle), I4 (aborted groups never train)."""

from __future__ import annotations

from ..anomaly import Anomaly, note
from ..history import DISTURBING_PATHS, LORA_LOAD_PATHS, TRANSFER_PATHS, History, UpdateCycle, WireCall
from .effective import effective, sent_as
from .labels import cut_short, finish_type
from .registry import check
from .verdict import Verdict, verdict


ABORTING_PATHS = (TRANSFER_PATHS | {"/update_weight_version"}) - LORA_LOAD_PATHS
"""Calls that take ``abort_all_requests`` (``python/sglang/srt/managers/io_struct.py``: ``UpdateWeightVersionReqInput``
and the ``UpdateWeightsFrom*ReqInput`` structs, 0.5.1–0.5.23)."""
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


@check("I1-I2", "no abort on update",
       needs={"resident"},
       holds="no bump or transfer aborts, and a whole update cycle aborts none of the requests in the engines; on "
             "every engine a request was resident when the cycle first touched it, else `unknown`; a request the "
             "integration drops itself around an update counts as aborted; aborted-request and aborted-sample "
             "rates, recompute tokens",
       reads="`abort_all_requests` as SGLang reads it on `/update_weight_version` (default true) and on every "
             "transfer; every `/generate` answer with `finish_reason` abort and what was sent to that engine "
             "before it; the `/generate` calls open at each engine's pause (or first transfer/bump)",
       measures=True)
def no_aborts_on_update(h: History) -> Verdict:
    """I1/I2: no bump or transfer aborts (their effective ``abort_all_requests`` is false: the bump's default is
    true) and a whole update cycle aborts none of the requests in the engines. Every cycle must show it: on every
    engine a request (the integration's, or the suite's long-lived sentinel) was resident when the cycle first
    touched that engine (its pause, else its transfer or bump); otherwise the run proves nothing there and the
    answer is unknown. An aborted request that a later call continued (partial rollout) still fails I2 (the
    recompute is a real cost) but is not a lost sample. Reports per ``/generate`` call the aborted-request rate,
    the aborted-sample rate (aborted and not continued: lost or trained truncated), the tokens prefilled again for
    continued requests, and how often the integration's own requests were resident at the pause (on the engines it
    sends requests to). A request the
    integration drops itself around an update (the connection closed before an answer) is lost work too: it counts
    and fails like an engine abort."""
    failures: list[Anomaly] = []
    for (engine, path), calls in sorted(_aborting_calls(h).items()):
        first = calls[0]
        failures.append(Anomaly(
            "aborting-call",
            f"engine {engine}: {len(calls)} POST {path} call(s) abort every request in the engine "
            f"(first at t={first.t_start:.3f}s: {sent_as(first, 'abort_all_requests', h.profile)}; "
            f"SGLang reads abort_all_requests as true)",
            engine=engine, times=(first.t_start,)))
    continued = _continued(h)
    total = aborted = resumed = recompute = 0
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
            kind = "LoRA" if cycle and cycle.lora else cycle.transport if cycle else ""
            where = (f"during update cycle {cycle.index} (cell {cycle.cell}, {kind}"
                     f", pause {cycle.pause_mode})") if cycle else "outside any update cycle"
            reason = meta["finish_reason"].get("message") if isinstance(meta.get("finish_reason"), dict) else ""
            tokens = meta.get("completion_tokens", len(out.get("output_ids") or []))
            then = ""
            if call.origin == "integration":
                aborted += 1
                who = f"request {meta.get('id')} (engine {call.engine})"
                if str(meta.get("id")) in continued:
                    resumed += 1
                    cost = int(meta.get("prompt_tokens") or 0) + int(tokens or 0)
                    recompute += cost
                    then = (f"; it was continued by request {continued[str(meta.get('id'))]} (partial rollout: no "
                            f"sample lost, {cost} tokens prefilled again)")
            else:
                who = f"the suite's long-lived request {meta.get('id')} (engine {call.engine})"
            failures.append(Anomaly(
                "aborted-request",
                f"{who}, sent at t={call.t_start:.3f}s, was aborted at t={call.t_end:.3f}s {where} after "
                f"{tokens} tokens (finish_reason abort: {reason!r}){_cause(h, call)}{then}",
                engine=call.engine, rids=(str(meta.get("id")),), cycle=cycle.index if cycle else None,
                times=(call.t_start, call.t_end)))
    for call, cycle in _dropped(h):
        aborted += 1
        rid = str(call.payload.get("rid")) if isinstance(call.payload, dict) else "?"
        resumed += rid in continued
        failures.append(Anomaly(
            "dropped-request",
            f"request {rid} (engine {call.engine}), sent at t={call.t_start:.3f}s, was dropped by the integration at "
            f"t={call.t_end:.3f}s, {'during' if call.t_end <= cycle.t_end else 'just after'} update cycle "
            f"{cycle.index} (cell {cycle.cell}), before the engine answered: the connection closed, so its work is "
            f"lost like an abort's, with no abort on the wire",
            engine=call.engine, rids=(rid,), cycle=cycle.index, times=(call.t_start, call.t_end)))
    if aborted:
        failures.insert(0, note(
            f"{aborted} of {total} requests ({aborted / total:.0%}) were aborted during update cycles"))
    pairs, idle, own, own_pairs = 0, [], 0, 0
    used = {w.engine for w in h.integration_calls("/generate")}
    for c, engine, first in h.disturbing_calls():
        pairs += 1
        resident = h.resident_at(engine, first.t_start)
        own_pairs += engine in used
        own += any(w.origin == "integration" for w in resident)
        if not resident:
            idle.append(f"engine {engine}: no request was resident when it was "
                        f"{_ACTION.get(first.path, 'sent new weights')} in cycle {c.index} "
                        f"(t={first.t_start:.3f}s{_around(h, engine, first.t_start)}"
                        f"{_expired(h, engine, c)})")
    metrics = {"requests": total, "aborted_requests": aborted, "continued_requests": resumed,
               "aborted_request_rate": aborted / total if total else 0.0,
               "aborted_sample_rate": (aborted - resumed) / total if total else 0.0,
               "recompute_tokens": recompute, "aborts_per_update": aborted / max(1, len(h.cycles)),
               "engine_cycles": pairs,
               "overlap_at_pause": (pairs - len(idle)) / pairs if pairs else None,
               "integration_overlap_at_pause": own / own_pairs if own_pairs else None}
    vacuous = "; ".join(idle) + ": the run proves nothing there" if idle else None
    if not pairs:
        vacuous = "no update cycle touched an engine" if h.cycles else "no update cycle ran"
    return verdict(failures, vacuous=vacuous, metrics=metrics)


def _around(h: History, engine: int, t: float) -> str:
    """Where ``engine``'s requests were around ``t`` when none was open then: the last that ended before it and the
    first sent after it (a long-lived request that ended just before a pause shows here)."""
    calls = [w for w in h.wire if w.engine == engine and w.path == "/generate"]
    before = max((w for w in calls if w.t_end is not None and w.t_end <= t), key=lambda w: w.t_end, default=None)
    after = min((w for w in calls if w.t_start >= t), key=lambda w: w.t_start, default=None)
    told = []
    if before is not None:
        told.append(f"the last request there ({before.origin}) ended at t={before.t_end:.3f}s")
    if after is not None:
        told.append(f"the next ({after.origin}) was sent at t={after.t_start:.3f}s")
    return "; " + ", ".join(told) if told else "; no request was ever sent there"


def _expired(h: History, engine: int, cycle: UpdateCycle) -> str:
    """That the suite's hold of the cycle's first call on ``engine`` went on at its bound, where it did."""
    return "".join(f"; {i.detail}" for i in h.injected if i.kind == "hold-expired" and i.engine == engine
                   and cycle.t_start <= i.t <= cycle.t_end)


AROUND_S = 1.0
"""How long after a cycle ended a request the integration drops still counts as lost to that update (a manager
that drops and regenerates its requests when it sees the new version)."""


def _dropped(h: History) -> list[tuple[WireCall, UpdateCycle]]:
    """The integration's ``/generate`` calls it closed before any answer (no status) during an update cycle or
    within :data:`AROUND_S` after it, before the teardown, with the cycle."""
    found = []
    for call in h.integration_calls("/generate"):
        if call.status is not None or call.t_end is None or (h.t_teardown is not None and call.t_end >= h.t_teardown):
            continue
        cycle = next((c for c in h.cycles if c.t_start <= call.t_end <= c.t_end + AROUND_S), None)
        if cycle is not None and not any(i.excuses(call) for i in h.injected):
            found.append((call, cycle))
    return found


def _continued(h: History) -> dict[str, str]:
    """Aborted rid → the rid of the consumed turn that continued it (``Turn.continues``)."""
    return {old: t.rid for rec in h.batches for g in rec.batch.groups for sample in g.samples for t in sample.turns
            for old in t.continues}


def _aborting_calls(h: History) -> dict[tuple[int, str], list[WireCall]]:
    """Per engine and path, the bumps and transfers whose effective ``abort_all_requests`` is true (the bump's
    default is true: ``UpdateWeightVersionReqInput.abort_all_requests``, radixark/miles #2589)."""
    found: dict[tuple[int, str], list[WireCall]] = {}
    for call in h.integration_calls():
        if call.path in ABORTING_PATHS and effective(call, "abort_all_requests", h.profile) is True:
            found.setdefault((call.engine, call.path), []).append(call)
    return found


@check("I4", "aborted groups never train",
       needs={"aborted", "consumed"},
       holds="aborted groups never reach training unchanged (dropped, recycled pristine, or continued: "
             "`Turn.continues`); a turn answered with abort after generating its whole token budget is complete "
             "(SGLang reports the abort when it lands in the step that decoded the last token), so training it is "
             "fine (`complete_aborts`, `complete_aborts_trained`)",
       reads="`/generate` answers finished with abort, joined by rid with the turns of consumed batches",
       model_based="it needs aborts injected mid-rollout (the aborted-groups scenario), which the model-based run "
                   "does not do")
def aborted_never_trained(h: History) -> Verdict:
    """I4: a group with an aborted turn never reaches training unchanged: drop it, recycle it as the pristine
    prompt, or continue the aborted call (partial rollout: the continuing turn names it in ``continues`` and its
    own call must have finished). A turn answered with abort after generating its whole token budget is complete
    (``complete_aborts``; those trained: ``complete_aborts_trained``). Reports how aborted requests were dealt
    with."""
    outputs = h.outputs_by_rid()
    aborted_rids = {rid for rid, (call, out) in outputs.items() if cut_short(call.payload, out)}
    complete = {rid for rid, (call, out) in outputs.items() if finish_type(out) == "abort" and rid not in aborted_rids}
    failures: list[Anomaly] = []
    trained = continued = complete_trained = 0
    for rec in h.batches:
        for group in rec.batch.groups:
            for sample in group.samples:
                trained += 1
                continued += sum(len(t.continues) for t in sample.turns)
                complete_trained += sum(t.rid in complete for t in sample.turns)
                bad = [t.rid for t in sample.turns
                       if t.rid in aborted_rids or (t.finish_reason == "abort" and t.rid not in complete)]
                if bad:
                    failures.append(Anomaly(
                        "aborted-trained",
                        f"batch {rec.index}: prompt {group.prompt_index} sample {sample.index} reached training with "
                        f"turn(s) {bad} that the engine finished with finish_reason abort (partial output, not "
                        f"continued)",
                        rids=tuple(bad), batch=rec.index, prompt=group.prompt_index))
    vacuous = None if aborted_rids else "no request was aborted during the run, so the recycle path never ran"
    return verdict(failures, vacuous=vacuous,
                   metrics={"aborted_requests": len(aborted_rids), "trained_samples": trained,
                            "continued_requests": continued, "complete_aborts": len(complete),
                            "complete_aborts_trained": complete_trained})
