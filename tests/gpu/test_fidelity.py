"""Differential fidelity (``gpu.fidelity``): the diff and its normalisation on CPU, the committed divergence lists
explained, and (``-m sglang``, where the release's environment exists) the fake against real SGLang: a divergence
not in the committed list, or a listed one that no longer happens, fails."""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import httpx
import pytest

from gpu.fidelity.__main__ import CLASSES, HERE, compare, divergences_file, key, known, main as fidelity_main
from gpu.fidelity.script import diff, during_decode, generation, message_class, normalise
from gpu.sglang_cpu import RELEASES, status


@pytest.mark.cpu
def test_messages_are_classed_with_what_varies_masked() -> None:
    assert message_class("Weight version updated to v12.") == "Weight version updated to <v>."
    assert message_class("Failed to get weights iterator: /tmp/x/absent not found, 3 files") == (
        "Failed to get weights iterator: <path> not found, <n> files")
    assert message_class("2 validation errors:\n  {'type': 'missing'}") == "<validation error>"
    assert message_class(None) is None


@pytest.mark.cpu
def test_an_answer_is_normalised_to_status_keys_and_the_weight_sync_fields() -> None:
    answer = httpx.Response(400, json={"success": False, "message": "Failed at v3", "num_paused_requests": 0})
    assert normalise(answer) == {"status": 400, "keys": ["message", "num_paused_requests", "success"],
                                 "body.success": False, "body.num_paused_requests": 0,
                                 "body.message": "Failed at <v>"}
    assert normalise(httpx.Response(200, text="Cache flushed.")) == {"status": 200, "text": "Cache flushed."}
    assert normalise(httpx.Response(200, content=b"null")) == {"status": 200, "body": "null"}


@pytest.mark.cpu
def test_a_generation_is_judged_by_versions_spans_and_how_it_ended() -> None:
    meta = {"finish_reason": {"type": "length", "length": 4}, "completion_tokens": 4, "weight_version": "v1",
            "weight_versions": [{"version": "v0", "start": 0, "end": 1}, {"version": "v1", "start": 1, "end": 4}],
            "num_retractions": 2}
    seen = generation(meta, 4)
    assert seen["span versions"] == ["v0", "v1"] and seen["spans cover the output"] is True
    assert seen["full budget"] is True and seen["num_retractions"] == 1
    meta["weight_versions"][1]["start"] = 2
    assert generation(meta, 4)["spans cover the output"] is False
    assert generation(None, 4) == {"finished": False}


@pytest.mark.cpu
def test_the_diff_lists_every_field_that_differs_with_both_answers() -> None:
    fake = {"a": {"status": 200, "x": 1}, "only fake": {"status": 200}}
    real = {"a": {"status": 400, "x": 1}, "only real": {"y": 2}}
    assert diff(fake, real) == [
        {"step": "a", "field": "status", "fake": 200, "real": 400},
        {"step": "only real", "field": "y", "fake": "<absent>", "real": 2},
        {"step": "only real", "field": "absent", "fake": True, "real": "<absent>"},
        {"step": "only fake", "field": "absent", "fake": "<absent>", "real": True},
        {"step": "only fake", "field": "status", "fake": 200, "real": "<absent>"},
    ]


@pytest.mark.cpu
def test_a_step_whose_situation_happened_on_neither_side_is_not_built_never_agreement() -> None:
    fake = {"pause": {"status": 200, "running_at_pause": False}, "ok": {"running_at_pause": True}}
    real = {"pause": {"status": 200, "running_at_pause": False}, "ok": {"running_at_pause": True}}
    found = diff(fake, real)
    assert found == [{"step": "pause", "field": "running_at_pause", "fake": False, "real": False, "not_built": True}]
    new, _ = compare(found, [{**found[0], "why": "listed all the same"}])
    assert new == found  # no list excuses it


