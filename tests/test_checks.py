"""Checkers on hand-written histories: each passes a correct history, fails a broken one with the witness a
person needs, and answers unknown (never pass) when the history cannot show the property."""

from __future__ import annotations

import pytest

from conformance.checks import CHECKS
from conformance.history import BatchRecord, FsEvent, HeldWeights, History, Injected, UpdateCycle, WireCall
from conformance.interface import Batch, Group, Sample, Turn

pytestmark = pytest.mark.cpu


def call(seq: int, path: str, payload=None, *, t0: float, t1: float | None, status=200, response=None, engine=0):
    return WireCall(seq, engine, "POST", path, payload, t0, t1, status, response if response is not None else {})


def gen(rid: str, t0: float, t1: float, *, finish="length", version="1", spans=None, engine=0, seq=100,
        origin="integration"):
    meta = {"id": rid, "finish_reason": {"type": finish}, "weight_version": version, "completion_tokens": 4}
    if spans:
        meta["weight_versions"] = [{"version": v, "start": 0, "end": 1} for v in spans]
    c = call(seq, "/generate", {"text": "x", "rid": rid}, t0=t0, t1=t1, response={"text": "", "meta_info": meta},
             engine=engine)
    c.origin = origin
    return c


def pause(seq, t, mode="retract", engine=0):
    return call(seq, "/pause_generation", {"mode": mode}, t0=t, t1=t + 0.01, engine=engine)


def cycle(index=0, *, t0=1.0, t1=2.0, ok=True, returned=1, published=(None, 1), labels=("default", "1"),
          mode="retract", lora=False, cell=0, error=None, digest=None, digests=None):
    return UpdateCycle(index, cell, "tensor", lora, mode, t0, t1, ok, error, returned - 1 if ok else returned,
                       returned if ok else returned, returned if ok else None, published[0], published[1],
                       [labels[0]], [labels[1]], trainer_digest=digest, digests_after=digests)


def bump(seq, version, t, abort_flag=False):
    payload = {"new_version": version} if abort_flag is None else {"new_version": version,
                                                                   "abort_all_requests": abort_flag}
    return call(seq, "/update_weight_version", payload, t0=t, t1=t + 0.01, response={"success": True})


def group(prompt, rids, oldest, staleness=None, finish="length", versions=None):
    turns = [Turn(r, (versions or {}).get(r, "1"), finish, 4) for r in rids]
    return Group(prompt, [Sample(prompt, turns)], oldest, staleness)


def history(**kw) -> History:
    return History("hand-written", "test", "none", "0.5.23", 0, **kw)


def check(inv: str, h: History):
    return CHECKS[inv](h)


# -- I1/I2 -----------------------------------------------------------------------------------------------

def test_a_request_the_integration_drops_around_an_update_is_lost_work():
    """The connection closed before an answer (no status) during a cycle: counted and failed like an abort; one
    dropped at teardown is the integration's shutdown."""
    dropped = call(100, "/generate", {"text": "x", "rid": "r1"}, t0=0.5, t1=1.5, status=None)
    dropped.response = None
    kept = gen("r2", 0.5, 2.5, seq=101)
    h = history(wire=[pause(1, 1.0), dropped, kept], cycles=[cycle()], t_teardown=3.0)
    v = check("I1-I2", h)
    assert v.checker_status == "fail" and any(a.kind == "dropped-request" and a.rids == ("r1",)
                                              for a in v.anomalies), v.explain()
    assert v.metrics["aborted_requests"] == 1 and v.metrics["aborted_sample_rate"] == 0.5
    h.t_teardown = 1.2
    assert not any(a.kind == "dropped-request" for a in check("I1-I2", h).anomalies)


def test_no_aborts_passes_when_requests_span_an_update_and_finish():
    h = history(wire=[gen("r1", 0.5, 2.5), bump(1, "1", 1.5)], cycles=[cycle()])
    v = check("I1-I2", h)
    assert v.status == "pass", v.explain()
    assert v.metrics["aborted_sample_rate"] == 0.0


def test_no_aborts_fails_with_the_aborted_request_and_the_bump():
    h = history(wire=[gen("r17", 0.5, 1.6, finish="abort"), bump(1, "4", 1.5, abort_flag=None)], cycles=[cycle()])
    v = check("I1-I2", h)
    assert v.status == "fail"
    text = "\n".join(v.witness)
    assert "abort_all_requests" in text and "request r17 (engine 0)" in text and "version '4' was published" in text
    assert v.metrics["aborted_sample_rate"] == 1.0


def test_no_aborts_is_unknown_when_nothing_was_resident_at_the_pause():
    """A request in flight during the cycle, but not when the engine was paused, proves nothing."""
    h = history(wire=[gen("r1", 0.1, 1.2), pause(1, 1.3), bump(2, "1", 1.5), gen("r2", 1.55, 1.9, engine=1, seq=101),
                      pause(3, 1.4, engine=1), gen("r3", 1.35, 2.5, engine=1, seq=102)], cycles=[cycle()])
    v = check("I1-I2", h)
    assert v.status == "unknown", v.explain()
    assert v.witness == ["engine 0: no request was resident when it was paused in cycle 0 (t=1.300s; the last "
                         "request there (integration) ended at t=1.200s): the run proves nothing there"]
    assert v.metrics["overlap_at_pause"] == 0.5 and v.metrics["integration_overlap_at_pause"] == 0.5
    h.injected.append(Injected(1.3, "hold-expired", 0, "update cycle 0: held; none was, it went on at the bound"))
    assert check("I1-I2", h).witness[0].endswith("(t=1.300s; the last request there (integration) ended at "
                                                 "t=1.200s; update cycle 0: held; none was, it went on at the "
                                                 "bound): the run proves nothing there")


def test_the_resident_situation_is_read_at_each_engines_first_disturbing_call_not_at_the_cycles_start():
    """A turn open when the cycle began but ended before the pause shows nothing (real vLLM in CI: 0.15 s turns on a
    starved machine); one sent after the start and open at the pause does, on its own engine only."""
    from conformance.situations.registry import missing
    ended = history(wire=[gen("r1", 0.9, 1.2), pause(1, 1.3), gen("r2", 1.1, 1.9, engine=1, seq=101)],
                    cycles=[cycle()])
    assert missing({"resident"}, ended) == ["the history holds no update cycle whose first pause, bump or transfer "
                                            "reached an engine while one of the integration's requests was "
                                            "decoding there"]
    later = history(wire=[gen("r1", 1.1, 1.5), pause(1, 1.3)], cycles=[cycle()])
    assert missing({"resident"}, later) == []
    sentinel_only = history(wire=[gen("s", 0.9, 1.8, origin="sentinel"), pause(1, 1.3)], cycles=[cycle()])
    assert missing({"resident"}, sentinel_only) != []


