"""fakes/router.py: FakeRouter behaviour that the real-router comparison (test_real_router.py) does not reach —
retries, dead and unhealthy workers, partial flushes, the `spec` flavour, injected faults, in-process use."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from fakes.engine import FakeEngine
from fakes.faults import Fault, FaultPlan
from fakes.router import WEIGHT_SYNC_PATHS, FakeRouter, normalise_generate
from fakes.server import LoopbackServer, asgi_client

pytestmark = pytest.mark.cpu

GEN = {"text": "hello", "sampling_params": {"max_new_tokens": 3}}


def _engines(n: int = 2, **kwargs: Any) -> dict[str, FakeEngine]:
    return {f"http://engine-{i}:30000": FakeEngine(tokens_per_second=5000, engine_id=f"e{i}",
                                                   weight_version=f"w{i}", **kwargs.get(f"e{i}", {}))
            for i in range(n)}


def _router(engines: dict[str, FakeEngine], **kwargs: Any) -> FakeRouter:
    return FakeRouter.for_apps({url: e.app for url, e in engines.items()}, **kwargs)


@pytest.mark.asyncio
async def test_in_process_round_robin_and_weight_sync_404() -> None:
    engines = _engines()
    router = _router(engines)
    async with asgi_client(router.app) as client:
        served = [(await client.post("/generate", json=GEN)).json()["meta_info"]["weight_version"] for _ in range(4)]
        assert served == ["w0", "w1", "w0", "w1"]
        for path in WEIGHT_SYNC_PATHS:
            resp = await client.post(path, json={})
            assert (resp.status_code, resp.content) == (404, b"")
    assert [f[1] for f in router.forwarded] == ["/generate"] * 4
    await router.aclose()


@pytest.mark.asyncio
async def test_retryable_worker_errors_go_to_the_next_worker() -> None:
    engines = _engines(e0={"faults": FaultPlan([Fault("/generate", "error", status=503, times=1)])})
    router = _router(engines)
    async with asgi_client(router.app) as client:
        resp = await client.post("/generate", json=GEN)
        assert resp.status_code == 200 and resp.json()["meta_info"]["weight_version"] == "w1"
        assert [w for w, _, _ in router.forwarded] == ["http://engine-0:30000", "http://engine-1:30000"]
    await router.aclose()


@pytest.mark.asyncio
async def test_a_non_retryable_worker_error_passes_through() -> None:
    engines = _engines(e0={"faults": FaultPlan([Fault("/generate", "error", status=400,
                                                      body={"error": {"message": "bad"}}, times=1)])})
    router = _router(engines)
    async with asgi_client(router.app) as client:
        resp = await client.post("/generate", json=GEN)
        assert (resp.status_code, resp.json()) == (400, {"error": {"message": "bad"}})
    await router.aclose()


@pytest.mark.asyncio
async def test_all_attempts_failing_returns_the_last_status() -> None:
    plan = {"faults": FaultPlan([Fault("/generate", "error", status=500)])}
    router = _router(_engines(e0=plan, e1=plan), max_attempts=3)
    async with asgi_client(router.app) as client:
        resp = await client.post("/generate", json=GEN)
        assert resp.status_code == 500
    assert len(router.forwarded) == 3
    await router.aclose()


def test_a_dead_worker_is_skipped_and_marked_unhealthy() -> None:
    """Loopback: one worker's server is stopped; its connection is refused and the router moves on."""
    import requests
    alive, dead = FakeEngine(tokens_per_second=5000, weight_version="alive"), FakeEngine(weight_version="dead")
    with LoopbackServer(alive.app) as s_alive:
        s_dead = LoopbackServer(dead.app).start()
        dead_url = s_dead.url
        s_dead.stop()
        with LoopbackServer(FakeRouter([dead_url, s_alive.url]).app) as front:
            for _ in range(3):
                resp = requests.post(front.url + "/generate", json=GEN, timeout=10)
                assert resp.status_code == 200 and resp.json()["meta_info"]["weight_version"] == "alive"
            health = {w["url"]: w["is_healthy"] for w in requests.get(front.url + "/workers", timeout=10).json()["workers"]}
            assert health == {dead_url: False, s_alive.url: True}
            flush = requests.post(front.url + "/flush_cache", timeout=10)
            assert flush.status_code == 206 and flush.json()["status"] == "partial_success"
            assert flush.json()["failed"][0]["worker"] == dead_url


