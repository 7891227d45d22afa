"""Protocol: I6 (pause paired with resume, sessions closed), P5 (engine failures fatal), I3 (the pause mode
sent), C2 (flush contract), P1 (order inside a cycle)."""

from __future__ import annotations

from fakes.facts import SGLANG

from ..anomaly import Anomaly
from ..history import TRANSFER_PATHS, WEIGHT_LOAD_PATHS, History, WireCall
from .effective import effective, pause_mode, sent_as
from .registry import check
from .verdict import Verdict, verdict


def _by_engine(h: History, paths: set[str]) -> dict[int, list[WireCall]]:
    out: dict[int, list[WireCall]] = {}
    for call in h.wire:
        if call.path in paths:
            out.setdefault(call.engine, []).append(call)
    return out


@check("I6", "pause paired with resume",
       needs={"cycle"},
       holds="every pause is paired with a continue (also when the update failed), except on an engine a failed "
             "full-weight load may have left with part of its weights (P8 judges what it serves); sessions closed",
       reads="`/pause_generation` … `/continue_generation` and `/begin_weight_update` … `/end_weight_update` per "
             "engine and cycle; the weight loads each engine was sent in a failed cycle",
       needs_pause=True)
def pause_paired_with_resume(h: History) -> Verdict:
    """I6: every pause is followed by a continue on the same engine before its cycle ends (also when the cycle
    failed), and every weight-update session opened in a cycle is closed in it. Pausing an engine that is
    already paused means an earlier cycle left it paused. An engine a failed cycle sent full weights to may hold
    part of them (SGLang restores nothing), so it may stay paused until a later cycle loads whole weights into it
    (the field's rule: miles' weight-update lifecycle test, vllm#57854); a pause left where no load was sent (a
    partial pause, a failed flush) still fails."""
    failures: list[Anomaly] = []
    pairs = (("/pause_generation", "/continue_generation", "paused"),
             ("/begin_weight_update", "/end_weight_update", "mid-session"))
    windows = [(c.t_start, c.t_end, c) for c in h.cycles] + [(float("-inf"), float("inf"), None)]
    kept = _kept_paused(h)
    for opened_path, closed_path, state in pairs:
        for engine, calls in _by_engine(h, {opened_path, closed_path}).items():
            for t0, t1, cycle in windows:
                inside = [w for w in calls if w.ok and t0 <= w.t_start <= t1]
                open_call: WireCall | None = None
                for call in inside:
                    if call.path == opened_path and open_call is not None and cycle is None \
                            and open_call.seq not in kept:
                        failures.append(Anomaly(
                            "paused-twice",
                            f"engine {engine}: {opened_path} at t={call.t_start:.3f}s while still {state} "
                            f"since t={open_call.t_start:.3f}s",
                            engine=engine, times=(open_call.t_start, call.t_start)))
                    if call.path == opened_path:
                        open_call = open_call or call
                    else:
                        open_call = None
                if open_call is not None and open_call.seq not in kept:
                    where = (f"in cycle {cycle.index} ({'failed: ' + str(cycle.error) if not cycle.ok else 'ok'})"
                             if cycle else "and by the end of the run")
                    failures.append(Anomaly(
                        "left-paused",
                        f"engine {engine}: {opened_path} at t={open_call.t_start:.3f}s {where} was not "
                        f"followed by {closed_path}: the engine was left {state}",
                        engine=engine, cycle=cycle.index if cycle else None, times=(open_call.t_start,)))
    pauses = sum(1 for c in h.wire if c.path == "/pause_generation")
    return verdict(failures, vacuous=None if pauses else "no engine was ever paused",
                   metrics={"pauses": pauses, "kept_paused_after_failed_load": len(kept)})


def _kept_paused(h: History) -> set[int]:
    """The pauses (wire ``seq``) an engine may be left under because the last weight load it was sent, by the end of
    a cycle, was in a failed cycle (no later cycle loaded whole weights into it; a LoRA cycle does not): the
    cycle's own pauses of it, and the one it was already under."""
    kept: set[int] = set()
    tainted: dict[int, bool] = {}
    for c in h.cycles:
        for engine in {w.engine for w in h.cycle_calls(c)} | set(tainted):
            if h.weight_loads(c, engine):
                tainted[engine] = not c.ok
            if tainted.get(engine):
                kept |= {w.seq for w in h.cycle_calls(c, engine) if w.path == "/pause_generation"}
                if (pause := h.paused_at(engine, c.t_end)) is not None:
                    kept.add(pause.seq)
    return kept