def test_the_suites_long_lived_request_proves_residency_and_is_not_counted_as_a_sample():
    h = history(wire=[gen("sentinel-0", 0.9, 2.2, finish="abort", origin="sentinel"), pause(1, 1.3),
                      bump(2, "1", 1.5), gen("r1", 0.1, 1.2)],
                cycles=[cycle()], injected=[Injected(2.1, "abort", 0, rid="sentinel-0")])
    v = check("I1-I2", h)
    assert v.status == "pass", v.explain()
    assert v.metrics["requests"] == 1 and v.metrics["overlap_at_pause"] == 1.0
    assert v.metrics["integration_overlap_at_pause"] == 0.0


def test_a_long_lived_request_aborted_by_the_pause_is_a_witness():
    """A pause in abort mode (SGLang's default for ``{}``) kills the suite's resident request before the suite
    aborts it itself: that abort is the integration's."""
    h = history(wire=[gen("sentinel-0", 0.9, 1.31, finish="abort", origin="sentinel"), pause(1, 1.3, mode="abort"),
                      bump(2, "1", 1.5)],
                cycles=[cycle()], injected=[Injected(2.1, "abort", 0, rid="sentinel-0")])
    v = check("I1-I2", h)
    assert v.status == "fail"
    assert "the suite's long-lived request sentinel-0 (engine 0)" in v.witness[0]
    assert "it was paused at t=1.300s with {'mode': 'abort'}" in v.witness[0], v.explain()


def test_injected_aborts_are_not_blamed_on_the_integration():
    h = history(wire=[gen("r1", 0.5, 1.2, finish="abort"), gen("r2", 0.5, 2.5, seq=101), bump(1, "1", 1.5)],
                cycles=[cycle(t0=0.9)], injected=[Injected(1.0, "abort", 0)])
    assert check("I1-I2", h).status == "pass", check("I1-I2", h).explain()


def test_an_injected_abort_does_not_excuse_a_request_that_ended_before_it():
    h = history(wire=[gen("r1", 0.5, 1.2, finish="abort"), gen("r2", 0.5, 2.5, seq=101), bump(1, "1", 1.5)],
                cycles=[cycle(t0=0.9)], injected=[Injected(1.3, "abort", 0)])
    assert check("I1-I2", h).status == "fail"


def test_a_transfer_that_aborts_every_request_fails_i1():
    transfer = call(1, "/update_weights_from_disk", {"model_path": "/c/v1", "abort_all_requests": True}, t0=1.3,
                    t1=1.4)
    h = history(wire=[gen("r1", 0.5, 2.5), pause(0, 1.2), transfer, bump(2, "1", 1.5)], cycles=[cycle()])
    v = check("I1-I2", h)
    assert v.status == "fail" and "POST /update_weights_from_disk call(s) abort every request" in v.witness[0] and \
        "abort_all_requests: True sent" in v.witness[0], v.explain()


def test_the_string_false_is_read_as_false_like_sglang_does():
    """SGLang's handler validates the body leniently (pydantic): ``"false"`` relabels without aborting."""
    quoted = call(1, "/update_weight_version", {"new_version": "1", "abort_all_requests": "false"}, t0=1.5, t1=1.51)
    h = history(wire=[gen("r1", 0.5, 2.5), quoted], cycles=[cycle()])
    assert check("I1-I2", h).passed, check("I1-I2", h).explain()


def test_a_continued_abort_still_fails_i2_but_is_not_a_lost_sample():
    wire = [gen("a1", 0.5, 1.3, finish="abort"), pause(0, 1.25, mode="abort"), gen("a2", 2.1, 2.5, seq=101),
            gen("b", 0.6, 2.5, seq=102), bump(2, "1", 1.5)]
    turn = Turn("a2", "1", "length", 4, continues=["a1"])
    h = history(wire=wire, cycles=[cycle()], batches=[BatchRecord(0, 3, Batch([Group(0, [Sample(0, [turn])], 1, 0)],
                                                                              1), 1)])
    v = check("I1-I2", h)
    assert v.status == "fail"
    assert "it was continued by request a2 (partial rollout: no sample lost" in "\n".join(v.witness), v.explain()
    assert (v.metrics["aborted_requests"], v.metrics["continued_requests"], v.metrics["aborted_sample_rate"]) == \
        (1, 1, 0.0)
    assert v.metrics["aborted_request_rate"] == 1 / 3 and v.metrics["recompute_tokens"] == 4


# -- I4 --------------------------------------------------------------------------------------------------

def test_a_sample_trained_on_the_call_that_continued_an_abort_passes_i4():
    wire = [gen("a1", 0, 1, finish="abort"), gen("a2", 1, 2, seq=101)]
    turn = Turn("a2", "1", "length", 4, continues=["a1"])
    batch = BatchRecord(0, 3, Batch([Group(0, [Sample(0, [turn])], 1, None)], 1), 1)
    v = check("I4", history(wire=wire, batches=[batch]))
    assert v.passed and v.metrics["continued_requests"] == 1, v.explain()

def test_aborted_group_reaching_training_fails():
    h = history(wire=[gen("r1", 0, 1, finish="abort")],
                batches=[BatchRecord(0, 2.0, Batch([group(3, ["r1"], 1)], 1), 1)])
    v = check("I4", h)
    assert v.status == "fail" and "prompt 3" in v.witness[0] and "r1" in v.witness[0]


def test_an_abort_after_the_whole_token_budget_is_a_complete_turn_for_i4():
    """SGLang answers abort when it lands in the step that finished the request: every token was generated."""
    full, cut = gen("r1", 0, 1, finish="abort"), gen("r2", 0, 1, finish="abort", seq=101)
    full.payload["sampling_params"] = {"max_new_tokens": 4}  # completion_tokens 4: the whole budget
    cut.payload["sampling_params"] = {"max_new_tokens": 16}
    trained = BatchRecord(0, 2.0, Batch([group(3, ["r1"], 1, finish="abort")], 1), 1)
    v = check("I4", history(wire=[full, cut], batches=[trained]))
    assert v.passed and (v.metrics["complete_aborts"], v.metrics["complete_aborts_trained"]) == (1, 1), v.explain()
    v = check("I4", history(wire=[full, cut], batches=[BatchRecord(0, 2.0, Batch([group(4, ["r2"], 1)], 1), 1)]))
    assert v.status == "fail" and "r2" in v.witness[0], v.explain()


def test_recycled_group_passes_and_no_abort_is_unknown():
    wire = [gen("r1", 0, 1, finish="abort"), gen("r2", 1, 2, seq=101)]
    assert check("I4", history(wire=wire, batches=[BatchRecord(0, 3, Batch([group(3, ["r2"], 1)], 1), 1)])).passed
    assert check("I4", history(wire=wire[1:], batches=[])).status == "unknown"


# -- I6 / C2 / P1 / P5 -----------------------------------------------------------------------------------

def _failed_load_on(engine: int, paused: tuple[int, ...] = (0,), cycles: int = 1) -> History:
    """Engines ``paused`` paused, a tensor load refused on ``engine``, no continue (``cycles`` such cycles)."""
    wire = []
    for i in range(cycles):
        t = 1.0 + 2 * i
        wire += [call(10 * i + e, "/pause_generation", {"mode": "retract"}, t0=t + 0.1, t1=t + 0.2, engine=e)
                 for e in paused]
        wire.append(call(10 * i + 9, "/update_weights_from_tensor", {}, t0=t + 0.3, t1=t + 0.4, status=400,
                         response={"success": False, "message": "bad shape"}, engine=engine))
    return history(wire=wire, cycles=[cycle(i, t0=1.0 + 2 * i, t1=2.0 + 2 * i, ok=False, error="EngineError: bad "
                                            "shape", returned=0, published=(None, None)) for i in range(cycles)])


