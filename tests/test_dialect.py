"""The wire's vocabulary per engine family (``conformance.dialect``): vLLM's calls recorded as the SGLang calls of the
same meaning, the suite's own calls sent in vLLM's words, and a history of the vLLM reference that shows both."""

from __future__ import annotations

import pytest

from conformance.backends import FakeBackend, FakeBackendConfig
from conformance.cases import run_one
from conformance.checks.effective import effective, pause_mode
from conformance.dialect import SERVED, SGLANG_DIALECT, VOCABULARY_PROFILE, VllmDialect
from conformance.history import WireCall
from conformance.reference import vllm
from fakes.scheduler import encode_text

pytestmark = pytest.mark.cpu


def _recorded(dialect: VllmDialect, path: str, payload: object = None, query: str = "") -> WireCall:
    path, payload = dialect.recorded("POST", path, query, payload)
    return WireCall(0, 0, "POST", path, payload, 0.0)


@pytest.mark.parametrize(("query", "mode", "clears"), [
    ("mode=keep&clear_cache=false", "in_place", False), ("mode=keep", "retract", True),
    ("mode=keep&clear_cache=true", "retract", True), ("mode=abort", "abort", True), ("", "abort", True),
    ("mode=abort&clear_cache=false", "abort", False), ("mode=wait", "retract", True)])
def test_a_vllm_pause_is_read_by_the_checkers_in_the_mode_vllm_pauses_in(query: str, mode: str, clears: bool) -> None:
    """``keep`` freezes the requests in flight on their KV only with ``clear_cache=false``: by default (every mode) the
    pause clears the caches, which preempts what runs (recomputed on resume: ``retract``) and resets the prefix
    cache, recorded as a pause that flushes (measured on vLLM 0.32.0, ``gpu/fidelity/vllm.py``)."""
    call = _recorded(VllmDialect(), "/pause", query=query)
    assert call.path == "/pause_generation" and pause_mode(call, VOCABULARY_PROFILE) == mode
    assert (call.payload.get("flush_cache") is True) == clears


def test_a_reload_is_a_disk_update_that_neither_aborts_nor_flushes_and_follows_the_served_path() -> None:
    dialect = VllmDialect()
    plain = _recorded(dialect, "/collective_rpc", {"method": "reload_weights"})
    assert plain.path == "/update_weights_from_disk" and plain.payload["model_path"] == SERVED
    assert effective(plain, "abort_all_requests", VOCABULARY_PROFILE) is False
    assert effective(plain, "flush_cache", VOCABULARY_PROFILE) is False
    _recorded(dialect, "/collective_rpc", {"method": "reload_weights", "kwargs": {"weights_path": "/ck/v3"}})
    assert _recorded(dialect, "/collective_rpc", {"method": "reload_weights"}).payload["model_path"] == "/ck/v3"
    assert _recorded(dialect, "/collective_rpc", {"method": "nope"}).path == "/collective_rpc"
    assert _recorded(VllmDialect(), "/update_weight_version", {"new_version": "3"}).payload == \
        {"new_version": "3", "abort_all_requests": False}


