"""The fake backend's stepped clock: held, it decodes nothing; stepped, exactly the steps asked for."""

from __future__ import annotations

import asyncio

import httpx
import pytest

from conformance.backends import FakeBackend, FakeBackendConfig
from conformance.scenarios.errors import ScenarioTimeout, wait_for_condition

pytestmark = pytest.mark.cpu


def test_a_stepped_backend_decodes_only_the_steps_asked_for_while_held() -> None:
    backend = FakeBackend(FakeBackendConfig(engines=1, tokens_per_second=200.0, stepped=True))
    backend.start()

    async def scenario() -> None:
        async with httpx.AsyncClient(timeout=10.0) as client:
            answer = asyncio.create_task(client.post(backend.urls[0] + "/generate", json={
                "rid": "r0", "input_ids": [1, 2, 3], "sampling_params": {"max_new_tokens": 40}}))
            await wait_for_condition(lambda: 0 < backend.tokens_left().get("r0", 0) < 35, 5.0, "r0 decoding")
            async with backend.held():
                left = backend.tokens_left()["r0"]
                with pytest.raises(ScenarioTimeout):  # ten ticks' time: the clock stands still
                    await wait_for_condition(lambda: backend.tokens_left()["r0"] != left, 0.05, "a token")
                await backend.step(left - 2)
                assert backend.tokens_left() == {"r0": 2}
            body = (await asyncio.wait_for(answer, 5.0)).json()
        assert body["meta_info"]["finish_reason"]["type"] == "length" and body["meta_info"]["completion_tokens"] == 40
        with pytest.raises(RuntimeError, match="inside FakeBackend.held"):
            await backend.step()

    try:
        asyncio.run(scenario())
    finally:
        backend.stop()


def test_a_real_time_backend_cannot_be_held() -> None:
    backend = FakeBackend(FakeBackendConfig(engines=1))

    async def hold() -> None:
        async with backend.held():
            pass

    with pytest.raises(RuntimeError, match="stepped=True"):
        asyncio.run(hold())