def test_pause_without_continue_fails_in_the_failed_cycle():
    """The engine left paused was sent no weights (the load failed on another): its weights are whole, the pause
    leaks (a partial pause left paused, NeMo-RL#3612)."""
    v = check("I6", _failed_load_on(1))
    assert v.status == "fail" and "left paused" in v.witness[0] and "failed" in v.witness[0]


def test_a_partial_pause_left_paused_fails():
    """Engine 1 refused its pause, so the cycle failed before any weights moved; engine 0, paused, was never
    continued: its weights are whole, so it is out of service for nothing (NeMo-RL#3612)."""
    h = history(wire=[call(0, "/pause_generation", {"mode": "retract"}, t0=1.1, t1=1.2),
                      call(1, "/pause_generation", {"mode": "retract"}, t0=1.1, t1=1.2, status=500, engine=1,
                           response={"error": "boom"})],
                cycles=[cycle(ok=False, error="EngineError: boom", returned=0, published=(None, None))])
    v = check("I6", h)
    assert v.status == "fail" and "engine 0" in v.witness[0] and "left paused" in v.witness[0], v.explain()


def test_an_engine_sent_a_failed_load_may_stay_paused():
    """It may hold part of the weights (SGLang restores nothing): staying paused is the careful answer (P8 judges
    what it serves); so is pausing it again in the next cycle."""
    v = check("I6", _failed_load_on(0, paused=(0, 1), cycles=2))
    assert v.status == "fail" and all("engine 1" in w for w in v.witness), v.witness  # engine 1 got no load
    v = check("I6", _failed_load_on(0, paused=(0,), cycles=2))
    assert v.passed and v.metrics["kept_paused_after_failed_load"] == 2, v.witness


def test_pause_continue_paired_passes():
    h = history(wire=[call(0, "/pause_generation", {"mode": "retract"}, t0=1.1, t1=1.2),
                      call(1, "/continue_generation", {}, t0=1.5, t1=1.6)], cycles=[cycle()])
    assert check("I6", h).passed


def test_an_implicit_flush_in_a_transfer_under_in_place_fails():
    """A disk update that leaves ``flush_cache`` out flushes (SGLang's default): SGLang refuses it with requests
    resident (0.5.23) or crashes (<=0.5.16)."""
    h = history(wire=[pause(0, 1.1, "in_place"),
                      call(1, "/update_weights_from_disk", {"model_path": "/c/v1"}, t0=1.3, t1=1.4, status=400),
                      call(2, "/continue_generation", {}, t0=1.5, t1=1.6)], cycles=[cycle()])
    v = check("C2", h)
    assert v.status == "fail" and "no 'flush_cache' sent: SGLang's default" in v.witness[0], v.explain()


def test_c2_reads_the_mode_sent_not_the_mode_asked():
    """``{}`` pauses in abort mode: a flush then is fine for C2 (I3 judges the abort)."""
    h = history(wire=[call(0, "/pause_generation", {}, t0=1.1, t1=1.2),
                      call(1, "/flush_cache", None, t0=1.3, t1=1.31),
                      call(2, "/continue_generation", {}, t0=1.5, t1=1.6)], cycles=[cycle(mode="in_place")],
                pause_mode="in_place")
    assert check("C2", h).status == "unknown"


def test_flush_under_in_place_fails():
    h = history(wire=[call(0, "/pause_generation", {"mode": "in_place"}, t0=1.1, t1=1.2),
                      call(1, "/flush_cache", None, t0=1.3, t1=1.31, status=400, response="busy"),
                      call(2, "/continue_generation", {}, t0=1.5, t1=1.6)], cycles=[cycle(mode="in_place")])
    v = check("C2", h)
    assert v.status == "fail" and "while paused in_place" in v.witness[0]


def test_a_flush_anywhere_inside_the_pause_is_in_order():
    h = history(wire=[pause(0, 1.1), call(1, "/update_weights_from_tensor", {}, t0=1.2, t1=1.3),
                      call(2, "/flush_cache", None, t0=1.35, t1=1.36), bump(3, "1", 1.4),
                      call(4, "/continue_generation", {}, t0=1.6, t1=1.7)], cycles=[cycle()])
    assert check("P1", h).passed, check("P1", h).explain()


def test_a_flush_after_the_continue_is_out_of_order():
    h = history(wire=[pause(0, 1.1), call(1, "/update_weights_from_tensor", {}, t0=1.2, t1=1.3), bump(3, "1", 1.4),
                      call(4, "/continue_generation", {}, t0=1.6, t1=1.7),
                      call(5, "/flush_cache", None, t0=1.8, t1=1.9)],
                cycles=[cycle()])
    v = check("P1", h)
    assert v.status == "fail" and "/flush_cache at t=1.800s outside the pause" in v.witness[0], v.explain()


def test_cycle_order_fails_when_the_version_precedes_the_transfer():
    h = history(wire=[call(0, "/pause_generation", {"mode": "retract"}, t0=1.1, t1=1.2), bump(1, "1", 1.3),
                      call(2, "/update_weights_from_tensor", {}, t0=1.4, t1=1.5),
                      call(3, "/continue_generation", {}, t0=1.6, t1=1.7)], cycles=[cycle()])
    assert check("P1", h).status == "fail"
    assert check("V2", h).status == "fail"


def _refused(seq, t, path="/update_weights_from_disk"):
    return call(seq, path, {"model_path": "/c/v1"}, t0=t, t1=t + 0.1, status=400,
                response={"success": False, "message": "Failed to update weights: OOM"})


def test_swallowed_engine_failure_fails():
    v = check("P5", history(wire=[_refused(0, 1.1)], cycles=[cycle()]))
    assert v.status == "fail" and "engine 0 answered 400" in v.witness[0]


def test_a_refusal_retried_until_it_succeeds_passes_and_is_reported():
    retried = [call(0, "/flush_cache", None, t0=1.1, t1=1.2, status=400, response="busy"),
               call(1, "/flush_cache", None, t0=1.3, t1=1.4, status=200, response="ok"),
               _refused(2, 1.5), call(3, "/update_weights_from_disk", {"model_path": "/c/v1"}, t0=1.7, t1=1.8)]
    v = check("P5", history(wire=retried, cycles=[cycle()]))
    assert v.passed and v.metrics["recovered_by_retry"] == 2, v.explain()


def test_a_refusal_ignored_after_retries_that_were_refused_too_fails_once():
    v = check("P5", history(wire=[_refused(0, 1.1), _refused(1, 1.3), _refused(2, 1.5)], cycles=[cycle()]))
    assert v.status == "fail" and len(v.witness) == 1 and "(and 2 retries, refused too)" in v.witness[0], v.explain()


