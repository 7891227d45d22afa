"""The weights behind the tokens: P6 (engines hold the trainer's weights), P8 (served weights were published)."""

from __future__ import annotations

from dataclasses import dataclass

from ..anomaly import Anomaly
from ..history import WEIGHT_LOAD_PATHS, HeldWeights, History, UpdateCycle, WireCall
from .registry import check
from .verdict import Verdict, verdict


@check("P6", "engines hold the trainer's weights",
       needs={"full-update"},
       holds="engines hold exactly the trainer's weights, parameter by parameter (a name SGLang skips is named); "
             "after a failed update no engine is left without weights",
       reads="the weights each engine holds (fake: its store; real SGLang: `/get_weights_by_name` of every "
             "parameter)")
def weights_match(h: History) -> Verdict:
    """P6: after a successful full-weight update every engine holds exactly the trainer's weights, parameter by
    parameter (a name the engine does not have is skipped by SGLang's loader with a warning, so the update
    answers success and the engine keeps stale weights: the witness names the parameter). After a failed one, no
    engine is left without weights (vLLM is, its layers on the meta device, until a reload succeeds). An engine left
    with a mix of old and new weights (SGLang's failed distributed load) is P8's: it must not serve them."""
    failures: list[Anomaly] = []
    checked = 0
    for c in h.cycles:
        if not c.ok and not c.lora and c.digests_before is not None and c.digests_after is not None:
            checked += 1
            failures += _after_failure(c)
        if not c.ok or c.lora or c.trainer_digest is None or c.digests_after is None:
            continue
        checked += 1
        for engine, held in enumerate(c.digests_after):
            differ = sorted(n for n in c.trainer_digest if n in held and held[n] != c.trainer_digest[n])
            unknown = sorted(n for n in c.trainer_digest if n not in held)
            if differ:
                failures.append(Anomaly(
                    "weights-differ",
                    f"cycle {c.index} ({c.transport}): engine {engine} does not hold the trainer's "
                    f"values of {len(differ)} of {len(c.trainer_digest)} parameter(s), e.g. {differ[:3]} "
                    f"(holds {held[differ[0]][:12]}…, the trainer pushed "
                    f"{c.trainer_digest[differ[0]][:12]}…)",
                    engine=engine, cycle=c.index))
            if unknown:
                failures.append(Anomaly(
                    "unknown-parameters",
                    f"cycle {c.index} ({c.transport}): the trainer pushed {len(unknown)} parameter(s) the "
                    f"engine {engine} model does not have, e.g. {unknown[:3]} (SGLang skips unknown names "
                    f"with a warning and answers success)",
                    engine=engine, cycle=c.index))
    return verdict(failures,
                   vacuous=None if checked else "no engine digests (backend without weights truth, or no full update)",
                   metrics={"cycles_checked": checked})


def _after_failure(c: UpdateCycle) -> list[Anomaly]:
    """P6 after the failed cycle ``c``: the engines it left with no weights (it held some before)."""
    assert c.digests_before is not None and c.digests_after is not None
    return [Anomaly("no-weights",
                    f"cycle {c.index} ({c.transport}) failed and left engine {engine} with no weights: its load failed "
                    f"and nothing loaded the weights it held back before the engine went on (vLLM leaves its layers on "
                    f"the meta device after a failed reload; the next forward pass kills the engine)",
                    engine=engine, cycle=c.index)
            for engine, (before, held) in enumerate(zip(c.digests_before, c.digests_after)) if before and not held]


@dataclass
class Unpublished:
    """An engine a failed full-weight cycle left holding weights of no published version, from the cycle's first
    load on it (``since``) until the next load into it (``until``; infinity when none came)."""

    engine: int
    cycle: UpdateCycle
    held: dict[str, str]
    published: list[dict[str, str]]
    """The weights published before the cycle began (the initial weights first)."""
    since: float
    until: float
    served: list[WireCall]
    """The integration's ``/generate`` calls open on it meanwhile while it was not paused."""


def unpublished_weights(h: History) -> tuple[list[Unpublished], int]:
    """Every engine a failed full-weight cycle left on unpublished weights, and how many engines' weights were read
    after such a cycle (none: nothing to judge). P8's reading, and the timeline's."""
    found: list[Unpublished] = []
    judged = 0
    for c in h.cycles:
        if c.ok or c.lora or c.digests_after is None or h.initial_digest is None:
            continue
        published = [h.initial_digest] + [p.trainer_digest for p in h.cycles if p.ok and not p.lora
                                          and p.trainer_digest and p.t_end <= c.t_start]
        for engine, held in enumerate(c.digests_after):
            if not held:  # no weights at all: P6's
                continue
            judged += 1
            if any(_same(held, p) for p in published):
                continue
            loads = h.weight_loads(c, engine)
            since, until = loads[0].t_start if loads else c.t_start, _next_load(h, c, engine)
            found.append(Unpublished(engine, c, held, published, since, until, _served(h, engine, since, until)))
    return found, judged


