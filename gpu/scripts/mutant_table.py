"""The mutant × backend table: every mutant of the reference on the fake and on real SGLang on CPU, per release.

    python gpu/scripts/mutant_table.py --backend fake --backend RELEASE --reference --record gpu/scripts/mutant-table.json
    python gpu/scripts/mutant_table.py --record gpu/scripts/mutant-table.json --print            # the table only

Each mutant runs on the scenarios built to expose it (``Mutant.shows_in``), as ``tests/test_mutants.py`` runs it
(:func:`gpu.mutation.run_mutant`): a cell names the checks that killed it, ``SURVIVED`` (a defect), ``skipped``
with the reason (a scenario real SGLang on CPU cannot run) or ``broke`` with the error. A real release's mutants
share one pair of engines, reset between scenarios (:mod:`gpu.pool`), from the release's environment
(``python -m gpu.sglang_cpu install --release V``); RELEASE is one of ``fakes.facts.SGLANG.cpu_releases``
(``--help`` lists them). With ``--reference`` the reference runs every scenario first
(its cases must all pass). The record is one run of one commit: every column it holds was measured by the command
that wrote it, at the commit it names (``dirty`` when a source file had changes); a new run replaces it, never merges.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from conformance.cases import fake_backend_factory, run_one  # noqa: E402
from conformance.mutants import MUTANTS  # noqa: E402
from fakes.facts import SGLANG  # noqa: E402
from conformance.scenarios import DEADLINES, SCENARIOS  # noqa: E402
from gpu.mutation import run_mutant  # noqa: E402

COLUMNS = ("fake", *SGLANG.cpu_releases)


def measure(backend: str, names: list[str], reference: bool, seed: int) -> dict[str, Any]:
    """One column: each mutant's outcome on ``backend`` (``fake`` or a real release)."""
    from gpu.sglang_setup import SglangSetup

    t0 = time.monotonic()
    suite = None if backend == "fake" else SglangSetup(release=backend, seed=seed)
    if suite is not None and suite.skip_reason():
        raise SystemExit(f"mutant_table: {suite.skip_reason()}")
    factory = fake_backend_factory(seed=seed) if suite is None else suite.backend_factory()
    why_not = (lambda s: None) if suite is None else suite.why_not
    column: dict[str, Any] = {"cells": {}, "killers": {}}
    try:
        deadlines = DEADLINES if suite is None else suite.deadlines()
        column["deadline_scale"] = round(deadlines.update_s / DEADLINES.update_s, 2)
        if reference:
            column["reference"] = run_reference(factory, why_not, seed, deadlines)
            print(f"{backend}: reference {column['reference']['summary']}", flush=True)
        for name in names:
            outcome = run_mutant(MUTANTS[name], factory, why_not=why_not, seed=seed,
                                 deadlines=deadlines)
            column["cells"][name], column["killers"][name] = outcome.cell(), outcome.killers
            print(f"{backend}: {name}: {outcome.cell()}", flush=True)
    finally:
        if suite is not None:
            column["engines"] = suite.summary()
            suite.close()
    column["wall_s"] = round(time.monotonic() - t0, 1)
    column["measured_at"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    return column


def run_reference(factory: Any, why_not: Any, seed: int, deadlines: Any) -> dict[str, Any]:
    """The reference on every scenario: cases passed / failed / skipped, and which failed."""
    from conformance import DEFAULT_INTEGRATION
    from conformance.cases import load_integration

    integration = load_integration(DEFAULT_INTEGRATION)
    t0, counts, failed = time.monotonic(), {"passed": 0, "failed": 0, "skipped": 0}, []
    for scenario in SCENARIOS.values():
        if why_not(scenario.name):
            counts["skipped"] += len(scenario.checks)
            continue
        try:
            result = run_one(scenario.name, integration, factory, seed, deadlines)
        except Exception as exc:
            counts["failed"] += len(scenario.checks)
            failed.append(f"{scenario.name}: {type(exc).__name__}: {str(exc)[:300]}")
            print(f"  broke: {failed[-1]}", flush=True)
            continue
        for check in scenario.checks:
            v = result.verdicts.get(check)
            if result.skip_reason(check):
                counts["skipped"] += 1
            elif v is not None and v.passed:
                counts["passed"] += 1
            else:
                counts["failed"] += 1
                failed.append(f"{check}-{scenario.name}: {v.status if v else 'error'}"
                              + (f" ({' / '.join(v.witness[:3])[:300]})" if v and v.witness else ""))
                print(f"  failed: {failed[-1]}", flush=True)
    summary = f"{counts['passed']} passed, {counts['failed']} failed, {counts['skipped']} skipped " \
              f"in {time.monotonic() - t0:.0f}s"
    return {**counts, "failed_cases": failed, "summary": summary}


def table(record: dict[str, Any]) -> str:
    """The Markdown table of every column in ``record`` (``–``: not measured yet)."""
    cols = [c for c in COLUMNS if c in record] + [c for c in record if c not in COLUMNS]
    heads = ["fake" if c == "fake" else f"real {c}" for c in cols]
    lines = ["| mutant | expected | " + " | ".join(heads) + " |", "|---|---|" + "---|" * len(cols)]
    for name in sorted(MUTANTS):
        cells = [record[c]["cells"].get(name, "–") for c in cols]
        lines.append(f"| `{name}` | {', '.join(MUTANTS[name].kills)} | " + " | ".join(cells) + " |")
    refs = [record[c].get("reference", {}).get("summary", "–") for c in cols]
    lines.append("| *reference, every scenario* | all pass | " + " | ".join(refs) + " |")
    return "\n".join(lines)


def _commit() -> str:
    """The commit measured (``+dirty`` when the work tree differs from it)."""
    root = Path(__file__).resolve().parents[2]

    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=root, capture_output=True, text=True, check=False).stdout.strip()
    changed = [line for line in git("status", "--porcelain", "--untracked-files=no").splitlines()
               if line.endswith(".py")]  # the code measured (not a record or a list being rewritten meanwhile)
    return git("rev-parse", "--short=12", "HEAD") + ("+dirty" if changed else "")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--backend", action="append", default=[], metavar="fake|RELEASE",
                        help=f"a column to measure ({', '.join(COLUMNS)}); repeatable")
    parser.add_argument("--mutants", default=None, help="comma-separated mutant names (default: all)")
    parser.add_argument("--reference", action="store_true", help="also run the reference on every scenario")
    parser.add_argument("--record", type=Path, default=None, help="JSON file that keeps the columns measured")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--print", action="store_true", help="print the recorded table and measure nothing")
    args = parser.parse_args(argv)
    names = sorted(MUTANTS) if not args.mutants else args.mutants.split(",")
    unknown = [n for n in names if n not in MUTANTS] + [b for b in args.backend if b not in COLUMNS]
    if unknown:
        print(f"mutant_table: unknown {unknown}; mutants: {', '.join(sorted(MUTANTS))}; backends: "
              f"{', '.join(COLUMNS)}", file=sys.stderr)
        return 2
    if args.print:
        if not args.record or not args.record.exists():
            print("mutant_table: --print needs an existing --record", file=sys.stderr)
            return 2
        run = json.loads(args.record.read_text())
    else:
        if not args.backend:
            print("mutant_table: give --backend (or --print with --record)", file=sys.stderr)
            return 2
        run = {"commit": _commit(), "command": " ".join(["python", "gpu/scripts/mutant_table.py", *(argv or sys.argv[1:])]),
               "columns": {}}
        for backend in args.backend:
            run["columns"][backend] = measure(backend, names, args.reference, args.seed)
            if args.record:
                args.record.write_text(json.dumps(run, indent=1) + "\n")
    record = run["columns"]
    print(f"one run at {run['commit']}: {run['command']}")
    print(table(record))
    survived = [f"{c}: {n}" for c, col in record.items() for n, cell in col["cells"].items()
                if cell.startswith(("SURVIVED", "broke"))]
    if survived:
        print(f"\nnot killed: {', '.join(survived)}", file=sys.stderr)
    return 1 if survived else 0


if __name__ == "__main__":
    sys.exit(main())
