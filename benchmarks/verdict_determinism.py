"""Verdict determinism: every mutant, N times, through the scenarios checked for the invariants it breaks; the
reference, N times, through every scenario. A suite whose verdicts rest on timing kills a mutant in some runs
only; here every mutant must be killed by its own checker in every run and the reference must pass every run.

    python benchmarks/verdict_determinism.py [--runs 10] [--quick] [--engine vllm] [--shown]
    python benchmarks/verdict_determinism.py --engine vllm --no-mutants --integrations MODULE:ATTR [MODULE:ATTR ...]

Prints, per mutant, the kill rate of each invariant it breaks (killed runs / runs; a case that failed only because
the run broke does not count as a kill), then the reference's pass rate, then the totals. ``--engine vllm``: the vLLM
mutants and the reference on vLLM, on the fake vLLM; ``--shown``: each mutant through the scenarios built to expose
it only (``Mutant.shows_in``, what ``tests/test_mutants.py`` runs); ``--integrations``: these correct integrations
instead of the reference (each must pass every case of every run: a case that is not a pass is a false alarm, counted
by case); ``--no-mutants``: the integrations only.
"""

from __future__ import annotations

import logging
import sys
import time
from collections import Counter

from _bench import emit, machine, parser, table

from conformance.cases import fake_backend_factory, load_integration, run_cases
from conformance.families import DEFAULT_FAMILY, FAMILIES, family
from conformance.mutants import MUTANTS, VLLM_MUTANTS
from conformance.scenarios import Deadlines

DEADLINES = Deadlines(update_s=5.0, drain_s=10.0)
QUICK = {"sglang": (("version_bump_aborts",), ["steady-tensor-retract"]),
         "vllm": (("vllm_pause_default_abort",), ["steady-disk-in_place"])}
"""--quick, per engine: one mutant and the reference, through one scenario each (a smoke test of the script)."""


def main() -> int:
    p = parser(__doc__.splitlines()[0])
    p.add_argument("--runs", type=int, default=10, help="runs per mutant and of the reference (default 10)")
    p.add_argument("--mutants", nargs="+", choices=sorted([*MUTANTS, *VLLM_MUTANTS]), metavar="NAME",
                   help="only these mutants (default: every one of the engine's)")
    p.add_argument("--engine", choices=list(FAMILIES), default=DEFAULT_FAMILY, help="the fake engines' family")
    p.add_argument("--shown", action="store_true", help="each mutant through its shows_in scenarios only")
    p.add_argument("--integrations", nargs="+", metavar="SPEC",
                   help="correct integrations (module:attr) judged instead of the reference, every case of every run")
    p.add_argument("--no-mutants", action="store_true", help="the integrations only")
    args = p.parse_args()
    runs = 1 if args.quick else args.runs
    logging.disable(logging.WARNING)  # the mutants log the bugs they commit; the table says what happened
    table_of = family(args.engine).load_mutants()
    quick_mutants, quick_scenarios = QUICK[args.engine]
    names = [] if args.no_mutants else list(quick_mutants) if args.quick else sorted(args.mutants or table_of)
    emit(f"# verdict determinism ({runs} run(s) each; engine {args.engine}; {machine()})")
    started = time.perf_counter()
    rows, survived = [], 0
    for name in names:
        mutant = table_of[name]
        kills = {inv: 0 for inv in mutant.kills}
        t0 = time.perf_counter()
        for seed in range(runs):
            scenarios = list(mutant.shows_in) if args.quick or args.shown else mutant.scenarios()
            killers = mutant.killers(run_cases(mutant.integration, fake_backend_factory(seed=seed, engine=args.engine),
                                               seed, scenarios, deadlines=DEADLINES))
            for inv in killers:
                kills[inv] += 1
            survived += not killers
        rows.append([name, ", ".join(f"{inv} {n}/{runs}" for inv, n in kills.items()),
                     f"{max(kills.values())}/{runs}", (time.perf_counter() - t0) / runs])
    if names:
        emit(table("mutants: kill rate per invariant it breaks", ["mutant", "per invariant", "killed", "s/run"], rows))
    specs = args.integrations or [family(args.engine).reference]
    rows, passed = [], 0
    for spec in specs:
        integration, ok, t0 = load_integration(spec), 0, time.perf_counter()
        judged, bad = 0, Counter()
        for seed in range(runs):
            results = run_cases(integration, fake_backend_factory(seed=seed, engine=args.engine), seed,
                                quick_scenarios if args.quick else None)
            verdicts = {f"{c}-{s}": v for s, r in results.items() for c, v in r.verdicts.items()}
            judged += len(verdicts)
            bad.update(f"{case} {v.status}" for case, v in verdicts.items() if not v.passed)
            ok += all(v.passed for v in verdicts.values())
        passed += ok
        rows.append([spec, f"{ok}/{runs}", judged // max(runs, 1),
                     ", ".join(f"{case} ×{n}" for case, n in sorted(bad.items())) or "none",
                     (time.perf_counter() - t0) / runs])
    emit(table("correct integrations: every case of " + ("one scenario" if args.quick else "every scenario"),
               ["integration", "runs passed", "cases/run", "not passed (case × runs)", "s/run"], rows))
    emit(f"\nmutants killed in every run: {len(names) * runs - survived}/{len(names) * runs} mutant-runs; "
         f"{'integrations' if args.integrations else 'reference'} passed {passed}/{runs * len(specs)} runs")
    emit(f"total time: {time.perf_counter() - started:.1f} s")
    return 0 if survived == 0 and passed == runs * len(specs) else 1


if __name__ == "__main__":
    sys.exit(main())