@check("P8", "served weights were published",
       needs={"failed-cycle", "full-update"},
       holds="no engine serves weights that match no published version (the initial weights or a successful "
             "update's), parameter by parameter: after a failed load an engine stays out of service until it holds "
             "published weights again",
       reads="fake: the weights every token was decoded on (per decode step); real engines: each engine's weights "
             "after every failed full-weight cycle (SGLang: `/get_weights_by_name` of every parameter; vLLM: its "
             "weight checker) and the `/generate` calls open on it outside its pause windows until its next load")
def served_weights_published(h: History) -> Verdict:
    """P8: an engine that a failed full-weight cycle left holding weights that match no published version (SGLang
    loads parameter by parameter and restores nothing: "The full weights of the ModelRunner are partially updated.
    Please discard the whole weights.", ``model_runner_components/weight_updater.py``, 0.5.23; an engine that
    loaded a version the integration then did not publish) decodes nothing on them: every ``/generate`` call of the
    integration open on it while it is not paused, from the cycle's first load on it until the next load into it,
    is served on unpublished weights (published: by a cycle that returned before the failed one began; the same
    weights published by a later retry were not published while it served them). Staying paused until a later cycle
    loads whole weights passes, and so does putting published weights back before continuing. On the fake every token
    is judged by the weights its engine held when it was decoded (``History.held_weights``)."""
    if h.initial_digest is None:
        return verdict([], vacuous="no weights digests (backend without weights truth)")
    if h.held_weights is not None:
        return _per_token(h, h.initial_digest, h.held_weights)
    found, judged = unpublished_weights(h)
    return verdict([_served_anomaly(u) for u in found if u.served],
                   vacuous=None if judged else "no failed full-weight cycle left digests to read",
                   metrics={"engines_judged": judged, "left_unpublished": len(found)})


def _per_token(h: History, initial: dict[str, str], held: list[HeldWeights]) -> Verdict:
    """P8 from the fake's per-decode-step truth: every token the integration's requests decoded came from weights
    published by then (the initial weights, or a successful cycle's that had begun when they were loaded: restoring
    published weights is publishing them again)."""
    ours = set(h.outputs_by_rid())
    failures, judged, tokens_bad = [], 0, 0
    for w in held:
        decoded = {rid: n for rid, n in w.tokens.items() if rid in ours}
        if not w.digests or not decoded:
            continue
        judged += 1
        published = [initial] + [c.trainer_digest for c in h.cycles if c.ok and not c.lora and c.trainer_digest
                                 and c.t_start <= w.t]
        if any(_same(w.digests, p) for p in published):
            continue
        tokens_bad += sum(decoded.values())
        failures.append(_decoded_anomaly(h, w, decoded, published[-1]))
    return verdict(failures, vacuous=None if judged else "no token of the integration's requests was decoded",
                   metrics={"weights_judged": judged, "tokens_on_unpublished": tokens_bad})


def _decoded_anomaly(h: History, w: HeldWeights, decoded: dict[str, int], last: dict[str, str]) -> Anomaly:
    """The per-token witness: the weights (which parameters are the last published version's, the loading cycle's,
    neither), what put them there, and the requests and tokens decoded on them."""
    cycle = h.cycle_at(w.t)
    attempted = (cycle.trainer_digest or {}) if cycle else {}
    old = sorted(n for n in w.digests if last.get(n) == w.digests[n])
    new = sorted(n for n in w.digests if n not in old and attempted.get(n) == w.digests[n])
    neither = sorted(set(w.digests) - set(old) - set(new))
    parts = [f"{len(new)} of {len(w.digests)} parameter(s) of the weights cycle {cycle.index} tried to load "
             f"(e.g. {new[:3]})" if new and cycle else "",
             f"{len(old)} of the last published version's" if old else "",
             f"{len(neither)} matching neither (e.g. {neither[:3]})" if neither else ""]
    rids = sorted(decoded)
    where = f"during cycle {cycle.index} ({'failed' if not cycle.ok else 'ok'})" if cycle else "outside any cycle"
    return Anomaly(
        "decoded-on-unpublished",
        f"engine {w.engine} decoded {sum(decoded.values())} token(s) of {len(decoded)} of the integration's requests "
        f"({', '.join(rids[:4])}{', …' if len(rids) > 4 else ''}) on weights of no published version, held from "
        f"t={w.t:.2f}s ({w.source}, {where}): {'; '.join(p for p in parts if p)}",
        engine=w.engine, cycle=cycle.index if cycle else None, rids=tuple(rids), times=(w.t,))


def _same(held: dict[str, str], weights: dict[str, str]) -> bool:
    """Whether ``held`` are ``weights``, parameter by parameter (over the parameters both name)."""
    common = [n for n in held if n in weights]
    return bool(common) and all(held[n] == weights[n] for n in common)


def _next_load(h: History, failed: UpdateCycle, engine: int) -> float:
    """When a later successful full-weight cycle began loading into ``engine`` (infinity when none did)."""
    for c in h.cycles:
        if c.t_start > failed.t_end and c.ok and not c.lora and (loads := h.weight_loads(c, engine)):
            return loads[0].t_start
    return float("inf")