def test_no_refusal_proves_nothing_about_p5():
    assert check("P5", history(wire=[call(0, "/flush_cache", None, t0=1.1, t1=1.2)], cycles=[cycle()])).status == \
        "unknown"


# -- I3 (the pause mode sent) ------------------------------------------------------------------------------

def test_pausing_in_the_mode_asked_passes():
    assert check("I3", history(wire=[pause(0, 1.0, "in_place")], pause_mode="in_place")).passed


@pytest.mark.parametrize(("payload", "profile", "why"), [
    ({}, "0.5.23", "no 'mode' sent: SGLang's default"),
    ({"mode": "abort"}, "0.5.23", "mode: 'abort' sent"),
    ({"mode": "retract"}, "0.5.4", "SGLang 0.5.4's handler takes no 'mode'"),
])
def test_a_pause_that_takes_effect_in_abort_mode_fails(payload, profile, why):
    h = History("hand-written", "test", "none", profile, 0, pause_mode="retract",
                wire=[call(0, "/pause_generation", payload, t0=1.0, t1=1.1)])
    v = check("I3", h)
    assert v.status == "fail" and "pauses in abort mode" in v.witness[0] and why in v.witness[0], v.explain()


def test_a_pause_in_another_mode_than_asked_fails():
    v = check("I3", history(wire=[pause(0, 1.0, "retract")], pause_mode="in_place"))
    assert v.status == "fail" and "asked to run in in_place" in v.witness[0]


def test_an_integration_that_never_pauses_proves_nothing_about_i3():
    assert check("I3", history(wire=[bump(0, "1", 1.0)], pause_mode="retract")).status == "unknown"


def test_a_pause_the_engine_refused_paused_nothing_and_the_load_after_it_fails_i3():
    """vLLM answers ``/pause?mode=retract`` with 400 (recorded in the vocabulary as a valid SGLang mode): the engine
    was not paused, and the load sent next ran on an engine in service."""
    refused = call(1, "/pause_generation", {"mode": "retract"}, t0=1.1, t1=1.2, status=400,
                   response={"detail": "literal_error"})
    refused.sent_as = "POST /pause?mode=retract"
    load = call(2, "/update_weights_from_disk", {"model_path": "/c"}, t0=1.3, t1=1.5, response={"success": True})
    h = history(wire=[refused, load], cycles=[cycle()], pause_mode="retract")
    v = check("I3", h)
    assert v.status == "fail" and v.metrics["refused_pauses"] == 1, v.explain()
    assert ("cycle 0, engine 0: /update_weights_from_disk at t=1.300s while the engine was not paused (its pause "
            "was refused (400 {'detail': 'literal_error'}, sent as POST /pause?mode=retract))") in v.witness[0]
    h.wire[0] = pause(1, 1.1)
    assert check("I3", h).passed


def test_a_declared_pause_mode_never_sent_fails_i3_but_a_lora_load_needs_no_pause():
    load = call(2, "/update_weights_from_tensor", {}, t0=1.3, t1=1.5, response={"success": True})
    v = check("I3", history(wire=[load], cycles=[cycle()], pause_mode="in_place"))
    assert v.status == "fail" and "no pause was sent" in v.witness[0], v.explain()
    adapter = call(2, "/load_lora_adapter", {"lora_name": "a", "lora_path": "/a"}, t0=1.3, t1=1.5)
    assert check("I3", history(wire=[adapter], cycles=[cycle(lora=True)], pause_mode="in_place")).status == \
        "unknown"  # and the suite skips I3 there (scenarios.capabilities.skips_shown)


# -- V1 / V2 / V3 / V4 / P6 ------------------------------------------------------------------------------

def test_versions_agree_fails_on_an_unstamped_lora_update():
    h = history(wire=[bump(0, "1", 1.5)], cycles=[cycle(0, labels=("default", "1")),
                                                 cycle(1, t0=3, t1=4, lora=True, returned=2,
                                                                       published=(1, 2), labels=("1", "1"))])
    v = check("V1", h)
    assert v.witness == ["cycle 1 (LoRA, cell 0): the trainer counter is 2 but engine 0 reports weight_version '1' "
                         "after the update"], v.explain()


def _bucket(seq, t, ok=True, version="1"):
    return call(seq, "/update_weights_from_distributed",
                {"names": ["w"], "dtypes": ["float32"], "shapes": [[2]], "weight_version": version}, t0=t, t1=t + 0.1,
                status=200 if ok else 400, response={"success": ok, "message": "x"})


def test_a_stamp_in_an_early_bucket_relabels_before_the_whole_update_landed():
    h = history(wire=[_bucket(0, 1.1), _bucket(1, 1.3, ok=False)],
                cycles=[cycle(ok=False, error="EngineError: bucket 2", returned=0, published=(None, None),
                              labels=("default", "1"))])
    v = check("V2", h)
    assert v.status == "fail"
    text = "\n".join(v.witness)
    assert "engine 0 was relabelled to '1' by its transfer /update_weights_from_distributed (weight_version in the " \
           "body) at t=1.200s while its transfer /update_weights_from_distributed failed" in text, text
    assert "engine 0's label moved 'default' → '1'" in text


def test_a_stamp_in_the_only_transfer_is_atomic():
    assert check("V2", history(wire=[_bucket(0, 1.1)], cycles=[cycle()])).passed


def test_engines_never_stamped_fail_v1_plainly():
    h = history(wire=[call(0, "/update_weights_from_tensor", {}, t0=1.1, t1=1.2)],
                cycles=[cycle(labels=("default", "default"))], stamps_engines=False)
    v = check("V1", h)
    assert v.status == "fail" and v.witness[0].startswith("the engines were never stamped") and \
        "client-side versions" in v.witness[0], v.explain()


def test_a_cycle_the_wire_says_failed_must_not_publish_whatever_update_returned():
    refused = call(1, "/update_weights_from_disk", {"model_path": "/c"}, t0=1.2, t1=1.3, status=500,
                   response={"error": "Weight transfer not configured"})
    h = history(wire=[refused], cycles=[cycle()])
    v = check("V2", h)
    assert v.status == "fail" and "never accepted it after, yet the update returned and the manager's version " \
        "moved None → 1 (the wire says the cycle failed)" in v.witness[0], v.explain()
    h.wire.append(call(2, "/update_weights_from_disk", {"model_path": "/c"}, t0=1.4, t1=1.6,
                       response={"success": True}))  # retried until accepted: the cycle succeeded
    assert check("V2", h).passed


def test_failed_cycle_must_not_publish():
    h = history(cycles=[cycle(ok=False, error="x", returned=1, published=(None, 1), labels=("default", "1"))])
    v = check("V2", h)
    assert v.status == "fail" and any("manager's version moved" in w for w in v.witness)


def test_nothing_before_first_update():
    good = Batch([group(0, ["r1"], None)], None)
    bad = Batch([group(0, ["r1"], 0, staleness=0)], 0, {"staleness_mean": 0.0})
    assert check("V3", history(batches=[BatchRecord(0, 1.0, good, None)])).passed
    v = check("V3", history(batches=[BatchRecord(0, 1.0, bad, None)]))
    assert v.status == "fail" and "no version yet" in "\n".join(v.witness)
    assert check("V3", history()).status == "unknown"