def test_a_generation_is_recorded_as_sglangs_generate_with_its_answer_in_meta_info() -> None:
    dialect = VllmDialect()
    ids = encode_text("Prompt 7")
    call = _recorded(dialect, "/inference/v1/generate", {"token_ids": ids, "request_id": "r1", "model": "a-v2",
                                                         "sampling_params": {"max_tokens": 8}})
    assert call.path == "/generate" and call.payload["text"] == "Prompt 7" and call.payload["rid"] == "r1"
    assert call.payload["lora_path"] == "a-v2" and call.payload["sampling_params"] == {"max_new_tokens": 8}
    spans = [{"version": "1", "start": 0, "end": 3}, {"version": "2", "start": 3, "end": 8}]
    answer = dialect.answered(call.path, call.payload, {"request_id": "r1", "usage": {"completion_tokens": 8},
                                                        "choices": [{"finish_reason": "length", "token_ids": [5] * 8,
                                                                     "weight_versions": spans}]})
    assert answer["meta_info"] == {"id": "r1", "finish_reason": {"type": "length"}, "completion_tokens": 8,
                                   "weight_version": "2", "weight_versions": spans}
    unnamed = _recorded(dialect, "/inference/v1/generate", {"token_ids": ids, "sampling_params": {}})
    assert dialect.answered(unnamed.path, unnamed.payload, {"request_id": "generate-tokens-9f", "choices": [
        {"finish_reason": "length", "token_ids": [5]}]})["meta_info"]["id"] == "9f"  # as an abort names it
    empty = dialect.answered(call.path, call.payload, {"request_id": "r1", "choices": [
        {"finish_reason": "abort", "token_ids": [], "weight_versions": []}]})
    assert empty["meta_info"]["weight_version"] is None and "weight_versions" not in empty["meta_info"]


def test_only_vllms_wait_pause_drains_the_requests_in_flight() -> None:
    """What releases the suite's long-lived request as the pause goes on (``Sentinels``): it would hold a pause that
    waits for it for the rest of its budget."""
    assert VllmDialect().drains("POST /pause?mode=wait")
    assert not any(VllmDialect().drains(sent) for sent in ("POST /pause?mode=keep", "POST /pause", None,
                                                           "POST /pause?mode=abort", "POST /resume?mode=wait"))
    assert not SGLANG_DIALECT.drains("POST /pause?mode=wait")


def test_the_suites_own_calls_go_out_in_vllms_words() -> None:
    dialect = VllmDialect()
    assert dialect.outgoing("/pause_generation", {"mode": "in_place"}) == ("/pause?mode=keep&clear_cache=false", None)
    assert dialect.outgoing("/continue_generation", {}) == ("/resume", None)
    # vLLM knows the suite's generate s1 as generate-tokens-s1: an abort naming s1 would abort nothing
    assert dialect.outgoing("/abort_request", {"rid": "s1"}) == ("/abort_requests",
                                                                 {"request_ids": ["generate-tokens-s1"]})
    assert _recorded(dialect, "/abort_requests", {"request_ids": ["generate-tokens-s1"]}).payload == {"rid": "s1"}
    assert _recorded(dialect, "/abort_requests", {"request_ids": ["cmpl-c1"]}).payload == {"rid": "c1"}
    assert dialect.outgoing("/abort_request", {"abort_all": True}) == ("/abort_requests", {})
    assert dialect.outgoing("/model_info") == ("/weight_info", None)
    path, body = dialect.outgoing("/generate", {"input_ids": [1, 2], "rid": "s1", "lora_path": "a-v1",
                                                "sampling_params": {"max_new_tokens": 9, "ignore_eos": True}})
    assert path == "/inference/v1/generate" and body == {
        "token_ids": [1, 2], "request_id": "s1", "model": "a-v1", "sampling_params": {"max_tokens": 9,
                                                                                       "ignore_eos": True}}
    recorded = _recorded(dialect, path, body)  # what the recorder makes of it: the call the suite meant
    assert recorded.payload["rid"] == "s1" and recorded.payload["input_ids"] == [1, 2]
    assert SGLANG_DIALECT.outgoing("/pause_generation", {"mode": "in_place"}) == \
        ("/pause_generation", {"mode": "in_place"})


def test_the_vllm_reference_passes_and_its_history_keeps_the_calls_as_sent() -> None:
    result = run_one("steady-disk-in_place", vllm, lambda: FakeBackend(FakeBackendConfig(engine="vllm")), 0)
    assert result.history is not None and result.history.backend == "fake-vllm"
    assert {c: v.status for c, v in result.verdicts.items() if v.status != "pass"} == {}
    sent = {(c.path, c.sent_as) for c in result.history.wire if c.origin == "integration"}
    assert {("/pause_generation", "POST /pause?mode=keep&clear_cache=false"), ("/continue_generation", "POST /resume"),
            ("/update_weights_from_disk", "POST /collective_rpc"),
            ("/generate", "POST /inference/v1/generate")} <= sent
    sentinels = [c for c in result.history.wire if c.origin == "sentinel"]
    assert sentinels and all(c.sent_as == "POST /inference/v1/generate" for c in sentinels)


