"""Four vLLM integrations written from the README alone (``examples/vllm_designs``, issue 41) pass on the fake vLLM:
a few fast scenarios each, every verdict pass (a skipped check is the integration's declared limit, never a pass)."""

from __future__ import annotations

from typing import Any

import pytest

from conformance.cases import fake_backend_factory, run_cases
from conformance.scenarios import Deadlines

pytestmark = pytest.mark.cpu
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
    ("threaded_requests", ["answers-while-paused"]),
    ("lora_inplace", ["lora-refused-by-one"]),
])
def test_a_design_written_from_the_readme_passes_on_the_fake_vllm(module: str, scenarios: list[str]) -> None:
    verdicts = _verdicts(module, scenarios)
    bad = {case: v.explain() for case, v in verdicts.items() if not v.passed}
    assert verdicts and not bad, bad


HOLD_FALSE_ALARM = ("no update cycle whose first pause, bump or transfer reached an engine while one of the "
                    "integration's requests was decoding there")
"""I1-I2's unknown for a client-side design (issue 41): the manager sends no call while its cycle runs (as the
reference's own client-side gate does), so the suite's hold of the first pause, waiting for a *young* request, only
lets the integration's requests that were decoding when the pause was sent finish. Intermittent (load-dependent),
so it is allowed here with its witness, not listed as a strict xfail."""


def test_the_checkpoint_cleaning_design_passes_every_check_but_the_intermittent_i1_i2_hold() -> None:
    verdicts = _verdicts("threaded_cleanup", ["one-engine-rejects"])
    bad = {case: v.explain() for case, v in verdicts.items() if not v.passed
           and not (case.startswith("I1-I2-") and v.status == "unknown" and HOLD_FALSE_ALARM in v.explain())}
    assert verdicts and "F3-one-engine-rejects" in verdicts and not bad, bad