@pytest.mark.cpu
def test_a_list_measured_with_another_script_says_it_is_stale_and_how_to_re_measure(tmp_path, monkeypatch) -> None:
    import gpu.fidelity.__main__ as fidelity

    monkeypatch.setattr(fidelity, "divergences_file", lambda release: tmp_path / f"divergences-{release}.json")
    (tmp_path / "divergences-9.9.json").write_text(json.dumps({"release": "9.9", "divergences": []}))
    assert "re-measure with python -m gpu.fidelity --release 9.9 --update" in fidelity.staleness("9.9")
    (tmp_path / "divergences-9.9.json").write_text(json.dumps({"release": "9.9", "script": fidelity.script_digest(),
                                                              "divergences": []}))
    assert fidelity.staleness("9.9") is None


@pytest.mark.cpu
def test_a_divergence_is_new_unless_listed_and_a_listed_one_gone_unless_it_is_a_race() -> None:
    def entry(step: str, real: object, kind: str = "") -> dict:
        return {"step": step, "field": "f", "fake": 1, "real": real, **({"class": kind, "why": "..."} if kind else {})}

    listed = [entry("kept", 2, "fake-only"), entry("fixed", 2, "fake-only"),
              entry("racy", 2, "race"), entry("racy absent", 2, "race")]
    new, gone = compare([entry("kept", 2), entry("racy", 2), entry("racy", 3), entry("unlisted", 2)], listed)
    assert [(d["step"], d["real"]) for d in new] == [("racy", 3), ("unlisted", 2)]  # a race excuses its answer only
    assert [e["step"] for e in gone] == ["fixed"]


@pytest.mark.cpu
@pytest.mark.parametrize("release", RELEASES)
def test_every_committed_divergence_is_explained(release: str) -> None:
    path = divergences_file(release)
    assert path.exists(), f"{path.name} is missing: python -m gpu.fidelity --release {release} --update"
    entries = known(release)
    assert len({key(e) for e in entries}) == len(entries), "a divergence is listed twice"
    for entry in entries:
        why = entry.get("why", "")
        assert len(why) > 20 and why != "TODO", f"{entry['step']} / {entry['field']}: no explanation"
        assert entry.get("class") in CLASSES, f"{entry['step']} / {entry['field']}: class {entry.get('class')!r}"


