"""The suite's own proof: every mutant of the reference integration is killed by the invariant it breaks.

Each mutant reintroduces one real bug (seeds and docs/rl-frameworks.md); the conformance scenarios checked for the
invariants it breaks run against it, exactly as ``pytest --integration conformance.mutants:<name>`` would run
them, and must fail the expected invariant with a witness. The mutation table (mutant → cases that killed it)
is printed at the end of the run.
"""

from __future__ import annotations

import json

import pytest

from conformance.cases import fake_backend_factory, run_cases
from conformance.mutants import MUTANTS
from conformance.scenarios import SCENARIOS, Deadlines

DEADLINES = Deadlines(update_s=5.0, drain_s=10.0)
"""Shorter than a user's defaults: a mutant that deadlocks (``lora_reload_in_place``) hangs for this long."""

pytestmark = pytest.mark.cpu


def _invariants(check: str) -> set[str]:
    return set(check.split("-"))  # "V4-S1" checks V4 and S1


@pytest.mark.parametrize("name", sorted(MUTANTS))
def test_mutant_is_killed(name: str, record_property) -> None:
    mutant = MUTANTS[name]
    # Only the scenarios checked for an invariant the mutant should break: the others cannot kill it as expected.
    scenarios = [s.name for s in SCENARIOS.values() if any(_invariants(c) & set(mutant.kills) for c in s.checks)]
    assert scenarios, f"no scenario checks any of {mutant.kills}"
    results = run_cases(mutant.integration, fake_backend_factory(seed=0), scenarios=scenarios, deadlines=DEADLINES)
    # Killed by the checker itself: a case that fails only because the run broke does not count here.
    killers = {(check, scenario): v for scenario, r in results.items() for check, v in r.verdicts.items()
               if v.checker_status == "fail"}
    record_property("mutation", json.dumps({"mutant": name, "bug": mutant.bug,
                                            "killed_by": sorted(f"{c}-{s}" for c, s in killers)}))
    failed_invariants = {inv for check, _ in killers for inv in _invariants(check)}
    expected = set(mutant.kills)
    assert expected & failed_invariants, (
        f"mutant {name} ({mutant.bug}; {mutant.source}) survived: expected one of {sorted(expected)} to fail; "
        f"failed cases: {sorted(f'{c}-{s}' for c, s in killers) or 'none'}")
    for (check, scenario), v in killers.items():
        assert v.witness, f"{check}-{scenario} failed on {name} without a witness"
