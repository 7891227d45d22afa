"""The pure scheduler core: decoding, finishing, aborts, pause modes, retraction, versions, bodies."""

from __future__ import annotations

import pytest

from fakes.clock import ManualClock
from fakes.profiles import PROFILES, get_profile
from fakes.scheduler import Request, Scheduler, decode_ids, encode_text

pytestmark = pytest.mark.cpu

ABORTED = {"type": "abort", "message": "Aborted", "status_code": None, "err_type": None}


def make(profile: str = "0.5.23", capacity: int = 4, seed: int = 0) -> Scheduler:
    return Scheduler(profile, max_running_requests=capacity, clock=ManualClock(), seed=seed)


def submit(s: Scheduler, rid: str, max_new_tokens: int = 8, **kw) -> Request:
    return s.submit(Request(rid=rid, input_ids=encode_text(f"prompt {rid}"), max_new_tokens=max_new_tokens, **kw))


def run(s: Scheduler, steps: int) -> list[Request]:
    finished: list[Request] = []
    for _ in range(steps):
        s.clock.tick()  # type: ignore[attr-defined]
        finished += s.step().finished
    return finished


# -- decoding ----------------------------------------------------------------------------------------


def test_tokens_are_printable_deterministic_and_decode_to_text() -> None:
    a, b = make(seed=7), make(seed=7)
    ra, rb = submit(a, "x", 12), submit(b, "x", 12)
    run(a, 12), run(b, 12)
    assert ra.output_ids == rb.output_ids
    assert all(32 <= t <= 126 for t in ra.output_ids)
    assert ra.text == decode_ids(ra.output_ids) and len(ra.text) == 12
    other = make(seed=8)
    rc = submit(other, "x", 12)
    run(other, 12)
    assert rc.output_ids != ra.output_ids


def test_admission_respects_capacity_in_arrival_order() -> None:
    s = make(capacity=2)
    reqs = [submit(s, f"r{i}") for i in range(5)]
    result = s.step()
    assert [r.rid for r in result.admitted] == ["r0", "r1"]
    assert [r.rid for r in s.running] == ["r0", "r1"] and len(s.waiting) == 3
    assert all(len(r.output_ids) == 1 for r in reqs[:2])  # prefill emits the first token


def test_finish_by_length_stop_token_and_stop_string() -> None:
    s = make()
    by_len = submit(s, "len", 3)
    run(s, 3)
    assert by_len.finish_reason == {"type": "length", "length": 3} and len(by_len.output_ids) == 3

    probe = make()
    first = submit(probe, "stop", 8)
    run(probe, 1)
    token = first.output_ids[0]
    s2 = make()
    by_token = submit(s2, "stop", 8, stop_token_ids=(token,))
    run(s2, 1)
    assert by_token.finish_reason == {"type": "stop", "matched": token}

    s3 = make()
    by_str = submit(s3, "stop", 8, stop=(chr(token),))
    run(s3, 1)
    assert by_str.finish_reason == {"type": "stop", "matched": chr(token)}
    assert by_str.text == ""  # the matched stop string is trimmed from text, not from output_ids
    assert by_str.output_ids == [token]


def test_zero_max_new_tokens_finishes_at_prefill_without_output() -> None:
    s = make()
    req = submit(s, "z", 0)
    assert [r.rid for r in s.step().finished] == ["z"]
    assert req.output_ids == [] and req.finish_reason == {"type": "length", "length": 0}


# -- aborts ------------------------------------------------------------------------------------------


def test_abort_running_takes_one_more_step_and_keeps_partial_output() -> None:
    s = make()
    req = submit(s, "a", 10)
    run(s, 3)
    assert s.abort("a") == []
    assert not req.finished and req.abort_pending
    assert run(s, 1) == [req]
    assert req.finish_reason == ABORTED and len(req.output_ids) == 4


def test_abort_matches_by_prefix() -> None:
    s = make(capacity=1)
    one, ten, two = submit(s, "1"), submit(s, "10"), submit(s, "2")
    run(s, 1)  # "1" running, "10" and "2" waiting
    done = s.abort("1")
    assert done == [ten]
    assert one.abort_pending and not two.finished


@pytest.mark.parametrize("profile", ["0.5.4", "0.5.10", "0.5.23"])
def test_waiting_queue_abort_is_immediate_with_the_profile_message(profile: str) -> None:
    s = make(profile, capacity=1)
    submit(s, "run")
    waiting = submit(s, "wait")
    run(s, 1)
    assert s.abort("wait") == [waiting]
    expected = "Abort before prefill" if profile == "0.5.4" else "Abort in waiting queue"
    assert waiting.finish_reason == {"type": "abort", "message": expected}


def test_abort_all_with_empty_rid_hits_everything_in_the_scheduler() -> None:
    s = make(capacity=1)
    a, b = submit(s, "a"), submit(s, "b")
    run(s, 1)
    assert s.abort("", abort_all=True) == [b]
    assert a.abort_pending


# -- pause modes and retraction -------------------------------------------------------------------------


def test_in_place_pause_freezes_decoding_and_defers_running_aborts_until_resume() -> None:
    s = make()
    req = submit(s, "p", 10)
    run(s, 2)
    s.pause("in_place")
    assert run(s, 5) == [] and len(req.output_ids) == 2
    s.abort(abort_all=True)
    assert run(s, 3) == [] and not req.finished
    s.resume()
    assert run(s, 1) == [req]
    assert req.finish_reason == ABORTED and len(req.output_ids) == 3


