"""The REAL sglang router (PyPI `sglang-router`, a CPU Rust wheel) in front of two fake engines, and the same
assertions against `FakeRouter`: one parametrized test per behaviour, so the fake is checked against the real
one. The real half is skipped only when `sglang_router` is not installed.

Also re-measures the router's `/generate` re-serialisation (kept fields, order, added defaults, dropped
unknowns and nulls) against `fakes.router.GENERATE_FIELDS`/`SAMPLING_FIELDS`, with recording workers.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from fakes.asgi import lifespan, read_body
from fakes.engine import FakeEngine
from fakes.router import WEIGHT_SYNC_PATHS, FakeRouter, normalise_generate
from fakes.server import LoopbackServer, RealRouterProcess, real_router_available

pytestmark = pytest.mark.cpu

HAVE_REAL_ROUTER = real_router_available()
KINDS = [
    # The real router is a process of its own: its half is a slow test (the README's test command leaves it out).
    pytest.param("real", marks=[pytest.mark.slow, pytest.mark.skipif(
        not HAVE_REAL_ROUTER, reason="sglang-router is not installed (pip install sglang-router==0.3.2)")]),
    "fake",
]
ROUTER_START_TIMEOUT = 30.0
# One client (a fresh httpx client per call costs ~25 ms for its SSL context), no keep-alive: a router closing an
# idle pooled connection while the client reuses it would fail a request for a reason that is not under test.
HTTP = httpx.Client(timeout=10, limits=httpx.Limits(max_keepalive_connections=0))


@contextlib.contextmanager
def real_router(worker_urls: list[str]) -> Iterator[str]:
    """The real router on a free port; yields its URL once every worker is registered and healthy."""
    with RealRouterProcess(worker_urls, start_timeout=ROUTER_START_TIMEOUT) as router:
        yield router.url


@contextlib.contextmanager
def fake_router(worker_urls: list[str]) -> Iterator[str]:
    with LoopbackServer(FakeRouter(worker_urls).app) as server:
        yield server.url


@pytest.fixture(scope="module")
def engines() -> Iterator[list[tuple[FakeEngine, str]]]:
    """Two fake engines on loopback, told apart by their weight version label."""
    pair = [FakeEngine(tokens_per_second=5000, engine_id=f"e{i}", weight_version=f"w{i}") for i in range(2)]
    with LoopbackServer(pair[0].app) as s0, LoopbackServer(pair[1].app) as s1:
        yield [(pair[0], s0.url), (pair[1], s1.url)]


@pytest.fixture(scope="module", params=KINDS)
def router(request: pytest.FixtureRequest, engines: list[tuple[FakeEngine, str]]) -> Iterator[str]:
    urls = [url for _, url in engines]
    with (real_router if request.param == "real" else fake_router)(urls) as url:
        yield url


def _generate(router_url: str, **extra: Any) -> httpx.Response:
    body = {"text": "hello router", "sampling_params": {"max_new_tokens": 3}, **extra}
    return HTTP.post(router_url + "/generate", json=body, timeout=10)


def test_generate_round_robins_over_the_workers(router: str) -> None:
    served = []
    for _ in range(4):
        resp = _generate(router, unknown_top_level_field=1)
        assert resp.status_code == 200, resp.text
        served.append(resp.json()["meta_info"]["weight_version"])
    assert sorted(served) == ["w0", "w0", "w1", "w1"]
    assert served[0] != served[1] and served[1] != served[2]


def test_generate_streaming_is_passed_through(router: str) -> None:
    with HTTP.stream("POST", router + "/generate", json={"text": "hi", "stream": True,
                                                          "sampling_params": {"max_new_tokens": 3}},
                      timeout=10) as resp:
        assert resp.status_code == 200
        assert resp.headers["content-type"].startswith("text/event-stream")
        lines = [line for line in resp.iter_lines() if line]
    assert lines[-1] == "data: [DONE]"
    chunks = [json.loads(line[len("data: "):]) for line in lines[:-1]]
    assert chunks[-1]["meta_info"]["finish_reason"]["type"] == "length"


def test_get_model_info_is_the_first_listed_workers_and_model_info_is_404(router: str) -> None:
    """"First healthy worker" is the first one `GET /workers` lists: for the real router that is the order the
    workers finished registering, not the `--worker-urls` order; it is stable for the router's lifetime."""
    first = HTTP.get(router + "/workers", timeout=10).json()["workers"][0]["url"]
    direct = HTTP.get(first + "/get_model_info", timeout=10)
    for _ in range(3):
        via_router = HTTP.get(router + "/get_model_info", timeout=10)
        assert via_router.status_code == 200 and via_router.json() == direct.json()
    assert HTTP.get(router + "/model_info", timeout=10).status_code == 404  # 0.3.2 has only /get_model_info