def test_a_batch_consumed_after_the_first_publish_and_before_update_returned_may_carry_the_new_version():
    """The first cycle's last engine call was answered at t=1.5; it returned at 2.0 (the integration cleaned up).
    A batch consumed at 1.8 with version 1 passes V3; one consumed at 1.2 with version 1 (before anything was
    loaded) still fails, and so does one at 1.8 carrying a version the cycle never made."""
    wire = [call(1, "/update_weights_from_tensor", {}, t0=1.1, t1=1.5, response={"success": True})]
    published = Batch([group(0, ["r1"], 1, staleness=0)], 1, {"staleness_mean": 0.0})
    before = BatchRecord(0, 0.5, Batch([group(0, ["r0"], None)], None), None)
    v = check("V3", history(wire=wire, cycles=[cycle()], batches=[before, BatchRecord(1, 1.8, published, 1)]))
    assert v.passed and v.metrics["batches_before_first_update"] == 1, v.explain()
    v = check("V3", history(wire=wire, cycles=[cycle()], batches=[BatchRecord(0, 1.2, published, 1)]))
    assert v.status == "fail" and "consumed before any update" in v.witness[0], v.explain()
    other = Batch([group(0, ["r1"], 2, staleness=0)], 2, {"staleness_mean": 0.0})
    assert check("V3", history(wire=wire, cycles=[cycle()], batches=[BatchRecord(0, 1.8, other, 2)])).status == "fail"


def test_version_going_backwards_on_failover_fails():
    h = history(cycles=[cycle(0, t0=1, t1=2, returned=3, published=(2, 3)),
                        cycle(1, t0=3, t1=4, returned=1, published=(3, 1), cell=1)],
                batches=[BatchRecord(0, 5, Batch([group(0, ["r1"], 3, staleness=-2)], 1), 1)])
    v = check("V4-S1", h)
    text = "\n".join(v.witness)
    assert v.status == "fail" and "3 (after cycle 0 (cell 0)) → 1" in text and "negative staleness -2" in text


def test_weights_match_uses_digests_when_the_backend_has_them():
    pushed = {"w": "abc", "b": "123"}
    assert check("P6", history(cycles=[cycle(digest=pushed, digests=[dict(pushed)])])).passed
    v = check("P6", history(cycles=[cycle(digest=pushed, digests=[{"w": "abd", "b": "123"}])]))
    assert v.status == "fail" and "['w']" in v.witness[0] and "1 of 2" in v.witness[0], v.explain()
    assert check("P6", history(cycles=[cycle()])).status == "unknown"


def test_weights_match_names_a_parameter_the_engine_does_not_have():
    v = check("P6", history(cycles=[cycle(digest={"w": "abc", "model.w": "9"}, digests=[{"w": "abc"}])]))
    assert v.status == "fail" and "['model.w']" in v.witness[0] and "does not have" in v.witness[0], v.explain()


# -- S2 / S3 ---------------------------------------------------------------------------------------------

def test_oldest_uses_every_turn_and_span():
    wire = [gen("a", 0, 1, version="2", spans=["1", "2"]), gen("b", 1, 2, version="2", seq=101)]
    good = BatchRecord(0, 3, Batch([group(0, ["a", "b"], 1, staleness=1)], 2), 2)
    bad = BatchRecord(0, 3, Batch([group(0, ["a", "b"], 2, staleness=0)], 2), 2)
    assert check("S2", history(wire=wire, batches=[good])).passed
    v = check("S2", history(wire=wire, batches=[bad]))
    assert v.status == "fail" and "as old as 1" in v.witness[0] and "recorded oldest 2" in v.witness[0]


def test_default_labels_are_ignored_not_zero():
    wire = [gen("a", 0, 1, version="default"), gen("b", 1, 2, version="3", seq=101)]
    assert check("S2", history(wire=wire, batches=[BatchRecord(0, 3, Batch([group(0, ["a", "b"], 3)], 3), 3)])).passed
    assert check("S2", history(wire=wire,
                               batches=[BatchRecord(0, 3, Batch([group(0, ["a", "b"], 0)], 3), 3)])).status == "fail"


def _client_side_group(prompt, rid, oldest, staleness=None, policy=None):
    return Group(prompt, [Sample(prompt, [Turn(rid, "default", "length", 4, policy_version=policy)])], oldest,
                 staleness)


def test_client_side_versions_are_judged_against_the_version_published_at_dispatch():
    wire = [gen("a", 0.5, 0.9, version="default"), gen("b", 2.5, 2.9, version="default", seq=101)]
    cycles = [cycle(0, t0=1.0, t1=2.0, returned=1, labels=("default", "default"))]
    good = [BatchRecord(0, 3, Batch([_client_side_group(0, "a", None), _client_side_group(1, "b", 1, 0, 1)], 1), 1)]
    assert check("S2", history(wire=wire, cycles=cycles, batches=good, stamps_engines=False)).passed
    bad = [BatchRecord(0, 3, Batch([_client_side_group(1, "b", 0, 1, 0)], 1), 1)]
    v = check("S2", history(wire=wire, cycles=cycles, batches=bad, stamps_engines=False))
    assert v.status == "fail" and "was sent under versions as old as 1" in v.witness[0] and \
        "recorded oldest 0" in v.witness[0], v.explain()


def test_a_call_held_at_the_pause_gate_is_as_new_as_the_weights_that_admitted_it():
    """Client-side versions: a call sent after the engine's pause was answered waits at SGLang's pause gate and runs
    under the cycle's weights (version 1), though it was sent while version 0 was published."""
    cont = call(3, "/continue_generation", {}, t0=1.6, t1=1.61)
    wire = [pause(1, 1.1), gen("g", 1.3, 2.5, version="default"), cont]
    cycles = [cycle(0, t0=1.0, t1=2.0, returned=1, labels=("default", "default"))]
    h = history(wire=wire, cycles=cycles, stamps_engines=False, initial_version=0,
                batches=[BatchRecord(0, 3, Batch([_client_side_group(0, "g", 1, 0, 1)], 1), 1)])
    assert h.gate_cycle(wire[1]) is cycles[0] and h.client_truth(wire[1]) == 1
    assert check("S2", h).passed
    h.batches = [BatchRecord(0, 3, Batch([_client_side_group(0, "g", 0, 1, 0)], 1), 1)]
    v = check("S2", h)
    assert v.status == "fail" and "held at SGLang's pause gate" in v.witness[0] and "as old as 1" in v.witness[0] \
        and "recorded oldest 0" in v.witness[0], v.explain()
    h.cycles = [cycle(0, t0=1.0, t1=2.0, ok=False, returned=1, labels=("default", "default"))]  # nothing installed
    assert h.client_truth(wire[1]) == 0


