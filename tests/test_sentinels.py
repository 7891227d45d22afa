"""The suite's long-lived requests (``conformance.situations.sentinels``): one stays resident on every engine until the cycle
reaches that engine, sent again when it ended on its own first; never again once the engine was paused."""

from __future__ import annotations

import asyncio

import httpx
import pytest

from conformance.backends import FakeBackend, FakeBackendConfig
from conformance.situations.sentinels import Sentinels

pytestmark = pytest.mark.cpu
TOKENS_PER_S = 2000.0


def test_a_sentinel_that_ends_before_its_engine_is_disturbed_is_sent_again_and_never_once_it_was() -> None:
    backend = FakeBackend(FakeBackendConfig(engines=2, tokens_per_second=TOKENS_PER_S, stepped=True))
    backend.start()
    try:
        async def scenario() -> dict[int, list[str]]:
            sentinels = Sentinels(backend.urls, backend.wire, 100, "t")  # 100 tokens: 50 ms of decoding
            async with httpx.AsyncClient(timeout=5.0) as client:
                async with backend.held():  # nothing decodes: engine 0 is paused while its first sentinel runs
                    await asyncio.wait_for(sentinels.start(), 5.0)
                    await client.post(backend.urls[0] + "/pause_generation", json={"mode": "in_place"})
                # engine 1 was never disturbed: its sentinel ends and is sent again, as often as it ends
                await asyncio.wait_for(until(lambda: sentinels.renewed >= 5), 5.0)
                await client.post(backend.urls[0] + "/continue_generation", json={})
                await asyncio.wait_for(sentinels.release(), 5.0)
            rids: dict[int, list[str]] = {0: [], 1: []}
            for call in backend.wire.snapshot():
                if call.origin == "sentinel" and call.path == "/generate":
                    rids[call.engine].append(call.payload["rid"])
            return rids

        rids = asyncio.run(scenario())
    finally:
        backend.stop()
    assert len(rids[0]) == 1, f"engine 0's sentinel was sent again after its engine was paused: {rids[0]}"
    assert len(rids[1]) >= 6 and len(set(rids[1])) == len(rids[1]), rids[1]


async def until(condition) -> None:
    while not condition():
        await asyncio.sleep(0.002)


def test_time_in_which_the_loop_did_not_run_does_not_use_the_wait_for_sentinels_up(monkeypatch) -> None:
    """Regression (real vLLM 0.32.0 in CI, slow-engine-disk broken): on a starved machine the wait for the sentinels to
    reach their recorders ran out on the wall clock while the process was not scheduled. Here the loop is frozen for
    three times the bound before the sentinels were even sent; they arrive once it runs again, and the wait sees it."""
    import time

    import conformance.situations.sentinels as sentinel_module

    monkeypatch.setattr(sentinel_module, "START_TIMEOUT_S", 0.4)
    missing = sentinel_module.Sentinels._missing
    looks: list[int] = []

    def frozen_once(self: Sentinels) -> list[int]:
        looks.append(1)
        if len(looks) == 1:
            time.sleep(1.2)  # sleep-ok: freezes the loop as a starved machine does (it is the fault, not a wait)
        return missing(self)
    monkeypatch.setattr(sentinel_module.Sentinels, "_missing", frozen_once)
    backend = FakeBackend(FakeBackendConfig(engines=2, tokens_per_second=TOKENS_PER_S, stepped=True))
    backend.start()
    try:
        async def scenario() -> None:
            sentinels = Sentinels(backend.urls, backend.wire, 100, "t")
            async with backend.held():  # nothing decodes: the sentinels stay open
                await asyncio.wait_for(sentinels.start(), 10.0)
                await asyncio.wait_for(sentinels.release(), 10.0)

        asyncio.run(scenario())
    finally:
        backend.stop()
    assert len(looks) > 2, f"the wait gave up after {len(looks)} looks"