def test_retract_keeps_tokens_counts_retractions_and_readmits_first() -> None:
    s = make(capacity=2)
    reference = make(capacity=2)
    old = submit(s, "old", 6)
    ref_old = submit(reference, "old", 6)
    run(s, 2), run(reference, 2)
    newer = submit(s, "new", 6)
    assert s.pause("retract") == [old]
    assert s.running == [] and [r.rid for r in s.waiting] == ["old", "new"]
    assert old.retractions == 1 and len(old.output_ids) == 2
    s.resume()
    result = s.step()
    assert [r.rid for r in result.admitted] == ["old", "new"]
    run(s, 5), run(reference, 5)
    assert old.finished and old.output_ids == ref_old.output_ids  # seamless continuation
    assert newer.finished


def test_pause_rejects_the_tokenizer_only_abort_mode() -> None:
    with pytest.raises(ValueError, match="in_place"):
        make().pause("abort")


@pytest.mark.parametrize(
    ("profile", "idle_after_retract"), [("0.5.4", False), ("0.5.10", False), ("0.5.23", True)]
)
def test_flush_idle_predicate_per_profile(profile: str, idle_after_retract: bool) -> None:
    s = make(profile)
    assert s.is_idle_for_flush()
    submit(s, "x")
    assert not s.is_idle_for_flush()
    run(s, 1)
    s.pause("in_place")
    assert not s.is_idle_for_flush()  # in_place with resident requests never flushes
    s.pause("retract")
    assert s.is_idle_for_flush() is idle_after_retract


# -- versions -----------------------------------------------------------------------------------------


def test_spans_follow_the_version_of_each_token() -> None:
    s = make()
    req = submit(s, "v", 6)
    run(s, 2)
    s.set_version("1", "test")
    run(s, 2)
    s.set_version("2", "test")
    s.set_version("3", "test")  # no token under "2": no span for it
    run(s, 2)
    assert req.spans(s.version) == [
        {"version": "default", "start": 0, "end": 2},
        {"version": "1", "start": 2, "end": 4},
        {"version": "3", "start": 4, "end": 6},
    ]
    assert [e.fields["new"] for e in s.events.of_kind("version.change")] == ["1", "2", "3"]


def test_version_change_after_the_last_token_keeps_the_old_last_span() -> None:
    s = make()
    req = submit(s, "v", 3)
    run(s, 2)
    s.abort("v")
    s.set_version("new", "test")
    run(s, 1)  # the abort step emits one token under "new"
    assert req.spans(s.version)[-1]["version"] == "new"
    empty = make()
    none = submit(empty, "e")
    assert none.spans("cur") == [{"version": "cur", "start": 0, "end": 0}]


# -- response bodies -----------------------------------------------------------------------------------


@pytest.mark.parametrize("profile", sorted(PROFILES))
def test_finished_body_keys_in_sglang_order(profile: str) -> None:
    s = make(profile)
    req = submit(s, "k", 3, return_logprob=True)
    run(s, 3)
    body = s.render(req)
    assert list(body) == ["text", "output_ids", "meta_info"]
    keys = ["id", "finish_reason", "prompt_tokens", "weight_version"]
    keys += [get_profile(profile).retraction_key] if get_profile(profile).retraction_key else []
    keys += ["completion_tokens", "cached_tokens"]
    keys += ["reasoning_tokens"] if profile != "0.5.4" else []
    keys += ["output_token_logprobs", "input_token_logprobs", "output_token_logprobs_length"]
    keys += ["weight_versions"] if profile == "0.5.23" else []
    keys += ["cached_tokens_details", "dp_rank"] if profile != "0.5.4" else []  # measured, gpu.fidelity
    keys += ["e2e_latency"]
    assert list(body["meta_info"]) == keys
    triples = body["meta_info"]["output_token_logprobs"]
    assert [t[1] for t in triples] == req.output_ids and all(t[0] < 0 and t[2] is None for t in triples)
    assert body["meta_info"]["e2e_latency"] == pytest.approx(0.03)


@pytest.mark.parametrize(
    ("profile", "expected"),
    [
        (
            "0.5.4",
            {
                "text": "",
                "meta_info": {
                    "id": "w",
                    "finish_reason": {"type": "abort", "message": "Abort before prefill"},
                    "prompt_tokens": 0,
                    "completion_tokens": 0,
                },
            },
        ),
        ("0.5.10", {"meta_keys": ["id", "finish_reason", "weight_version", "e2e_latency", "completion_tokens"]}),
        (
            "0.5.23",
            {
                "meta_keys": [
                    "id", "finish_reason", "weight_version", "e2e_latency", "weight_versions", "completion_tokens"
                ]
            },
        ),
    ],
)
def test_waiting_queue_abort_body_per_profile(profile: str, expected: dict) -> None:
    s = make(profile)
    req = submit(s, "w")
    if profile != "0.5.4":
        run(s, 2)
        s.pause("retract")  # retracted requests sit in the waiting queue with their tokens
    s.abort("w")
    body = s.render(req)
    if "meta_keys" not in expected:
        assert body == expected
        return
    assert list(body["meta_info"]) == expected["meta_keys"]
    assert "prompt_tokens" not in body["meta_info"]
    assert body["output_ids"] == req.output_ids and len(req.output_ids) == 2
    assert body["meta_info"]["completion_tokens"] == 2 and body["text"] == req.text


def test_streaming_chunks_are_cumulative_or_delta_per_profile() -> None:
    for profile, cumulative in (("0.5.4", False), ("0.5.10", True), ("0.5.23", True)):
        s = make(profile)
        req = submit(s, "s", 4, stream=True)
        run(s, 3)
        chunk = s.render(req, since=2)
        assert chunk["meta_info"]["finish_reason"] is None
        assert chunk["output_ids"] == (req.output_ids if cumulative else req.output_ids[2:])
        assert chunk["text"] == req.text  # text is always cumulative