def test_where_the_wire_cannot_tell_either_client_side_version_is_accepted():
    """A call sent while the pause was unanswered, or after the cycle's last call but before the suite saw the
    cycle return (the integration may have published already), may be recorded under either version."""
    wire = [call(1, "/pause_generation", {"mode": "retract"}, t0=1.1, t1=1.3), gen("p", 1.2, 2.5, version="default"),
            call(3, "/continue_generation", {}, t0=1.6, t1=1.61), gen("q", 1.8, 2.9, version="default", seq=101)]
    cycles = [cycle(0, t0=1.0, t1=2.0, returned=1, labels=("default", "default"))]
    for rid in ("p", "q"):
        for recorded in (0, 1):
            h = history(wire=wire, cycles=cycles, stamps_engines=False, initial_version=0,
                        batches=[BatchRecord(0, 3, Batch([_client_side_group(0, rid, recorded, 1 - recorded,
                                                                             recorded)], 1), 1)])
            assert check("S2", h).passed, (rid, recorded)
    h.batches = [BatchRecord(0, 3, Batch([_client_side_group(0, "q", 2, -1, 2)], 1), 1)]
    assert check("S2", h).status == "fail"


def test_before_the_first_update_a_call_sent_after_the_publish_may_carry_the_new_version():
    """The first update: the older candidate is "no version yet" (None), so a group recorded with the new version
    for a call sent after the cycle's last call (published, then cleaning up) passes; an older one still fails."""
    wire = [call(1, "/pause_generation", {"mode": "retract"}, t0=1.1, t1=1.2),
            call(2, "/continue_generation", {}, t0=1.5, t1=1.6), gen("q", 1.8, 2.9, version="default")]
    cycles = [cycle(0, t0=1.0, t1=2.0, returned=1, labels=("default", "default"))]
    for recorded in (None, 1):
        h = history(wire=wire, cycles=cycles, stamps_engines=False,
                    batches=[BatchRecord(0, 3, Batch([_client_side_group(0, "q", recorded, None, recorded)], 1), 1)])
        assert check("S2", h).passed, (recorded, check("S2", h).explain())
    h.batches = [BatchRecord(0, 3, Batch([_client_side_group(0, "q", 0, 1, 0)], 1), 1)]
    assert check("S2", h).status == "fail"


def test_a_call_sent_to_an_engine_already_updated_and_resumed_may_carry_the_new_version():
    """Client-side versions: engine 0 was updated and continued while engine 1 still loads; a call sent to engine 0
    then runs on the new weights and may be recorded under them. The same call on engine 1, not paused yet (the old
    weights), may not."""
    wire = [call(1, "/pause_generation", {"mode": "retract"}, t0=1.1, t1=1.2),
            call(2, "/pause_generation", {"mode": "retract"}, t0=1.5, t1=1.6, engine=1),
            call(3, "/continue_generation", {}, t0=1.3, t1=1.35),
            gen("r", 1.4, 2.5, version="default", seq=100),
            call(4, "/continue_generation", {}, t0=1.8, t1=1.9, engine=1)]
    cycles = [cycle(0, t0=1.0, t1=2.0, returned=1, labels=("default", "default"))]
    h = history(wire=wire, cycles=cycles, stamps_engines=False, initial_version=0,
                batches=[BatchRecord(0, 3, Batch([_client_side_group(0, "r", 1, 0, 1)], 1), 1)])
    assert check("S2", h).passed, check("S2", h).explain()
    wire[3].engine = 1
    assert check("S2", h).status == "fail"


def test_a_continued_call_counts_toward_the_oldest_version():
    """Partial rollout: the aborted call's tokens (version 1) are part of the turn that continued it."""
    wire = [gen("a1", 0, 1, version="1", finish="abort"), gen("a2", 1, 2, version="2", seq=101)]
    turn = Turn("a2", "2", "length", 4, continues=["a1"])
    rec = BatchRecord(0, 3, Batch([Group(0, [Sample(0, [turn])], 2, 0)], 2), 2)
    v = check("S2", history(wire=wire, batches=[rec]))
    assert v.status == "fail" and "as old as 1" in v.witness[0], v.explain()


def test_staleness_bound_at_consumption():
    wire = [gen("a", 0, 1, version="1")]
    stale = BatchRecord(0, 5, Batch([group(0, ["a"], 1, staleness=3)], 4), 4)
    v = check("S3", history(wire=wire, batches=[stale], max_staleness=1))
    assert v.status == "fail" and "staleness 3" in v.witness[0] and "bound 1" in v.witness[0]
    fresh = BatchRecord(0, 5, Batch([group(0, ["a"], 1, staleness=1)], 2), 2)
    assert check("S3", history(wire=wire, batches=[fresh], max_staleness=1)).passed
    assert check("S3", history(wire=wire, batches=[fresh])).status == "unknown"


def test_a_run_that_trains_nothing_at_the_bound_proves_nothing_about_s3():
    """A filter off by one the strict way (rejects at the bound) trains only fresher groups."""
    wire = [gen("a", 0, 1, version="2")]
    fresh = BatchRecord(0, 5, Batch([group(0, ["a"], 2, staleness=0)], 2), 2)
    v = check("S3", history(wire=wire, batches=[fresh], max_staleness=1))
    assert v.status == "unknown" and "no group was trained at exactly the bound (1; trained: [0])" in v.witness[0]


# -- F3 --------------------------------------------------------------------------------------------------

def test_a_checkpoint_is_judged_complete_at_load_time_whatever_its_publish_protocol():
    """Created in place with its shards renamed in and a marker written last, all before the load: complete and
    final, passes; still written into after the engines were told to load it (a save not awaited): fails. Renamed
    into place whole passes."""
    load = call(0, "/update_weights_from_disk", {"model_path": "/ck/v1"}, t0=2, t1=3, response={"success": True})
    marker_last = [FsEvent(1.0, "created", "v1"), FsEvent(1.2, "written", "v1", "model-00001.safetensors"),
                   FsEvent(1.5, "written", "v1", "COMPLETE")]
    assert check("F3", history(wire=[load], fs=marker_last)).passed
    v = check("F3", history(wire=[load], fs=[*marker_last, FsEvent(2.2, "written", "v1", "model-00002.safetensors")]))
    assert v.status == "fail" and v.anomalies[0].kind == "checkpoint-written-after-load", v.explain()
    assert ("checkpoint 'v1' was written into at t=2.200s (model-00002.safetensors; 1 write(s) in all) after "
            "engine(s) [0] had been told to load it (first at t=2.000s): created in place at t=1.000s and still being "
            "written") in v.witness[0]
    assert check("F3", history(wire=[load], fs=[FsEvent(1.0, "moved_in", "v1")])).passed
    early = [FsEvent(1.0, "moved_in", "v1"), FsEvent(2.5, "deleted", "v1")]
    assert check("F3", history(wire=[load], fs=early)).status == "fail"
    assert check("F3", history(wire=[load], fs=None)).status == "unknown"