@pytest.mark.parametrize("path", WEIGHT_SYNC_PATHS)
def test_weight_sync_endpoints_are_not_routed(router: str, engines: list[tuple[FakeEngine, str]], path: str) -> None:
    before = [len(engine.events.of_kind("control")) for engine, _ in engines]
    resp = HTTP.post(router + path, json={"new_version": "9", "mode": "retract"}, timeout=10)
    assert (resp.status_code, resp.content) == (404, b"")
    assert [len(engine.events.of_kind("control")) for engine, _ in engines] == before, "nothing reached an engine"


def test_generate_body_refusals(router: str) -> None:
    resp = HTTP.post(router + "/generate", json={"text": ["a", "b"]}, timeout=10)
    assert resp.status_code == 422
    assert resp.text.startswith("Failed to deserialize the JSON body into the target type: text: invalid type: "
                                "sequence, expected a string")
    resp = HTTP.post(router + "/generate", json={"text": "x", "rid": ["a"]}, timeout=10)
    assert resp.status_code == 422 and "rid: invalid type: sequence, expected a string" in resp.text
    resp = HTTP.post(router + "/generate", json={"text": "x", "return_logprob": "true"}, timeout=10)
    assert resp.status_code == 422 and "return_logprob: invalid type: string \"true\", expected a boolean" in resp.text
    resp = HTTP.post(router + "/generate", content=b'{"text": "x"}', timeout=10)
    assert (resp.status_code, resp.text) == (415, "Expected request with `Content-Type: application/json`")
    resp = HTTP.post(router + "/generate", content=b"{bad", headers={"content-type": "application/json"}, timeout=10)
    assert resp.status_code == 400 and resp.text.startswith("Failed to parse the request body as JSON: ")
    assert HTTP.get(router + "/generate", timeout=10).status_code == 405


def test_flush_cache_fans_out(router: str) -> None:
    resp = HTTP.post(router + "/flush_cache", timeout=10)
    assert resp.status_code == 200
    assert resp.json() == {"status": "success", "message": "Successfully flushed cache on all 2 HTTP workers",
                           "workers_flushed": 2, "total_http_workers": 2, "total_workers": 2}
    assert HTTP.get(router + "/flush_cache", timeout=10).status_code == 405


def test_workers_health_and_info(router: str, engines: list[tuple[FakeEngine, str]]) -> None:
    listing = HTTP.get(router + "/workers", timeout=10).json()
    assert listing["total"] == 2 and listing["stats"] == {"prefill_count": 0, "decode_count": 0, "regular_count": 2}
    assert sorted(w["url"] for w in listing["workers"]) == sorted(url for _, url in engines)
    for worker in listing["workers"]:
        assert set(worker) >= {"id", "url", "model_id", "priority", "cost", "worker_type", "is_healthy", "load",
                               "connection_mode"}
        assert worker["is_healthy"] is True and worker["worker_type"] == "regular"
    health = HTTP.get(router + "/health", timeout=10)
    assert (health.status_code, health.text) == (200, "OK")
    assert HTTP.get(router + "/health_generate", timeout=10).status_code == 200
    assert HTTP.get(router + "/server_info", timeout=10).status_code == 404
    info = HTTP.get(router + "/get_server_info", timeout=10)
    assert info.status_code == 200 and json.loads(info.text)["workers_count"] == 2
    assert HTTP.get(router + "/list_workers", timeout=10).status_code == 404


