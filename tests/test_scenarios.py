"""The scenario driver's own waits: they reach the state they promise on a correct integration, or fail in
seconds with what they saw."""

from __future__ import annotations

import asyncio
from dataclasses import replace

import pytest

from conformance import DEFAULT_INTEGRATION
from conformance.cases import fake_backend_factory, load_integration
from conformance.scenarios import SCENARIOS, Run, run_scenario

pytestmark = pytest.mark.cpu


def _run(script) -> list[str]:
    """Run ``script`` as the mixed-versions scenario (two groups in flight, a buffer of two, batches of one) on
    the reference integration; the scenario's errors."""
    scenario = replace(SCENARIOS["mixed-versions"], name="driver-test", script=script)
    backend = fake_backend_factory()()
    backend.start()
    try:
        history = asyncio.run(asyncio.wait_for(
            run_scenario(scenario, load_integration(DEFAULT_INTEGRATION), backend), 40))
    finally:
        backend.stop()
    return [b.message for b in history.breaks] + [c.error for c in history.cycles if c.error] + \
        [u.reason for u in history.unmet]


def test_update_waits_for_every_engine_even_from_a_full_buffer() -> None:
    """Regression (CI flake): from a full buffer, consuming one batch frees one group at a time, on alternating
    engines, so "drain only when nothing is in flight" never had both engines decoding at once (livelock until
    the 10 s timeout). The wait must keep consuming until every engine holds a request still decoding."""

    async def script(run: Run) -> None:
        await run.start()
        await run.until_producer_blocked()
        for _ in range(3):
            await run.update(resident=True)
            await run.until_producer_blocked()

    assert _run(script) == []


def test_a_refusal_the_integration_never_triggers_is_reported_not_ignored() -> None:
    """A fault that never fired must not let a scenario pass as if it had been survived."""

    async def script(run: Run) -> None:
        await run.start()
        run.backend.wire.refuse(0, "/no_such_endpoint", 400, {"success": False})
        await run.update()

    errors = _run(script)
    assert len(errors) == 1 and "(0, '/no_such_endpoint')" in errors[0] and "never used" in errors[0], errors