def test_f3_judges_each_load_of_a_reused_path():
    """One path for every version: replaced by a rename each time passes; written over once engines were told to
    load it fails, naming the file and the engines."""
    def load(seq, t, engine=0):
        return call(seq, "/update_weights_from_disk", {"model_path": "/ck/latest"}, t0=t, t1=t + 0.5,
                    response={"success": True}, engine=engine)
    loads = [load(0, 2.0), load(1, 2.1, engine=1), load(2, 5.0), load(3, 5.1, engine=1)]
    replaced = [FsEvent(1.0, "moved_in", "latest"), FsEvent(4.0, "moved_out", "latest"),
                FsEvent(4.1, "moved_in", "latest")]
    assert check("F3", history(wire=loads, fs=replaced)).passed
    rewritten = [FsEvent(1.0, "moved_in", "latest"), FsEvent(4.0, "written", "latest", "model.safetensors")]
    v = check("F3", history(wire=loads, fs=rewritten))
    assert v.status == "fail" and "written into at t=4.000s (model.safetensors" in v.witness[0] \
        and "engine(s) [0, 1]" in v.witness[0], v.explain()
    assert v.anomalies[0].kind == "checkpoint-rewritten"


def test_a_load_sent_after_its_checkpoint_was_removed_fails():
    """Freed while another engine is still to load it: the first engine loaded it, the second was told to load it
    only after the removal (its load fails on a missing folder), so no load of that arrival was overlapped."""
    first = call(0, "/update_weights_from_disk", {"model_path": "/ck/v1"}, t0=2, t1=2.1, response={"success": True})
    late = call(1, "/update_weights_from_disk", {"model_path": "/ck/v1"}, t0=2.3, t1=2.4, engine=1, status=400,
                response={"success": False, "message": "Failed to get weights iterator"})
    fs = [FsEvent(1.0, "moved_in", "v1"), FsEvent(2.2, "deleted", "v1")]
    v = check("F3", history(wire=[first, late], fs=fs))
    assert v.status == "fail" and v.anomalies[0].kind == "checkpoint-removed" and v.anomalies[0].engine == 1
    assert "engine 1 was told to load checkpoint 'v1' at t=2.300s, after it was removed at t=2.200s" in v.witness[0]
    assert check("F3", history(wire=[first], fs=fs)).passed  # removed once its only reader had loaded it
    both = [first, call(1, "/update_weights_from_disk", {"model_path": "/ck/v1"}, t0=2.0, t1=2.25, engine=1)]
    emptied = [FsEvent(1.0, "moved_in", "v1"), FsEvent(2.2, "deleted_inside", "v1", "model.safetensors"),
               FsEvent(2.3, "deleted", "v1")]  # the folder goes last: the removal began with its files
    v = check("F3", history(wire=both, fs=emptied))
    assert v.status == "fail" and "removed at t=2.200s (its file 'model.safetensors' deleted first) before the " \
        "last engine finished loading it at t=2.250s" in v.witness[0], v.witness


def test_a_raising_checker_is_unknown_not_pass():
    from conformance.cases import evaluate

    broken = history(batches=[BatchRecord(0, 1.0, None, None)])  # type: ignore[arg-type]
    assert evaluate("V3", broken).status == "unknown"


# -- P7 --------------------------------------------------------------------------------------------------

def _lora_gen(rid, t0, t1, adapter, seq, engine=0):
    c = gen(rid, t0, t1, seq=seq, engine=engine)
    c.payload = {"text": "x", "rid": rid, "lora_path": adapter}
    return c


def unload(seq, name, t, t1, engine=0):
    return call(seq, "/unload_lora_adapter", {"lora_name": name}, t0=t, t1=t1, engine=engine)


def test_unloading_an_adapter_after_the_engine_continued_passes():
    h = history(wire=[pause(1, 1.0), call(2, "/continue_generation", {}, t0=1.2, t1=1.21),
                      _lora_gen("r1", 0.5, 1.6, "policy-v1", 100), unload(3, "policy-v1", 1.3, 1.61)])
    assert check("P7", h).passed, check("P7", h).explain()


def test_unloading_an_adapter_under_paused_requests_that_use_it_fails():
    h = history(wire=[pause(1, 1.0), _lora_gen("r1", 0.5, 5.0, "policy", 100),
                      call(3, "/unload_lora_adapter", {"lora_name": "policy"}, t0=1.1, t1=None, status=None),
                      _lora_gen("r2", 0.5, 5.0, "other", 101)])
    v = check("P7", h)
    assert v.status == "fail"
    assert ("engine 0: adapter 'policy' was unloaded at t=1.100s while the engine was paused (since t=1.000s) with 1 "
            "request(s) using it resident (e.g. ['r1'])") in v.witness[0], v.explain()
    assert "got no answer" in v.witness[0]


def test_a_design_that_never_unloads_passes_p7_once_adapters_were_loaded():
    """Upserting an adapter in place (or loading each version under a new name) never unloads one in use: with
    adapters loaded and none unloaded P7 passes; with no adapter loaded at all it cannot say."""
    used = _lora_gen("r1", 0.5, 1.6, "policy", 100)
    assert check("P7", history(wire=[pause(1, 1.0), used])).status == "unknown"
    load = call(2, "/load_lora_adapter", {"lora_name": "policy", "lora_path": "/a"}, t0=1.1, t1=1.2)
    v = check("P7", history(wire=[pause(1, 1.0), used, load]))
    assert v.passed and v.metrics == {"unloads": 0, "loads": 1}, v.explain()


def test_a_translated_pause_is_witnessed_as_the_integration_sent_it():
    """vLLM's ``/pause`` with no mode is recorded as ``/pause_generation {"mode": "abort"}``: the witness shows the
    call as sent, not a mode the integration never wrote."""
    translated = call(0, "/pause_generation", {"mode": "abort"}, t0=1.0, t1=1.1)
    translated.sent_as = "POST /pause"
    v = check("I3", history(wire=[translated], pause_mode="in_place"))
    assert v.status == "fail" and "(sent as POST /pause: mode 'abort' in the suite's vocabulary)" in v.witness[0], \
        v.explain()


def test_vllms_finish_weight_update_with_a_version_stamps_the_engines_and_sglangs_end_does_not():
    """vLLM publishes the ``weight_version`` its ``/finish_weight_update`` carries once it succeeded (recorded as
    ``/end_weight_update``); SGLang's ``/end_weight_update`` takes no version, so one sent there stamps nothing."""
    finish = call(0, "/end_weight_update", {"weight_version": "1"}, t0=1.5, t1=1.6, response={"success": True})
    finish.sent_as = "POST /finish_weight_update"
    assert check("V1", history(wire=[finish], cycles=[cycle()])).passed
    finish.sent_as = None
    v = check("V1", history(wire=[finish], cycles=[cycle()]))
    assert v.status == "fail" and v.anomalies[0].kind == "never-stamped", v.explain()


# -- P8 -------------------------------------------------------------------------------------------------------

INITIAL, NEW, PARTIAL = {"a": "a0", "b": "b0"}, {"a": "a1", "b": "b1"}, {"a": "a1", "b": "b0"}