# ------------------------------------------------------------------------------------------------ drift


def _recording_worker() -> tuple[Any, list[dict[str, Any]]]:
    """A minimal worker that answers /health and echoes each /generate body it receives."""
    seen: list[dict[str, Any]] = []

    async def app(scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            await lifespan(receive, send)
            return
        body = await read_body(receive)
        if scope["path"] == "/generate":
            seen.append(json.loads(body))
            payload = json.dumps({"text": "", "meta_info": {"id": "x"}}).encode()
        else:
            payload = json.dumps({"model_path": "m", "weight_version": "default"}).encode()
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"application/json")]})
        await send({"type": "http.response.body", "body": payload})

    return app, seen


DRIFT_BODY = {
    "text": "hi", "input_ids": [1, 2], "input_embeds": [[0.5]], "image_data": "img", "video_data": "v",
    "audio_data": "a", "return_logprob": True, "logprob_start_len": -1, "top_logprobs_num": 2,
    "token_ids_logprob": [3], "return_text_in_logprobs": True, "stream": False, "log_metrics": False,
    "return_hidden_states": True, "modalities": ["image"], "session_params": {"id": "s"}, "lora_path": "lora-a",
    "lora_id": "id-a", "custom_logit_processor": "p", "bootstrap_host": "h", "bootstrap_port": 1,
    "bootstrap_room": 2, "bootstrap_pair_key": "k", "data_parallel_rank": 0, "background": True,
    "conversation_id": "c", "priority": 3, "extra_key": "e", "no_logs": True, "custom_labels": {"a": "b"},
    "return_bytes": True, "return_entropy": True, "rid": "r-1", "model": "m",
    # dropped by the router: unknown, null, or a GenerateReqInput field its struct lacks
    "unknown_field": 1, "session_id": "s", "routing_key": "rk", "cache_salt": "salt", "weight_version": "x",
    "max_thinking_tokens": None,
    "sampling_params": {"max_new_tokens": 3, "temperature": 0.7, "top_p": 0.9, "top_k": -1, "min_p": 0.0,
                        "stop": ["x"], "stop_token_ids": [2], "frequency_penalty": 0.1, "presence_penalty": 0.2,
                        "repetition_penalty": 1.1, "min_new_tokens": 1, "n": 1, "json_schema": "{}", "regex": "r",
                        "ebnf": "e", "ignore_eos": True, "skip_special_tokens": False, "no_stop_trim": True,
                        "sampling_seed": 7, "logit_bias": {"1": 0.5}, "stream_interval": 2, "weird": 1},
}


@pytest.fixture(scope="module", params=KINDS)
def recording_router(request: pytest.FixtureRequest) -> Iterator[tuple[str, list[dict[str, Any]]]]:
    app, seen = _recording_worker()
    with LoopbackServer(app) as worker:
        with (real_router if request.param == "real" else fake_router)([worker.url]) as url:
            yield url, seen


@pytest.mark.parametrize("body", [DRIFT_BODY, {"text": "plain"}, {"input_ids": [[1], [2, 3]]}, {}],
                         ids=["every-field", "text-only", "batch-ids", "empty"])
def test_generate_is_reserialised_like_the_real_router(recording_router: tuple[str, list[dict[str, Any]]],
                                                       body: dict[str, Any]) -> None:
    """What the worker receives is exactly `normalise_generate(body)`: same keys, order, values."""
    url, seen = recording_router
    seen.clear()
    resp = HTTP.post(url + "/generate", json=body)
    assert resp.status_code == 200, resp.text
    assert len(seen) == 1
    expected = normalise_generate(body)
    assert list(seen[0]) == list(expected) and seen[0] == expected