def _served(h: History, engine: int, since: float, until: float) -> list[WireCall]:
    """The integration's ``/generate`` calls open on ``engine`` at some moment in (``since``, ``until``) when it was
    not paused."""
    paused = [(p.t_end if p.t_end is not None else p.t_start, end) for p, end in h.pause_windows(engine)]
    served = []
    for call in h.integration_calls("/generate", engine):
        start, end = max(call.t_start, since), min(call.t_end if call.t_end is not None else float("inf"), until)
        if start < end and not any(p0 <= start and end <= p1 for p0, p1 in paused):
            served.append(call)
    return served


def _served_anomaly(u: Unpublished) -> Anomaly:
    """The witness: what the engine held (parameters of the failed cycle's weights, of the earlier ones, of
    neither) and the requests it served on them."""
    c, engine, held, served = u.cycle, u.engine, u.held, u.served
    attempted = c.trainer_digest or {}
    before = (c.digests_before[engine] if c.digests_before else None) or u.published[-1]
    new = sorted(n for n in held if attempted.get(n) == held[n] and before.get(n) != held[n])
    old = sorted(n for n in held if before.get(n) == held[n])
    neither = sorted(set(held) - set(new) - set(old))
    rids = [request_id(call) for call in served]
    tokens = sum(int(o["meta_info"].get("completion_tokens") or 0) for call in served for o in call.generate_outputs())
    parts = [f"{len(new)} of {len(held)} parameter(s) of the cycle's unpublished weights (e.g. {new[:3]})" if new
             else "", f"{len(old)} of the weights it held before" if old else "",
             f"{len(neither)} matching neither (e.g. {neither[:3]})" if neither else ""]
    return Anomaly(
        "served-unpublished",
        f"cycle {c.index} ({c.transport}) failed and left engine {engine} holding weights of no published version: "
        f"{'; '.join(p for p in parts if p)}; the engine then served {len(served)} of the integration's requests "
        f"outside a pause ({', '.join(rids[:4])}{', …' if len(rids) > 4 else ''}; {tokens} token(s) answered) before "
        f"any update loaded whole weights into it: keep it paused until one does, or put published weights back "
        f"before continuing it",
        engine=engine, cycle=c.index, rids=tuple(rids), times=tuple(call.t_start for call in served[:1]))


def request_id(call: WireCall) -> str:
    """The request id a ``/generate`` call's answer or body names (its wire sequence number where neither does)."""
    ids = [str(o["meta_info"]["id"]) for o in call.generate_outputs() if o["meta_info"].get("id") is not None]
    rid = call.payload.get("rid") if isinstance(call.payload, dict) else None
    return ids[0] if ids else str(rid) if rid else f"#{call.seq}"


@check("P9", "a restarted engine serves once it is synced",
       needs={"restarted", "full-update"},
       holds="an engine that came back from a restart (its start-up weights, labelled `default`) gets none of the "
             "integration's requests outside a pause until whole weights were loaded into it (routable only once it "
             "holds the current weights: miles #1724, #1805)",
       reads="the restarts the suite injected, the integration's `/generate` calls open on the restarted engine "
             "outside its pause windows, and the first successful full-weight load into it after the restart")
def restarted_engine_synced_first(h: History) -> Verdict:
    """P9: a restarted engine serves its start-up weights under ``default`` however many versions were published, so
    it gets no request of the integration's until whole weights were loaded into it (by an update cycle, or on its
    own when it rejoins): every ``/generate`` call open on it outside its pause windows from the restart until the
    first successful full-weight load into it fails (a call held by the syncing cycle's pause runs on the new
    weights; an engine left out for good passes)."""
    failures: list[Anomaly] = []
    restarts = [i for i in h.injected if i.kind == "restart" and i.engine is not None]
    for restart in restarts:
        engine, since = restart.engine, restart.t_end if restart.t_end is not None else restart.t
        synced = next((c for c in h.integration_calls(engine=engine)
                       if c.path in WEIGHT_LOAD_PATHS and c.t_start >= since and c.ok), None)
        served = _served(h, engine, since, synced.t_start if synced else float("inf"))
        if served:
            published = sum(c.ok and not c.lora and c.t_end is not None and c.t_end <= restart.t for c in h.cycles)
            rids = [request_id(call) for call in served]
            labels = sorted({str(o["meta_info"].get("weight_version")) for call in served
                             for o in call.generate_outputs()})
            failures.append(Anomaly(
                "served-before-sync",
                f"engine {engine} restarted at t={restart.t:.2f}s (after {published} successful update(s)) and served "
                f"{len(served)} of the integration's requests on its start-up weights "
                f"({', '.join(rids[:4])}{', …' if len(rids) > 4 else ''}; labelled {labels or ['-']}) before "
                + (f"whole weights were loaded into it ({synced.path} at t={synced.t_start:.2f}s)" if synced else
                   "any whole weights were loaded into it") +
                ": keep a recovered engine out of the rotation until it is synced",
                engine=engine, rids=tuple(rids), times=tuple(call.t_start for call in served[:1])))
    return verdict(failures, vacuous=None if restarts else "no engine was restarted",
                   metrics={"restarts": len(restarts)})
