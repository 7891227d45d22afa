"""The suite's own proof: every mutant of the reference integration is killed by the invariant it breaks.

Each mutant reintroduces one real bug (seeds and docs/rl-frameworks.md); the whole conformance suite runs
against it, exactly as ``pytest --integration conformance.mutants:<name>`` would, and must fail the expected
invariant with a witness. The mutation table (mutant → cases that killed it) is printed at the end of the run.
"""

from __future__ import annotations

import json

import pytest

from conformance.cases import fake_backend_factory, run_cases
from conformance.mutants import MUTANTS

pytestmark = pytest.mark.cpu


@pytest.mark.parametrize("name", sorted(MUTANTS))
def test_mutant_is_killed(name: str, record_property) -> None:
    mutant = MUTANTS[name]
    results = run_cases(mutant.integration, fake_backend_factory(seed=0))
    killers = {(check, scenario): v for scenario, r in results.items() for check, v in r.verdicts.items()
               if v.status == "fail"}
    record_property("mutation", json.dumps({"mutant": name, "bug": mutant.bug,
                                            "killed_by": sorted(f"{c}-{s}" for c, s in killers)}))
    failed_invariants = {inv for check, _ in killers for inv in check.split("-")}
    expected = set(mutant.kills)
    assert expected & failed_invariants, (
        f"mutant {name} ({mutant.bug}; {mutant.source}) survived: expected one of {sorted(expected)} to fail; "
        f"failed cases: {sorted(f'{c}-{s}' for c, s in killers) or 'none'}")
    for (check, scenario), v in killers.items():
        assert v.witness, f"{check}-{scenario} failed on {name} without a witness"