@check("P5", "engine failures are fatal",
       needs={"failed-cycle"},
       holds="an engine-reported failure (`success: false`, non-200) is fatal; a refusal retried until it succeeds "
             "passes (reported)",
       reads="every non-2xx or `success: false` answer in a cycle, and the calls to the same path after it")
def failures_are_fatal(h: History) -> Verdict:
    """P5: an engine-reported failure (non-200, ``success: false``) during a cycle makes the update raise, unless
    the same call was retried on that engine and then succeeded (a flush back-off, a retried transfer): that
    recovery passes, and is reported."""
    failures: list[Anomaly] = []
    seen = retried = 0
    for c in h.cycles:
        refusals = [w for w in h.cycle_calls(c) if w.path != "/generate" and w.t_end is not None and not w.ok]
        seen += len(refusals)
        unrecovered = h.refused(c)
        retried += len({(w.engine, w.path) for w in refusals} - set(unrecovered))
        for (engine, path), refused in unrecovered.items():
            if c.ok:
                first = refused[0]
                tries = f" (and {len(refused) - 1} retr{'y' if len(refused) == 2 else 'ies'}, refused too)" \
                    if len(refused) > 1 else ""
                failures.append(Anomaly(
                    "failure-ignored",
                    f"engine {engine} answered {first.status} {first.response!r} to {path} in cycle "
                    f"{c.index}{tries}, yet the updater returned version {c.returned} and published it",
                    engine=engine, cycle=c.index, versions=(c.returned,), times=(first.t_start,)))
    return verdict(failures,
                   vacuous=None if seen else "no engine reported a failure during any cycle",
                   metrics={"failures": seen, "recovered_by_retry": retried})


_NO_PAUSE_BODY = SGLANG.sorted(r for r in SGLANG.releases if not SGLANG.fact("pause_modes", r))[-1]
"""The newest release the fake knows whose ``/pause_generation`` takes no body (fact ``pause_modes``)."""
_FLUSH_REFUSED = SGLANG.facts["post_update_flush_failure"].since("error")
"""The first release that refuses a flush with requests resident instead of crashing the scheduler."""


@check("I3", "pause mode sent",
       needs={"cycle"},
       holds="every pause takes effect in the mode the integration runs in, never `abort`; an integration that "
             "declares pause modes pauses every engine before it loads full weights there",
       reads="the `mode` SGLang reads from each `/pause_generation` body (`{}` → abort; "
             f"≤{_NO_PAUSE_BODY} takes no body: always abort); a pause the engine refused (non-2xx) paused nothing",
       needs_pause=True)
def pause_mode_sent(h: History) -> Verdict:
    """I3: every pause takes effect in the mode the integration runs in, and never in ``abort``: a fully-async
    integration that pauses in abort mode kills every request in flight. Read from the wire as SGLang reads it:
    a body without ``mode`` (``{}``) pauses in abort mode, and so does every pause on ≤0.5.4 (no body taken). A
    pause the engine refused (vLLM answers ``mode=retract`` with 400) paused nothing; an engine that loads full
    weights in a cycle without an accepted pause before it was never paused in the declared mode (LoRA loads may
    go without a pause)."""
    failures: list[Anomaly] = []
    pauses = list(h.integration_calls("/pause_generation"))
    refused = [c for c in pauses if c.t_end is not None and not c.ok]
    for call in pauses:
        mode = pause_mode(call, h.profile)
        if mode is None or call in refused:
            continue  # the engine rejected it: nothing was paused (P5 judges the refusal; below, the load it left)
        sent = sent_as(call, "mode", h.profile)
        if mode == "abort":
            failures.append(Anomaly(
                "abort-mode-pause",
                f"engine {call.engine}: POST /pause_generation at t={call.t_start:.3f}s pauses in abort "
                f"mode ({sent}): every request in the engine is aborted",
                engine=call.engine, times=(call.t_start,)))
        elif h.pause_mode is not None and mode != h.pause_mode:
            failures.append(Anomaly(
                "wrong-pause-mode",
                f"engine {call.engine}: POST /pause_generation at t={call.t_start:.3f}s ({sent}) pauses "
                f"in {mode} mode, but the integration was asked to run in {h.pause_mode}",
                engine=call.engine, times=(call.t_start,)))
    failures += _loaded_unpaused(h)
    return verdict(failures, vacuous=None if pauses else "the integration never paused",
                   metrics={"pauses": len(pauses), "refused_pauses": len(refused)})


