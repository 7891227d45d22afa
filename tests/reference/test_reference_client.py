"""The reference engine client against a fake SGLang engine: validation, retries, version-dependent endpoints."""

from __future__ import annotations

import httpx
import pytest

from conformance.reference import EngineError, HttpEngineClient
from fakes.engine import FakeEngine
from fakes.faults import Fault, FaultPlan

from reference_rig import Rig, control_endpoints, trainer_weights, within

pytestmark = pytest.mark.cpu


def client_for(engine: FakeEngine, **options: float) -> HttpEngineClient:
    http = httpx.AsyncClient(transport=httpx.ASGITransport(app=engine.app))
    return HttpEngineClient("http://engine", http, timeout_s=5.0, **options)


@pytest.mark.asyncio
async def test_flush_backs_off_on_400_until_the_engine_accepts() -> None:
    engine = FakeEngine(faults=FaultPlan([Fault("/flush_cache", "flush_fail", times=2)]))
    client = client_for(engine)
    await within(client.flush_cache())
    assert [e.fields["status"] for e in engine.events.of_kind("control")] == [400, 400, 200]
    await client.http.aclose()


@pytest.mark.asyncio
async def test_flush_gives_up_at_its_deadline_naming_engine_and_status() -> None:
    engine = FakeEngine(faults=FaultPlan([Fault("/flush_cache", "flush_fail")]))
    client = client_for(engine, flush_deadline_s=0.3)
    await within(client.get_weight_version())  # the client-to-engine path warmed: a cold first call (a fresh venv
    # compiling its modules) must not spend the whole flush deadline before the first retry
    with pytest.raises(EngineError) as failure:
        await within(client.flush_cache())
    assert (failure.value.url, failure.value.endpoint, failure.value.status) == ("http://engine", "/flush_cache", 400)
    assert len(engine.events.of_kind("control")) > 1
    await client.http.aclose()


@pytest.mark.asyncio
async def test_version_bump_never_aborts_and_success_false_raises() -> None:
    engine = FakeEngine()
    client = client_for(engine)
    await within(client.update_weight_version("7"))
    assert await within(client.get_weight_version()) == "7"
    assert engine.events.of_kind("control")[0].fields["payload"] == {"new_version": "7",
                                                                      "abort_all_requests": False}
    with pytest.raises(EngineError, match="/update_weights_from_disk: status 400"):
        await within(client.update_weights_from_disk("/does/not/exist"))
    await client.http.aclose()


@pytest.mark.asyncio
async def test_unreachable_engine_is_an_engine_error() -> None:
    client = HttpEngineClient("http://127.0.0.1:9", httpx.AsyncClient(), timeout_s=2.0)
    with pytest.raises(EngineError, match=r"http://127.0.0.1:9 /pause_generation: status None"):
        await within(client.pause("retract"))
    await client.http.aclose()


@pytest.mark.asyncio
async def test_old_engine_falls_back_to_get_model_info() -> None:
    client = client_for(FakeEngine(profile="0.5.4"))
    assert await within(client.get_weight_version()) == "default"
    await client.http.aclose()


@pytest.mark.asyncio
async def test_engine_without_sessions_is_asked_once_then_skipped(rig: Rig) -> None:
    engines = rig.start_engines(profile="0.5.10")
    roles = await rig.build(pause_mode="in_place")
    updater = roles.new_updater()
    for step in (1, 2):
        assert await within(updater.update(trainer_weights(engines[0], step), transport="tensor")) == step
    assert all(client.has_sessions is False for client in roles.engines)
    assert [e.weight_version for e in engines] == ["2", "2"]
    assert all("/begin_weight_update" not in control_endpoints(e) for e in engines)


def test_pooled_connections_are_dropped_before_the_engine_closes_them(tmp_path) -> None:
    """SGLang's uvicorn closes a connection idle for 5 s; a client that keeps it as long can send a request on it as
    it closes (lost, ReadError). The reference and the suite's own probes and sentinels drop theirs well before."""
    from conformance.backends import probe_client
    from conformance.interface import KEEPALIVE_EXPIRY_S, BuildEnv, RolloutConfig
    from conformance.reference import ReferenceIntegration
    from conformance.wire import SENTINEL_HEADER
    from fakes.serving import KEEP_ALIVE_S

    assert KEEPALIVE_EXPIRY_S < KEEP_ALIVE_S / 2
    env = BuildEnv(engine_urls=["http://127.0.0.1:1"], workdir=tmp_path, rollout=RolloutConfig(), prompts=list)
    clients = [ReferenceIntegration().make_http_client(env), probe_client(), probe_client(None, SENTINEL_HEADER)]
    assert [c._transport._pool._keepalive_expiry for c in clients] == [KEEPALIVE_EXPIRY_S] * 3  # httpcore's pool
