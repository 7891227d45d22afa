"""The suite's own proof: every mutant of the reference integration is killed by the invariant it breaks.

Each mutant reintroduces one real bug (seeds and docs/rl-frameworks.md); the scenarios built to expose it
(``Mutant.shows_in``, checked for the invariants it breaks) run against it, exactly as ``pytest --integration
conformance.mutants:<name>`` would run them, and the expected checker itself must fail with a witness. The mutation
table (mutant → cases that killed it) is printed at the end of the run. ``benchmarks/verdict_determinism.py`` runs
every mutant through every scenario checked for its invariants, ten times.
"""

from __future__ import annotations

import json
from typing import Callable

import pytest

from conformance.checks import invariants
from conformance.cases import fake_backend_factory, run_cases
from conformance.mutants import MUTANTS, VLLM_MUTANTS, Mutant
from conformance.scenarios import Deadlines

DEADLINES = Deadlines(update_s=5.0, drain_s=10.0)
"""Shorter than a user's defaults: a mutant that deadlocks (``lora_reload_in_place``) hangs for this long."""

pytestmark = pytest.mark.cpu


def assert_killed(mutant: Mutant, record_property: Callable[[str, object], None], engine: str = "sglang") -> None:
    """The scenarios built to expose ``mutant`` run against it on the fake ``engine``; an expected checker itself
    fails, and every failing case has a witness."""
    name = mutant.name
    scenarios = list(mutant.shows_in)
    assert scenarios and set(scenarios) <= set(mutant.scenarios()), \
        f"{name} shows in {scenarios}, which must be checked for one of {mutant.kills}"
    results = run_cases(mutant.integration, fake_backend_factory(seed=0, engine=engine), scenarios=scenarios,
                        deadlines=DEADLINES)
    killers = mutant.killers(results)
    record_property("mutation", json.dumps({"mutant": name, "bug": mutant.bug,
                                            "killed_by": sorted({c for cases in killers.values() for c in cases})}))
    failed = sorted(f"{c}-{s}" for s, r in results.items() for c, v in r.verdicts.items() if v.status == "fail")
    assert killers, (f"mutant {name} ({mutant.bug}; {mutant.source}) survived: expected one of {sorted(mutant.kills)} "
                     f"to fail on its own; failed cases: {failed or 'none'}; the expected checks answered:\n"
                     + "\n".join(v.explain() for r in results.values() for c, v in r.verdicts.items()
                                  if invariants(c) & set(mutant.kills)))
    for scenario, r in results.items():
        for check, v in r.verdicts.items():
            assert v.status != "fail" or v.witness, f"{check}-{scenario} failed on {name} without a witness"


SLOW_ON_SGLANG = ("never_pauses",)
"""The SGLang mutants that take about 8 s (a cycle that never pauses has its first transfer held at the wire for the
hold's bound): in the slow tier."""


@pytest.mark.parametrize("name", [pytest.param(n, marks=pytest.mark.slow if n in SLOW_ON_SGLANG else ())
                                  for n in sorted(MUTANTS)])
def test_mutant_is_killed(name: str, record_property) -> None:
    assert_killed(MUTANTS[name], record_property)


QUICK_ON_VLLM = ("vllm_pause_default_abort", "vllm_drops_requests_on_update", "vllm_oldest_wrong")
"""The vLLM mutants that take about a second: every run; the others in the slow tier."""


@pytest.mark.parametrize("name", [pytest.param(n, marks=() if n in QUICK_ON_VLLM else pytest.mark.slow)
                                  for n in sorted(VLLM_MUTANTS)])
def test_vllm_mutant_is_killed_on_the_fake_vllm(name: str, record_property) -> None:
    """The reference on vLLM with one bug put back: killed by the same invariant as its SGLang twin."""
    assert_killed(VLLM_MUTANTS[name], record_property, engine="vllm")


def test_every_vllm_mutant_carries_a_bug_the_vllm_reference_does_not_have() -> None:
    """Each vLLM mutant differs from ``conformance.reference:vllm`` in one piece, and speaks vLLM."""
    from dataclasses import fields

    from conformance.reference import VllmEngineClient, vllm

    for mutant in VLLM_MUTANTS.values():
        integration = mutant.integration
        assert issubclass(integration.client_cls, VllmEngineClient), mutant.name
        differs = [f.name for f in fields(vllm) if f.name not in ("name", "capabilities")
                   and getattr(integration, f.name) != getattr(vllm, f.name)]
        assert differs or type(integration) is not type(vllm), f"{mutant.name} is the vLLM reference itself"