def _loaded_unpaused(h: History) -> list[Anomaly]:
    """Per full-weight cycle and engine: a load sent there with no pause the engine accepted before it, in a run
    asked to pause in a mode (the scenario's ``pause_mode``)."""
    found = []
    if h.pause_mode is None:
        return found
    for c in h.cycles:
        if c.lora:
            continue
        for engine in sorted({w.engine for w in h.cycle_calls(c)}):
            calls = h.cycle_calls(c, engine)
            at = next((i for i, w in enumerate(calls) if w.path in TRANSFER_PATHS), None)
            pauses = [w for w in calls[:at] if w.path == "/pause_generation"]  # sent before it, in wire order
            if at is None or any(w.ok for w in pauses):
                continue
            load, refused = calls[at], pauses
            why = (f"its pause was refused ({refused[0].status} {refused[0].response!r}, sent as "
                   f"{refused[0].sent_as or 'POST /pause_generation'})" if refused else "no pause was sent")
            found.append(Anomaly(
                "loaded-unpaused",
                f"cycle {c.index}, engine {engine}: {load.path} at t={load.t_start:.3f}s while the engine was not "
                f"paused ({why}); the integration declares pause modes and was asked to run in {h.pause_mode}",
                engine=engine, cycle=c.index, times=(load.t_start,)))
    return found


@check("C2", "flush contract",
       needs={"in-place"},
       holds="never flush while paused in place, explicitly or by a transfer's `flush_cache` (SGLang's default: "
             "true)",
       reads="`/flush_cache` and the effective `flush_cache` of transfers, inside pauses whose effective mode is "
             "`in_place`",
       needs_pause=True, needs_residency=True)
def flush_contract(h: History) -> Verdict:
    """C2: never flush while an engine is paused in place, explicitly (``/flush_cache``) or by a transfer whose
    effective ``flush_cache`` is true (SGLang's default on every transfer endpoint): its resident requests make
    SGLang refuse (0.5.23) or crash the scheduler (≤0.5.16). The pause mode is the one SGLang read off the wire."""
    failures: list[Anomaly] = []
    in_place = 0
    engines = sorted({w.engine for w in h.integration_calls()})
    for engine in engines:
        windows = [(pause, end) for pause, end in h.pause_windows(engine)
                   if pause_mode(pause, h.profile) == "in_place"]
        in_place += len(windows)
        for pause, end in windows:
            for call in h.integration_calls(engine=engine):
                if not pause.t_start <= call.t_start < end:
                    continue
                if call.path == "/flush_cache":
                    failures.append(Anomaly(
                        "flush-while-paused",
                        f"engine {engine}: /flush_cache at t={call.t_start:.3f}s while paused in_place "
                        f"(answered {call.status}): SGLang refuses it with requests resident ({_FLUSH_REFUSED}) or "
                        f"crashes the scheduler (<{_FLUSH_REFUSED})",
                        engine=engine, times=(call.t_start,)))
                elif call.path in TRANSFER_PATHS and effective(call, "flush_cache", h.profile) is True:
                    failures.append(Anomaly(
                        "flush-while-paused",
                        f"engine {engine}: {call.path} at t={call.t_start:.3f}s flushes the cache "
                        f"({sent_as(call, 'flush_cache', h.profile)}) while paused in_place "
                        f"(answered {call.status})",
                        engine=engine, times=(call.t_start,)))
    return verdict(failures, vacuous=None if in_place else "no engine was paused in place",
                   metrics={"in_place_pauses": in_place})


@check("P1", "cycle order",
       needs={"full-update"},
       holds="cycle order: pause → begin → transfer → version → end → continue; a flush anywhere inside the pause; "
             "no weights loaded into memory that was released and not resumed",
       reads="the control calls per engine inside each successful cycle; every memory release and resume "
             "(SGLang's `/release_memory_occupation`, vLLM's `/sleep` and `/wake_up`) before a weight load")