def test_a_pause_that_waits_meets_the_suites_long_lived_request_and_is_not_held_by_it() -> None:
    """The reference pauses in ``wait`` on vLLM: each sentinel was resident when its engine's pause went on and is
    released then (by the id vLLM knows it by), so the pause answers once the integration's own short turns are done,
    not after the sentinel's 3 s budget."""
    result = run_one("first-drain", vllm, lambda: FakeBackend(FakeBackendConfig(engine="vllm")), 0)
    h = result.history
    assert h is not None and {c: v.status for c, v in result.verdicts.items() if v.status != "pass"} == {}
    pauses = [c for c in h.integration_calls("/pause_generation")]
    assert pauses and all(c.sent_as == "POST /pause?mode=wait" for c in pauses)
    for pause in pauses:
        resident = [c for c in h.resident_at(pause.engine, pause.t_start) if c.origin == "sentinel"]
        assert resident, f"no sentinel resident at engine {pause.engine}'s pause"
        released = [i for i in h.injected if i.kind == "abort" and i.rid == resident[0].payload["rid"]]
        assert released and pause.t_start <= released[0].t <= pause.t_end
        meta = resident[0].generate_outputs()[0]["meta_info"]
        budget = resident[0].payload["sampling_params"]["max_new_tokens"]
        # ended by the release before its budget ran out: what the pause waited for (no clock: CI machines stall)
        assert meta["finish_reason"]["type"] == "abort" and meta["completion_tokens"] < budget, (meta, budget)


@pytest.mark.parametrize("engine_rid, rid", [("cmpl-p3.s0.t1-0", "p3.s0.t1"), ("generate-tokens-p4.s1.t0", "p4.s1.t0"),
                                             ("unprefixed-0", "unprefixed-0")])
def test_the_vllm_dialect_knows_a_request_by_its_bodys_request_id_whatever_id_the_engine_gave_it(engine_rid, rid):
    """vLLM's scheduler knows a completion as ``cmpl-<request_id>-<prompt index>`` and a token-in request as
    ``generate-tokens-<request_id>``; the history knows both by the body's ``request_id`` (P8's per-token truth)."""
    assert VllmDialect().rid(engine_rid) == rid and SGLANG_DIALECT.rid(engine_rid) == engine_rid


def test_vllm_sleep_is_a_pause_that_releases_memory_and_only_the_last_wake_continues() -> None:
    """``EngineCore.sleep`` pauses in its mode (abort by default) before the memory sleeps; ``wake_up`` resumes
    scheduling only once nothing sleeps (0.32.0, measured by the differential): a partial wake is a memory resume."""
    d = VllmDialect()
    assert d.recorded("POST", "/sleep", "level=1&mode=keep", None) == (  # level 1 clears the caches: keep preempts
        "/pause_generation", {"mode": "retract", "flush_cache": True, "release_memory": ["kv_cache", "weights"]})
    assert d.recorded("POST", "/wake_up", "tags=weights", None) == ("/resume_memory_occupation", {"tags": ["weights"]})
    assert d.recorded("POST", "/wake_up", "tags=weights", None) == ("/wake_up", None)  # asleep no more: nothing woken
    assert d.recorded("POST", "/wake_up", "tags=kv_cache&tags=scheduling", None) == (
        "/continue_generation", {"resume_memory": ["kv_cache"]})
    assert d.recorded("POST", "/sleep", "level=0", None) == ("/pause_generation", {"mode": "abort"})
    assert d.recorded("POST", "/wake_up", "", None) == ("/continue_generation", {"resume_memory": []})