@pytest.mark.asyncio
async def test_unhealthy_workers_are_not_routed_to() -> None:
    engines = _engines()
    router = _router(engines)
    router.set_worker_health("http://engine-0:30000", False)
    async with asgi_client(router.app) as client:
        served = {(await client.post("/generate", json=GEN)).json()["meta_info"]["weight_version"] for _ in range(3)}
        assert served == {"w1"}
        info = (await client.get("/get_model_info")).json()
        assert info["weight_version"] == "w1", "first *healthy* worker"
        router.set_worker_health("http://engine-1:30000", False)
        resp = await client.post("/generate", json=GEN)
        assert resp.status_code == 503 and resp.json()["error"]["code"] == "no_available_workers"
        assert (await client.get("/readiness")).status_code == 503
    await router.aclose()


@pytest.mark.asyncio
async def test_flush_fan_out_reports_failures() -> None:
    engines = _engines(e1={"faults": FaultPlan([Fault("/flush_cache", "flush_fail", times=1)])})
    router = _router(engines)
    async with asgi_client(router.app) as client:
        resp = await client.post("/flush_cache")
        assert resp.status_code == 206
        assert resp.json() == {"status": "partial_success", "message": "Cache flush: 1 succeeded, 1 failed",
                               "workers_flushed": 1, "total_http_workers": 2, "total_workers": 2,
                               "successful": ["http://engine-0:30000"],
                               "failed": [{"worker": "http://engine-1:30000", "error": "HTTP 400 Bad Request"}]}
        assert (await client.post("/flush_cache")).status_code == 200  # the fault fired once
    await router.aclose()


@pytest.mark.asyncio
async def test_streaming_passes_through_in_process() -> None:
    router = _router(_engines(1))
    async with asgi_client(router.app) as client:
        resp = await client.post("/generate", json=dict(GEN, stream=True))
        assert resp.headers["content-type"].startswith("text/event-stream")
        assert resp.text.rstrip().endswith("data: [DONE]")
    await router.aclose()


@pytest.mark.asyncio
async def test_spec_flavor_follows_spec_section_8() -> None:
    engines = _engines()
    router = _router(engines, flavor="spec")
    async with asgi_client(router.app) as client:
        for path in ("/model_info", "/get_model_info"):
            resp = await client.get(path)
            assert resp.status_code == 200 and resp.json()["weight_version"] == "w0"
        assert (await client.get("/server_info")).json()["weight_version"] == "w0"
        both = await client.post("/generate", json={"text": "a", "input_ids": [1]})
        neither = await client.post("/generate", json={"sampling_params": {}})
        assert both.status_code == neither.status_code == 400
        assert (await client.get("/health_generate")).status_code == 200
        flush = (await client.post("/flush_cache")).json()
        assert set(flush) == {"successful", "failed", "total_workers", "http_workers", "message"}
    await router.aclose()


@pytest.mark.asyncio
async def test_router_faults_as_data() -> None:
    plan = FaultPlan([Fault("/get_model_info", "error", status=502, body={"error": "injected"}, times=1),
                      Fault("/workers", "hang", times=1), Fault("/v1/models", "crash")])
    router = _router(_engines(1), faults=plan)
    async with asgi_client(router.app) as client:
        resp = await client.get("/get_model_info")
        assert (resp.status_code, resp.json()) == (502, {"error": "injected"})
        assert (await client.get("/get_model_info")).status_code == 200
        with pytest.raises(asyncio.TimeoutError):
            await asyncio.wait_for(client.get("/workers"), 0.2)
        with pytest.raises(RuntimeError):
            await client.get("/v1/models")
        assert router.crashed
        with pytest.raises(RuntimeError):
            await client.get("/health")
    await router.aclose()


def test_normalise_generate_is_strict_where_serde_is() -> None:
    assert normalise_generate({"text": "x", "priority": 1})["priority"] == 1
    for bad in ({"text": "x", "priority": 1.0}, {"text": "x", "priority": True}, {"text": "x", "stream": None},
                {"text": "x", "sampling_params": {"max_new_tokens": -1}}, {"text": "x", "input_ids": "abc"},
                {"text": 5}, [1], "text"):
        with pytest.raises(Exception) as exc:
            normalise_generate(bad)
        assert getattr(exc.value, "status", None) == 422, bad
    out = normalise_generate({"text": "x", "sampling_params": {"temperature": 1, "weird": 2, "top_k": None}})
    assert out["sampling_params"] == {"temperature": 1.0}


def test_constructor_checks() -> None:
    with pytest.raises(ValueError):
        FakeRouter(["http://a"], flavor="1.0")
    with pytest.raises(ValueError):
        FakeRouter(["http://a"], policy="nearest")