def cycle_order(h: History) -> Verdict:
    """P1: pause → (begin) → transfer → version → (end) → continue, per engine, inside each cycle. A flush is
    accepted anywhere between the pause and the continue (SGLang itself flushes after loading by default). And no
    full-weight load reaches an engine whose weights' memory is released (:func:`_loads_into_released`)."""
    rank = {"/pause_generation": 0, "/begin_weight_update": 2, **{p: 3 for p in TRANSFER_PATHS},
            "/update_weight_version": 4, "/end_weight_update": 5, "/continue_generation": 6}
    failures: list[Anomaly] = []
    for c in h.cycles:
        if not c.ok:
            continue
        for engine in sorted({w.engine for w in h.cycle_calls(c)}):
            calls = [w for w in h.cycle_calls(c, engine) if w.path in rank or w.path == "/flush_cache"]
            steps = [w.path for w in calls if w.path != "/flush_cache"]
            for a, b in zip(steps, steps[1:]):
                if rank[b] < rank[a] and not (a in TRANSFER_PATHS and b in TRANSFER_PATHS):
                    failures.append(Anomaly(
                        "cycle-order",
                        f"cycle {c.index}, engine {engine}: {b} came after {a} (calls: {steps})",
                        engine=engine, cycle=c.index))
                    break
            pause = next((w.t_start for w in calls if w.path == "/pause_generation"), None)
            resume = next((w.t_start for w in calls if w.path == "/continue_generation"), None)
            for flush in (w for w in calls if w.path == "/flush_cache" and w.ok):
                if pause is not None and (flush.t_start < pause or resume is not None and flush.t_start > resume):
                    failures.append(Anomaly(
                        "flush-outside-pause",
                        f"cycle {c.index}, engine {engine}: /flush_cache at t={flush.t_start:.3f}s "
                        f"outside the pause (paused at t={pause:.3f}s"
                        f"{f', continued at t={resume:.3f}s' if resume is not None else ''})",
                        engine=engine, cycle=c.index, times=(flush.t_start,)))
    failures += _loads_into_released(h)
    return verdict(failures, vacuous=None if h.cycles else "no update cycle ran")


def _releases_weights(call: WireCall) -> bool | None:
    """Whether an accepted ``call`` releases the weights' memory (True), resumes it (False), or neither (None): SGLang's
    ``/release_memory_occupation`` / ``/resume_memory_occupation`` of the weights (no tags: every tag), vLLM's
    ``/sleep`` (a pause that releases memory) and ``/wake_up`` as the dialect records them."""
    body = call.payload if isinstance(call.payload, dict) else {}
    if not call.ok:
        return None
    if call.path in ("/release_memory_occupation", "/resume_memory_occupation"):
        return call.path == "/release_memory_occupation" if "weights" in (body.get("tags") or ("weights",)) else None
    if call.path == "/pause_generation" and "weights" in (body.get("release_memory") or ()):
        return True
    if call.path == "/continue_generation" and "weights" in (body.get("resume_memory") or ()):
        return False
    return None


def _loads_into_released(h: History) -> list[Anomaly]:
    """Full-weight loads sent to an engine whose weights' memory was released and not resumed: on GPUs the load meets
    memory the engine gave back (SGLang's memory saver: the copy hits unmapped memory; vLLM: an update while asleep
    crashes the engine core, vllm#57853; a level-2 sleep dropped the weights, TRL#5312). Wake the weights
    (``/resume_memory_occupation`` of them, ``/wake_up?tags=weights``) before loading. On CPU vLLM's worker ignores the
    sleep (measured, ``gpu/fidelity/vllm.py``) and SGLang frees nothing without its memory saver, so the wire shows it
    where the weights cannot."""
    failures: list[Anomaly] = []
    released: dict[int, WireCall] = {}
    for call in h.integration_calls():
        change = _releases_weights(call)
        if change is True:
            released[call.engine] = call
        elif change is False:
            released.pop(call.engine, None)
        elif call.path in WEIGHT_LOAD_PATHS and call.engine in released:
            by, cycle = released[call.engine], h.cycle_at(call.t_start)
            failures.append(Anomaly(
                "load-into-released-memory",
                f"engine {call.engine}: {call.sent_as or call.path} at t={call.t_start:.3f}s loads weights whose "
                f"memory {by.sent_as or by.path} released at t={by.t_start:.3f}s, and nothing resumed it: on GPUs the "
                f"load meets memory the engine gave back (vLLM's engine core crashes, vllm#57853; SGLang's memory "
                f"saver unmapped it); wake the weights first", engine=call.engine,
                cycle=cycle.index if cycle else None, times=(by.t_start, call.t_start)))
    return failures
