"""Whether a mutant of the reference is killed on a backend: the same proof as ``tests/test_mutants.py``, on any
backend factory (the fake, or real SGLang's shared engines).

A mutant is *killed* when, on the scenarios built to expose it (``Mutant.shows_in``), the checker of an invariant
it breaks itself fails (not merely the run breaking: ``Mutant.killers``). A scenario the backend cannot run is
*skipped* with its reason, never counted as a kill or a pass; a scenario whose backend broke (an engine lost, a
reset that failed) is *broke* with the error.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

from conformance.cases import BackendFactory, ScenarioResult, run_one
from conformance.mutants import Mutant, invariants
from conformance.scenarios import DEADLINES, Deadlines


@dataclass
class MutantOutcome:
    """One mutant on one backend."""

    mutant: str
    status: str
    """``killed``, ``survived``, ``skipped`` or ``broke``."""
    checks: list[str] = field(default_factory=list)
    """The checks that killed it (``C2``, ``I1-I2``)."""
    killers: list[str] = field(default_factory=list)
    """The cases whose checker failed on it (``<check>-<scenario>``)."""
    reason: str = ""
    failed_without_witness: list[str] = field(default_factory=list)

    def cell(self) -> str:
        """The table cell: ``C2`` (the checkers that killed it), ``SURVIVED``, ``skipped: …``, ``broke: …``."""
        if self.status == "killed":
            return ", ".join(self.checks)
        if self.status == "survived":
            return "SURVIVED"
        return f"{self.status}: {self.reason.splitlines()[0][:90]}"


def run_mutant(mutant: Mutant, factory: BackendFactory, *,
               why_not: Callable[[str], str | None] = lambda s: None, seed: int = 0,
               deadlines: Deadlines = DEADLINES) -> MutantOutcome:
    """Run ``mutant`` on its ``shows_in`` scenarios, one after another, on ``factory``'s backends (a scenario again,
    up to :data:`UNKNOWN_TRIES` seeds, while its killing checks all answer ``unknown``)."""
    results: dict[str, ScenarioResult] = {}
    skipped: list[str] = []
    unshown: list[str] = []  # runs whose killing checks all answered unknown: the situation did not happen

    def aimed(check: str) -> bool:  # a check of an invariant the mutant breaks
        return bool(invariants(check) & set(mutant.kills))

    for scenario in mutant.shows_in:
        reason = why_not(scenario)
        if reason:
            skipped.append(f"{scenario}: {reason}")
            continue
        for attempt in range(UNKNOWN_TRIES):
            try:
                results[scenario] = run_one(scenario, mutant.integration, factory, seed + attempt, deadlines)
            except Exception as exc:  # the backend broke: say so, never a kill
                return MutantOutcome(mutant.name, "broke", reason=f"{scenario}: {type(exc).__name__}: {exc}")
            if results[scenario].skipped:  # the backend cannot build it (an engine restart on real engines)
                skipped.append(f"{scenario}: {results.pop(scenario).skipped}")
                break
            expected = [v.checker_status for c, v in results[scenario].verdicts.items() if aimed(c)]
            if not expected or any(status != "unknown" for status in expected):
                break
            unshown.append(f"{scenario} seed {seed + attempt}")
    killers = sorted({c for cases in mutant.killers(results).values() for c in cases})
    checks = sorted({c for r in results.values() for c, v in r.verdicts.items()
                     if v.checker_status == "fail" and aimed(c)})
    bare = sorted(f"{c}-{s}" for s, r in results.items() for c, v in r.verdicts.items()
                  if v.status == "fail" and not v.witness)
    if killers:
        return MutantOutcome(mutant.name, "killed", checks, killers, failed_without_witness=bare,
                             reason=f"after unknown on {', '.join(unshown)}" if unshown else "")
    if skipped and not results:
        return MutantOutcome(mutant.name, "skipped", reason="; ".join(skipped))
    answered = [f"{c}-{s} {v.checker_status} ({v.witness[0] if v.witness else v.metrics})"
                for s, r in results.items() for c, v in r.verdicts.items() if aimed(c)]
    return MutantOutcome(mutant.name, "survived", failed_without_witness=bare,
                         reason="; ".join([*skipped, *(f"unknown on {u}" for u in unshown), *answered])
                         or "no expected checker failed")


UNKNOWN_TRIES = 3
"""Runs of one scenario (seeds ``seed``, ``seed + 1``, …) while every check that kills the mutant answers
``unknown`` there: the situation did not happen (a real engine under load finished what the suite meant to abort),
which proves nothing either way, so the scenario is run again, and the tries are named in the outcome."""


SHARE_ENV = "WEIGHTSYNC_MUTANT_SHARE"
"""``K/N``: run only share ``K`` of ``N`` of the mutants on a real engine (CI rotates ``K`` by commit count, so every
mutant runs at least once every ``N`` commits); unset: all of them."""


def mutant_share(names: list[str], spec: str | None) -> list[str]:
    """Share ``K/N`` of ``names`` (every ``N``-th, from the ``K``-th: the shares partition ``names``); all of them
    when ``spec`` is empty."""
    if not spec:
        return names
    k, sep, n = spec.partition("/")
    if not (sep and k.isdigit() and n.isdigit() and 0 <= int(k) < int(n)):
        raise ValueError(f"{SHARE_ENV}={spec!r}: expected K/N with 0 <= K < N (e.g. 1/3: the second third of the "
                         f"mutants)")
    return names[int(k)::int(n)]