def _after_failed_load(held: dict[str, str], *, continued: bool, retried: bool = False) -> History:
    """Cycle 0 pauses engine 0, loads ``NEW`` (refused: the engine holds ``held``) and continues it or not; a request
    is open from t=2.5 to t=3.5; with ``retried`` cycle 1 (t=4-5) loads ``NEW`` whole and continues."""
    wire = [call(0, "/pause_generation", {"mode": "retract"}, t0=1.1, t1=1.2),
            call(1, "/update_weights_from_disk", {}, t0=1.3, t1=1.4, status=400,
                 response={"success": False, "message": "Failed to update weights"}),
            gen("r1", 2.5, 3.5, seq=2)]
    if continued:
        wire.append(call(3, "/continue_generation", {}, t0=1.5, t1=1.6))
    cycles = [cycle(ok=False, error="EngineError", returned=0, published=(None, None), digest=NEW, digests=[held])]
    if retried:
        wire += [call(4, "/pause_generation", {"mode": "retract"}, t0=4.1, t1=4.2),
                 call(5, "/update_weights_from_disk", {}, t0=4.3, t1=4.4),
                 call(6, "/continue_generation", {}, t0=4.5, t1=4.6)]
        cycles.append(cycle(1, t0=4.0, t1=5.0, digest=NEW, digests=[NEW]))
    return history(wire=sorted(wire, key=lambda w: w.t_start), cycles=cycles, initial_digest=INITIAL)


def test_an_engine_continued_on_half_loaded_weights_fails_p8_naming_the_parameters_and_requests():
    v = check("P8", _after_failed_load(PARTIAL, continued=True))
    assert v.status == "fail" and v.anomalies[0].kind == "served-unpublished", v.explain()
    assert "1 of 2 parameter(s) of the cycle's unpublished weights (e.g. ['a'])" in v.witness[0]
    assert "1 of the weights it held before" in v.witness[0] and "r1" in v.witness[0], v.witness[0]


def test_an_engine_continued_on_the_unpublished_version_fails_p8_also_when_a_retry_publishes_it_later():
    """The weights were whole, but of a version nobody published while the engine served them."""
    v = check("P8", _after_failed_load(NEW, continued=True, retried=True))
    assert v.status == "fail" and "2 of 2 parameter(s)" in v.witness[0], v.explain()


@pytest.mark.parametrize("held, continued", [(PARTIAL, False), (INITIAL, True)],
                         ids=["kept-paused", "weights-put-back"])
def test_an_engine_out_of_service_or_given_published_weights_passes_p8(held, continued):
    v = check("P8", _after_failed_load(held, continued=continued, retried=True))
    assert v.passed, v.explain()


def test_p8_without_weights_truth_is_unknown():
    h = _after_failed_load(PARTIAL, continued=True)
    h.initial_digest = None
    assert check("P8", h).status == "unknown"


def _decoded(*held: tuple[float, dict[str, str], str, int]) -> History:
    """The per-decode-step truth of engine 0 after ``_after_failed_load(PARTIAL, continued=True, retried=True)``: per
    set of weights it held (from ``t``, put there by ``source``), the tokens request r1 decoded on them."""
    h = _after_failed_load(PARTIAL, continued=True, retried=True)
    h.held_weights = [HeldWeights(0, t, digests, source, {"r1": n} if n else {}) for t, digests, source, n in held]
    return h


def test_p8_on_the_fake_judges_every_token_by_the_weights_its_engine_held():
    """Half-loaded weights that decoded 7 tokens fail, with the tokens, the request and the parameters named."""
    v = check("P8", _decoded((0.0, INITIAL, "startup", 3), (1.35, PARTIAL, "update_weights_from_disk (partial)", 7),
                             (4.35, NEW, "update_weights_from_disk", 5)))
    assert v.status == "fail" and v.anomalies[0].kind == "decoded-on-unpublished", v.explain()
    assert "engine 0 decoded 7 token(s) of 1 of the integration's requests (r1)" in v.witness[0], v.witness[0]
    assert "1 of 2 parameter(s) of the weights cycle 0 tried to load (e.g. ['a'])" in v.witness[0], v.witness[0]
    assert "1 of the last published version's" in v.witness[0] and v.metrics["tokens_on_unpublished"] == 7


@pytest.mark.parametrize("held", [
    [(0.0, INITIAL, "startup", 3), (1.35, PARTIAL, "update_weights_from_disk (partial)", 0),
     (4.35, NEW, "update_weights_from_disk", 5)],
    [(0.0, INITIAL, "startup", 3), (1.35, PARTIAL, "update_weights_from_disk (partial)", 0),
     (1.45, INITIAL, "update_weights_from_disk", 4)],
], ids=["half-loaded-but-nothing-decoded", "published-weights-put-back"])
def test_p8_on_the_fake_passes_when_no_token_came_from_unpublished_weights(held):
    v = check("P8", _decoded(*held))
    assert v.passed and v.metrics["tokens_on_unpublished"] == 0, v.explain()


def test_p8_on_the_fake_counts_the_failed_cycles_weights_as_unpublished_though_a_retry_publishes_them_later():
    """Tokens decoded on the whole new weights a failed cycle loaded, before the retry began: no version was
    published with them yet."""
    v = check("P8", _decoded((0.0, INITIAL, "startup", 0), (1.35, NEW, "update_weights_from_disk", 6)))
    assert v.status == "fail" and "2 of 2 parameter(s) of the weights cycle 0" in v.witness[0], v.explain()


# -- P1: no weights loaded into released memory ------------------------------------------------------------------

def _loads_after(*memory: tuple[str, dict]) -> History:
    """Engine 0 pauses, makes the ``memory`` calls, loads weights from disk and continues, in cycle 0."""
    wire = [call(0, "/pause_generation", {"mode": "retract"}, t0=1.1, t1=1.15)]
    wire += [call(1 + i, path, body, t0=1.2 + i / 100, t1=1.205 + i / 100) for i, (path, body) in enumerate(memory)]
    wire += [call(9, "/update_weights_from_disk", {"model_path": "/c/1"}, t0=1.5, t1=1.6),
             call(10, "/continue_generation", {}, t0=1.7, t1=1.8)]
    return history(wire=wire, cycles=[cycle()])


@pytest.mark.parametrize("memory", [
    [("/release_memory_occupation", {})],
    [("/release_memory_occupation", {"tags": ["weights"]}), ("/resume_memory_occupation", {"tags": ["kv_cache"]})],
], ids=["every-tag-released", "only-the-kv-cache-resumed"])
def test_a_load_into_released_weights_fails_p1_naming_the_release(memory):
    """SGLang's memory saver (or vLLM's /sleep, recorded as a pause that releases memory) gave the weights' memory
    back: a load before they are resumed meets unmapped memory on GPUs (CPU builds ignore the release)."""
    v = check("P1", _loads_after(*memory))
    assert v.status == "fail" and v.anomalies[0].kind == "load-into-released-memory", v.explain()
    assert "/update_weights_from_disk at t=1.500s" in v.witness[0] and "released at t=1.200s" in v.witness[0]


@pytest.mark.parametrize("memory", [
    [("/release_memory_occupation", {}), ("/resume_memory_occupation", {"tags": ["weights"]})],
    [("/release_memory_occupation", {"tags": ["kv_cache"]})],
], ids=["weights-resumed-first", "only-the-kv-cache-released"])
def test_a_load_into_resident_weights_passes_p1(memory):
    assert check("P1", _loads_after(*memory)).passed