@pytest.mark.cpu
def test_without_the_environment_the_command_says_what_to_install(tmp_path: Path,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    assert fidelity_main(["--release", "0.5.23", "--venv", str(tmp_path / "none")]) == 2
    assert "python -m gpu.sglang_cpu install --release 0.5.23" in capsys.readouterr().err


@pytest.mark.sglang
@pytest.mark.timeout(900)
def test_the_fake_diverges_from_real_sglang_only_where_listed(pytestconfig: pytest.Config) -> None:
    from gpu.sglang_cpu import chosen

    release, venv = chosen(pytestconfig.getoption("conformance_sglang_release"),
                           pytestconfig.getoption("conformance_sglang_venv"))
    env = status(release, Path(venv) if venv else None, import_check=False)
    if not env.usable:
        pytest.skip(f"-m sglang needs a real-SGLang environment: {env.reason}")
    args = ["--release", release] + (["--venv", str(env.venv)] if venv else [])
    assert fidelity_main(args) == 0, f"new or gone divergences on {release}: see the output above ({HERE})"


@pytest.mark.cpu
def test_coverage_names_each_route_and_acted_on_field_no_request_sent() -> None:
    """The surface is the fake's route table as the release serves it, each with the body fields the fake acts on
    (its ignored fields left out); a route no request called, or a field none sent to it, is uncovered."""
    from gpu.fidelity.coverage import surface, uncovered
    from gpu.fidelity.script import Sent

    routes = surface("0.5.23")
    assert "http_worker_ipc" not in routes["/pause_generation"] and "mode" in routes["/pause_generation"]
    assert "/get_weight_version" not in routes and "/get_weight_version" in surface("0.5.10")
    sent = [Sent("POST", "/pause_generation", frozenset({"mode"})), Sent("GET", "/v1/models/tiny", frozenset()),
            Sent("POST", "/flush_cache", frozenset(), "decoding")]
    found = uncovered("0.5.23", sent)
    assert ("/pause_generation", None) not in found and ("/pause_generation", "mode") not in found
    assert ("/pause_generation", "rid") in found and ("/continue_generation", None) in found
    assert ("/v1/models/{model:path}", None) not in found and ("/v1/models", None) in found
    # the engine states: a route is compared from each only by the state matrix (its calls name their state)
    assert ("/flush_cache", None, "decoding") not in found and ("/flush_cache", None, "idle") in found
    assert ("/pause_generation", None, "in a session") in found
    assert not any(len(item) == 3 and item[2] == "in a session" for item in uncovered("0.5.10", sent))


@pytest.mark.cpu
def test_the_state_matrix_probes_every_control_route_and_every_plain_get_from_every_state() -> None:
    """The matrix's cases are generated: its control routes with their valid bodies, and a GET of every route of the
    fake's table that takes one and no body, each from every state the release has (sessions only where it does)."""
    from gpu.fidelity.matrix import probes, states

    routes = {p.route: p.method for p in probes("0.5.23")}
    assert routes["/update_weights_from_disk"] == "POST" and routes["/get_server_info"] == "GET"
    assert "/begin_weight_update" in routes and "/begin_weight_update" not in {p.route for p in probes("0.5.10")}
    assert "/get_weight_version" in {p.route for p in probes("0.5.10")}
    assert states("0.5.23")[-1] == "in a session" and "in a session" not in states("0.5.15")
    assert {"idle", "decoding", "paused abort", "paused retract", "paused in_place"} <= set(states("0.5.10"))


@pytest.mark.cpu
def test_the_state_matrix_leaves_a_state_without_aborting_its_held_request() -> None:
    """A case's held request runs to its end, so how it ended is the engine's doing: when the teardown aborted it,
    CI saw real 0.5.10 run its budget out first while slow GETs answered, and real 0.5.15 deliver an ``abort_all``'s
    end to the client only after the teardown's abort (the fake: at once)."""
    from gpu.fidelity.matrix import _Case

    sent: list[str] = []

    class Client:
        async def post(self, url: str, json: Any = None) -> None:
            sent.append(url.removeprefix("http://engine"))

    case = _Case(SimpleNamespace(client=Client(), url="http://engine"), [], "paused retract")  # type: ignore[arg-type]
    case.held = object()  # type: ignore[assignment]
    asyncio.run(case.undo())
    assert sent == ["/continue_generation"]


@pytest.mark.cpu
def test_the_state_matrix_probes_the_lora_routes_on_a_server_started_with_lora() -> None:
    """On a LoRA server each LoRA route is probed from every state too, each probe leaving no adapter loaded (the
    unload's adapter is loaded before its state is built)."""
    from gpu.fidelity.matrix import LORA_PROBES, probes

    lora = {p.route: p for p in probes("0.5.23", lora=True)}
    assert {"/load_lora_adapter", "/load_lora_adapter_from_tensors", "/unload_lora_adapter"} <= set(lora)
    assert "/load_lora_adapter" not in {p.route for p in probes("0.5.23")}
    assert all(p.after is not None for p in LORA_PROBES) and lora["/unload_lora_adapter"].before is not None


@pytest.mark.cpu
@pytest.mark.parametrize("release", RELEASES)
def test_every_generated_malformed_body_is_refused_by_the_fakes_validation(release: str) -> None:
    """The malformed bodies are generated from the request structs: the generic ones (not JSON, none, an array, no
    required field) and a wrong-typed value for every field that does not take anything; each is one the fake's
    validation refuses with a 400 before any handler runs (so, the structs agreeing with pydantic, real SGLang too)."""
    from fakes.structs import RequestError, endpoints, validate_raw
    from gpu.fidelity.malformed import malformed, wrong_value

    served = endpoints(release)
    cases = malformed(release)
    assert {c.what for c in cases if c.route == "/update_weight_version"} >= {
        "not JSON", "no body", "a JSON array", "no required field", "new_version of a wrong type",
        "abort_all_requests of a wrong type"}
    assert "no required field" not in {c.what for c in cases if c.route == "/pause_generation"}
    assert wrong_value("Any", release) is None and wrong_value("Optional[Dict[str, Any]]", release) == ["malformed"]
    for case in cases:
        with pytest.raises(RequestError) as refused:
            validate_raw(served[case.route]["struct"], case.body, release, method="POST", path=case.route)
        assert refused.value.status == 400, (case, refused.value)


@pytest.mark.cpu
def test_a_validation_error_is_compared_by_the_type_and_place_of_each_error() -> None:
    message = ("2 validation errors:\n  {'type': 'missing', 'loc': ('body', 'name'), 'msg': 'Field required'}\n"
               "  {'type': 'int_type', 'loc': ('body', 'truncate_size'), 'msg': 'x'} [...]")
    seen = normalise(httpx.Response(400, json={"object": "error", "message": message, "code": 400}))
    assert seen["body.message"] == "<validation error>"
    assert seen["validation errors"] == ["int_type at 'body', 'truncate_size'", "missing at 'body', 'name'"]
    assert "validation errors" not in normalise(httpx.Response(400, json={"message": "Failed at v3"}))


@pytest.mark.cpu
def test_coverage_asks_a_malformed_body_of_every_route_that_takes_a_struct() -> None:
    from gpu.fidelity.coverage import uncovered
    from gpu.fidelity.malformed import MALFORMED
    from gpu.fidelity.script import Sent

    found = uncovered("0.5.23", [Sent("POST", "/pause_generation", frozenset({"mode"}), MALFORMED)])
    assert ("/pause_generation", None, MALFORMED) not in found
    # a refused body compares no field and no route: it covers only its state
    assert ("/pause_generation", "mode") in found and ("/pause_generation", None) in found
    assert ("/update_weight_version", None, MALFORMED) in found and ("/model_info", None, MALFORMED) not in found


@pytest.mark.cpu
def test_coverage_holds_only_when_every_uncovered_item_is_listed_and_no_listing_is_stale() -> None:
    from gpu.fidelity.coverage import Listed, judge, report

    found = {"9.1": [("/a", None), ("/b", "x"), ("/b", "rid"), ("/b", None, "idle"), ("/a", None, "decoding")],
             "9.2": [("/b", "rid")]}
    entries = [Listed("/a", None, "why a"), Listed("*", ("rid",), "why rid"), Listed("/c", ("y",), "why c"),
               Listed("/a", None, "why a's states", ("*",)), Listed("/d", None, "why d", ("idle",))]
    unexplained, stale = judge(found, entries)
    assert unexplained == [("9.1", ("/b", "x")), ("9.1", ("/b", None, "idle"))]
    assert stale == ["/c y", "/d in state idle"]
    text, holds = report(found, entries)
    assert not holds and "UNCOMPARED 9.1 /b x" in text and "UNCOMPARED 9.1 /b in state idle" in text
    assert "STALE   /c y" in text and "1 uncovered route state(s)" not in text and "2 uncovered route state(s)" in text


@pytest.mark.cpu
@pytest.mark.slow  # the script on the fake, per release (a server lifetime per ending call each)
@pytest.mark.timeout(600)  # ~40 s on 2 quiet cores; CI's slow tier shares them three ways
def test_what_the_script_leaves_uncompared_is_listed_with_its_reason(capsys: pytest.CaptureFixture[str]) -> None:
    """No route or acted-on field of the fake goes uncompared with real SGLang unless gpu/fidelity/uncovered.json
    says why; a listed one that is compared now must go."""
    from gpu.fidelity.__main__ import coverage_main

    code = coverage_main(RELEASES)
    out = capsys.readouterr().out
    assert code == 0, out
    for release in RELEASES:
        assert f"sglang {release}: " in out


@pytest.mark.cpu
@pytest.mark.parametrize("release", RELEASES)
def test_every_list_ci_compares_was_measured_with_this_script_and_this_fake(release: str) -> None:
    """CI's real stage compares every release of RELEASES (.ci/real-sglang.sh): each list must be stamped with the
    digest of the current script and fake sources, so a change to either is re-measured before it lands (the command
    says how)."""
    import gpu.fidelity.__main__ as fidelity

    assert fidelity.staleness(release) is None, fidelity.staleness(release)


class _Held:
    async def result(self) -> dict[str, Any]:
        return {"full budget": True}


@pytest.mark.cpu
@pytest.mark.parametrize(("seen", "lands_on", "expected"), [
    ([True, True, True], 2, (2, True)),        # the call found the request finished once: made again, and it landed
    ([True] * 5, None, (5, False)),            # never landed: the situation is recorded as not built
    ([False] * 5, None, (5, False)),           # never seen decoding: the call is still made (the step observed)
])
def test_a_call_meant_to_land_mid_decode_is_made_again_until_it_does_and_says_when_it_never_did(
        seen: list[bool], lands_on: int | None, expected: tuple[int, bool]) -> None:
    tries = iter(seen)
    acts: list[int] = []
    undos: list[int] = []

    async def start() -> tuple[_Held, bool]:
        return _Held(), next(tries)

    async def act(_: Any) -> bool:
        acts.append(1)
        return len(acts) == lands_on

    async def undo() -> None:
        undos.append(1)

    _, landed = asyncio.run(during_decode(start, act, undo))
    assert (len(acts), landed) == expected and len(undos) == len(acts) - 1


@pytest.mark.cpu
def test_the_scripts_client_opens_a_connection_per_call_so_none_is_lost_to_a_server_s_idle_limit() -> None:
    """Regression (the slow tier's coverage check, the fake SGLang's state matrix under load): a kept-alive connection
    reused as the server's idle limit closed it got no answer, and the lifetime ended there as if its server were lost.
    Each call comes from a connection of its own, and every request is recorded for the coverage report."""
    from fakes.server import LoopbackServer
    from gpu.fidelity.script import script_client

    peers: list[Any] = []

    async def app(scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        peers.append(scope["client"])
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/plain")]})
        await send({"type": "http.response.body", "body": b"ok"})

    sent: list[Any] = []

    async def calls(url: str) -> None:
        async with script_client(sent) as client:
            for _ in range(3):
                assert (await client.post(url + "/x", json={"a": 1})).status_code == 200

    with LoopbackServer(app) as server:
        asyncio.run(asyncio.wait_for(calls(server.url), 10.0))
    assert len(set(peers)) == 3, f"calls shared a connection: {peers}"
    assert [(s.path, s.fields) for s in sent] == [("/x", frozenset({"a"}))] * 3


@pytest.mark.cpu
def test_a_lifetime_that_lost_its_server_unasked_is_named_with_where_and_how() -> None:
    """The coverage report fails on a main sequence or state matrix cut short, saying where; an ending call's lifetime
    may lose its server (that is what it compares)."""
    from gpu.fidelity.__main__ import cut_short

    seen = {"server lost (state matrix)": {"at": "GET /health in state decoding", "error": "RemoteProtocolError"},
            "server lost (wrong shape)": {"at": "disk wrong shape", "error": "RemoteProtocolError"}}
    assert cut_short(seen) == ["state matrix: the connection was lost at 'GET /health in state decoding' "
                               "(RemoteProtocolError); nothing after it was sent"]
    assert cut_short({"server lost (bad base64)": {"at": "x", "error": "ReadError"}}) == []
