"""How long a framework author waits: the main job and the README's test command, against the last release.

    python benchmarks/suite_speed.py [--quick] [--skip-tests]

Times, each as a fresh subprocess from the repository root:

- the main job, ``python -m conformance --out <tmp>`` (the conformance suite on the fake backend, report written);
- the README's test command, ``pytest -m "cpu and not slow" -n 6 --dist loadgroup`` (``--quick``: the suite's own check tests only;
  ``--skip-tests``: not at all);
- a baseline in the same run: every scenario of the main job back to back in one process (``run_one``, no pytest),
  the floor set by the scenarios' own waits.

Prints a table with each figure, its ratio to the baseline and to the last release's figure (:data:`RELEASE_0_1_0`,
measured with the same commands on this project's 2-core CI machine), then ``total time: … s``.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time

from _bench import REPO, machine, parser

RELEASE_0_1_0 = {"main job": 24.0, "README test command": 86.0}
"""Seconds, weightsync-conformance 0.1.0 on the 2-core CI machine (main job: 108 cases; tests: 1,015 with -n 3)."""

TEST_COMMAND = ["-m", "pytest", "-m", "cpu and not slow", "-n", "6", "--dist", "loadgroup", "-q",
                "-p", "no:cacheprovider"]
QUICK_TESTS = ["-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/test_check_registry.py"]
DEADLINE_S = 600.0


def timed(args: list[str], what: str) -> float:
    """Run ``python args`` from the repository root; its wall time (it must exit 0 within the deadline)."""
    t0 = time.perf_counter()
    done = subprocess.run([sys.executable, *args], cwd=REPO, capture_output=True, text=True, timeout=DEADLINE_S,
                          env={**os.environ, "PYTHONPATH": str(REPO)})
    wall = time.perf_counter() - t0
    if done.returncode != 0:
        sys.exit(f"{what} exited {done.returncode}:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
    return wall


def scenarios_back_to_back() -> float:
    """The baseline: the reference on every scenario, one after the other, in this process."""
    from conformance import DEFAULT_INTEGRATION
    from conformance.cases import fake_backend_factory, load_integration, run_one
    from conformance.scenarios import SCENARIOS

    integration = load_integration(DEFAULT_INTEGRATION)
    t0 = time.perf_counter()
    for name in SCENARIOS:
        run_one(name, integration, fake_backend_factory())
    return time.perf_counter() - t0


def main() -> None:
    p = parser(__doc__.split("\n")[0])
    p.add_argument("--skip-tests", action="store_true", help="time the main job only")
    args = p.parse_args()
    t_start = time.perf_counter()
    baseline = scenarios_back_to_back()
    with tempfile.TemporaryDirectory() as out:
        rows = {"main job": timed(["-m", "conformance", "--out", out], "the main job")}
    if not args.skip_tests:
        label = "README test command" if not args.quick else "tests (quick: the check registry's)"
        rows[label] = timed(QUICK_TESTS if args.quick else TEST_COMMAND, label)
    print(f"machine: {machine()}\n")
    print("| run | wall s | ratio to scenarios back to back | ratio to 0.1.0 |")
    print("|---|---:|---:|---:|")
    print(f"| baseline: scenarios back to back (no pytest) | {baseline:.1f} | 1.00 | |")
    for what, wall in rows.items():
        release = RELEASE_0_1_0.get(what)
        print(f"| {what} | {wall:.1f} | {wall / baseline:.2f} | {f'{wall / release:.2f}' if release else ''} |")
    main_job = rows["main job"]
    print(f"\nmain job: {main_job:.1f} s; ratio to 0.1.0 ({RELEASE_0_1_0['main job']:.0f} s): "
          f"{main_job / RELEASE_0_1_0['main job']:.2f}; to scenarios back to back: {main_job / baseline:.2f}")
    print(f"total time: {time.perf_counter() - t_start:.1f} s")


if __name__ == "__main__":
    main()
