"""Four vLLM integrations written from the README alone (``examples/vllm_designs``, issue 41) pass on the fake vLLM:
a few fast scenarios each, every verdict pass (a skipped check is the integration's declared limit, never a pass)."""

from __future__ import annotations

from typing import Any

import pytest

from conformance.cases import fake_backend_factory, run_cases
from conformance.scenarios import Deadlines

pytestmark = [pytest.mark.cpu, pytest.mark.slow]  # whole designs end to end: the README command's budget
FAST = Deadlines(update_s=5.0, drain_s=5.0, wait_s=5.0, script_s=30.0)


def _integration(module: str) -> Any:
    import importlib
    return importlib.import_module(f"examples.vllm_designs.{module}").integration


def _verdicts(module: str, scenarios: list[str]) -> dict[str, Any]:
    results = run_cases(_integration(module), fake_backend_factory(engine="vllm"), scenarios=scenarios,
                        deadlines=FAST)
    skipped = {s: r.skipped for s, r in results.items() if r.skipped}
    assert not skipped, skipped
    return {f"{c}-{s}": v for s, r in results.items() for c, v in r.verdicts.items()}


@pytest.mark.parametrize("module, scenarios", [
    ("async_httpx", ["steady-disk-retract", "one-engine-rejects"]),
    ("threaded_requests", ["answers-while-paused", "prefix-reuse"]),
    ("lora_inplace", ["lora-refused-by-one"]),
])
def test_a_design_written_from_the_readme_passes_on_the_fake_vllm(module: str, scenarios: list[str]) -> None:
    verdicts = _verdicts(module, scenarios)
    bad = {case: v.explain() for case, v in verdicts.items() if not v.passed}
    assert verdicts and not bad, bad


def test_the_checkpoint_cleaning_design_passes_every_check() -> None:
    """It stops sending during its cycle: the first pause is held for a young request that never comes, and the fake's
    engines are frozen meanwhile (``WireControl.freeze``), so its requests decoding when the pause arrived are still
    decoding when it goes on: I1-I2 judges them (it answered unknown at random under load before)."""
    verdicts = _verdicts("threaded_cleanup", ["one-engine-rejects", "first-drain", "mixed-versions"])
    bad = {case: v.explain() for case, v in verdicts.items() if not v.passed}
    assert verdicts and "F3-one-engine-rejects" in verdicts and not bad, bad
