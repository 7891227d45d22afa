"""The example adapters run a full update cycle against fake engines on real loopback HTTP."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from pathlib import Path

import pytest

from conformance.cases import fake_backend_factory, load_integration, run_one
from conformance.interface import BuildEnv, Integration, RolloutConfig
from examples.httpx_adapter import integration as httpx_example
from examples.requests_adapter import integration as requests_example
from fakes.engine import FakeEngine
from fakes.server import LoopbackServer

from reference_rig import digest, finish_reasons, prompt_source, trainer_weights, within

pytestmark = pytest.mark.cpu


@pytest.mark.asyncio
@pytest.mark.parametrize("integration, transport, pause_mode", [
    (requests_example, "disk", "retract"),
    (httpx_example, "tensor", "in_place"),
    (httpx_example, "disk", "retract"),
], ids=["requests-disk-retract", "httpx-tensor-in_place", "httpx-disk-retract"])
async def test_example_adapter_runs_an_update_cycle(tmp_path: Path, integration: Integration, transport: str,
                                                     pause_mode: str) -> None:
    assert integration.capabilities.missing(transport=transport, pause_mode=pause_mode) is None
    engines = [FakeEngine(tokens_per_second=400.0, engine_id=f"e{i}") for i in range(2)]
    servers = [LoopbackServer(e.app).start() for e in engines]
    try:
        env = BuildEnv([s.url for s in servers], tmp_path, RolloutConfig(batch_size=2, group_size=2),
                       prompt_source(), pause_mode=pause_mode)
        roles = await within(integration.build(env))
        await within(roles.manager.start())
        await within(asyncio.gather(*(asyncio.to_thread(s.run_coroutine, e.wait_until(
            lambda e=e: bool(e.scheduler.running), 5.0), 6.0) for s, e in zip(servers, engines))))
        weights = trainer_weights(engines[0], step=1)
        updater = roles.new_updater()

        assert await within(updater.update(weights, transport=transport)) == 1

        assert roles.manager.weight_version == 1
        assert [await within(client.get_weight_version()) for client in roles.engines] == ["1", "1"]
        assert [e.weights.digest() for e in engines] == [digest(weights)] * 2
        batch = await within(roles.manager.next_batch())
        assert len(batch.groups) == 2 and "abort" not in finish_reasons(engines)
        assert roles.new_updater().version == 1  # failover continues the version
        await within(roles.close())
    finally:
        for server in servers:
            server.stop()


def test_requests_example_declares_only_what_it_supports() -> None:
    assert requests_example.capabilities.missing(transport="tensor") is not None
    assert requests_example.capabilities.missing(lora=True) is not None
    assert httpx_example.capabilities.missing(transport="distributed") is not None


VLLM_EXAMPLES = {"trl-client": "examples.vllm_trl_client:integration",
                 "async-engine": "examples.vllm_async_engine:integration"}


@pytest.mark.parametrize("scenario", ["steady-disk-retract", "steady-disk-in_place", "failing-transfer-disk"])
@pytest.mark.parametrize("example", sorted(VLLM_EXAMPLES))
def test_vllm_example_adapters_pass_the_disk_cases_on_the_fake_vllm(example: str, scenario: str) -> None:
    result = run_one(scenario, load_integration(VLLM_EXAMPLES[example]), fake_backend_factory(engine="vllm"))
    assert result.verdicts and not result.skipped, result.skipped
    bad = [v.explain() for v in result.verdicts.values() if not v.passed]
    assert not bad, "\n".join(bad)


def test_async_engine_glue_that_leaves_the_pause_mode_out_is_caught_by_i3() -> None:
    """``AsyncLLM.pause_generation``'s default mode is ``abort``: glue that relies on it fails I3, with a witness."""
    from examples.vllm_async_engine import AsyncLLMClient, integration

    class DefaultPause(AsyncLLMClient):
        async def pause(self, mode: str) -> None:
            await self.engine.pause_generation()

    result = run_one("steady-disk-retract", replace(integration, client_cls=DefaultPause),
                     fake_backend_factory(engine="vllm"))
    assert result.verdicts["I3"].status == "fail" and result.verdicts["I3"].witness, result.verdicts["I3"].explain()
