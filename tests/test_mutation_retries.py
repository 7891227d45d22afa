"""``gpu.mutation.run_mutant`` runs a scenario again while the checks that kill the mutant answer ``unknown`` (the
situation did not happen: proof of nothing), names those runs in the outcome, and never counts them as a kill."""

from __future__ import annotations

import pytest

from conformance.cases import ScenarioResult
from conformance.checks.verdict import Verdict
from conformance.mutants import MUTANTS
from gpu import mutation

pytestmark = pytest.mark.cpu


def _scripted(statuses: list[str], seeds: list[int]):
    def run_one(scenario, integration, factory, seed, deadlines):
        seeds.append(seed)
        status = statuses[min(len(seeds), len(statuses)) - 1]
        return ScenarioResult(verdicts={"I4": Verdict("I4", status, [f"I4 said {status}"])})
    return run_one


@pytest.mark.parametrize("statuses, outcome, runs", [
    (["unknown", "fail"], "killed", 2),
    (["pass"], "survived", 1),
    (["unknown"] * mutation.UNKNOWN_TRIES, "survived", mutation.UNKNOWN_TRIES),
])
def test_unknown_runs_the_scenario_again(monkeypatch, statuses, outcome, runs) -> None:
    seeds: list[int] = []
    monkeypatch.setattr(mutation, "run_one", _scripted(statuses, seeds))
    result = mutation.run_mutant(MUTANTS["recycle_partial"], factory=None, seed=5)  # type: ignore[arg-type]
    assert (result.status, seeds) == (outcome, list(range(5, 5 + runs)))
    if "unknown" in statuses:
        assert "unknown on aborted-groups seed 5" in result.reason, result.reason
    if outcome == "survived":
        assert f"I4-aborted-groups {statuses[-1]} (I4 said {statuses[-1]})" in result.reason, result.reason


def test_a_scenario_the_backend_cannot_build_skips_the_mutant_with_the_reason(monkeypatch) -> None:
    monkeypatch.setattr(mutation, "run_one", lambda *a: ScenarioResult(skipped="the backend cannot restart an engine"))
    result = mutation.run_mutant(MUTANTS["rejoins_unsynced"], factory=None)  # type: ignore[arg-type]
    assert (result.status, result.reason) == ("skipped", "engine-restarted: the backend cannot restart an engine")
