"""The benchmarks (benchmarks/*.py) still run: each one's --quick mode, as a subprocess with a deadline, prints its
table and its headline figures. No performance number is asserted (machines differ); only that they are there."""

from __future__ import annotations

import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = [pytest.mark.cpu, pytest.mark.slow]

REPO = Path(__file__).resolve().parent.parent
DEADLINE_S = 45.0  # per benchmark; a quick run takes a few seconds
NUMBER = r"([0-9][0-9,]*(?:\.[0-9]+)?)"

# benchmark -> patterns its quick output must contain (each NUMBER group must parse as a positive number)
EXPECTED = {
    "decode_throughput": [
        r"\| FakeEngine, 1000 in flight\s*\|",
        r"\| baseline: FakeEngine, 1 in flight\s*\|",
        r"\| baseline: bare loop",
        rf"token-steps/s with 1000 in flight: {NUMBER}; vs 1 in flight: x{NUMBER}; vs bare loop: {NUMBER}",
    ],
    "loopback_roundtrips": [
        r"\| process\s*\|\s*aiohttp\s*\|",
        rf"fake /generate \(process \+ aiohttp\): {NUMBER} round trips/s, ratio to hello-world {NUMBER}",
    ],
    "proxy_overhead": [
        r"\| through the recording proxy\s*\|",
        rf"proxied /generate: {NUMBER} round trips/s, ratio to direct {NUMBER}",
    ],
    "verdict_determinism": [
        r"\| version_bump_aborts\s*\|",
        rf"mutants killed in every run: {NUMBER}/{NUMBER} mutant-runs; reference passed {NUMBER}/{NUMBER} runs",
    ],
    "replay_scale": [
        r"\| reference, \d+ engines, [\d,]+ in flight \(baseline\)\s*\|",
        r"\| seed-000 bug, \d+ engines",
        rf"baseline: {NUMBER} simulated h in {NUMBER} s wall \({NUMBER} s CPU\): {NUMBER} simulated s per wall s",
    ],
    "memory_per_request": [
        r"\| baseline: empty engine",
        rf"bytes/request: parked {NUMBER}, decoding {NUMBER} \(~{NUMBER} B/token\)",
    ],
}


def _run_all_quick() -> dict[str, tuple[int, str, float]]:
    """Start every quick benchmark at once (they are independent); wait for each with a deadline."""
    procs = {
        name: (subprocess.Popen([sys.executable, str(REPO / "benchmarks" / f"{name}.py"), "--quick"], cwd=REPO,
                                stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                text=True), time.monotonic())
        for name in EXPECTED
    }
    results: dict[str, tuple[int, str, float]] = {}
    try:
        for name, (proc, started) in procs.items():
            left = max(1.0, DEADLINE_S - (time.monotonic() - started))
            try:
                out, _ = proc.communicate(timeout=left)
            except subprocess.TimeoutExpired:
                proc.kill()
                out, _ = proc.communicate(timeout=10)
                results[name] = (-9, f"timed out after {DEADLINE_S} s\n{out}", DEADLINE_S)
                continue
            results[name] = (proc.returncode, out, time.monotonic() - started)
    finally:
        for proc, _ in procs.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait(10)
    return results


def _problems(name: str, code: int, out: str) -> list[str]:
    if code != 0:
        return [f"{name} --quick exited {code}:\n{out[-3000:]}"]
    problems = []
    if "total time:" not in out:
        problems.append(f"{name}: no 'total time:' line")
    for pattern in EXPECTED[name]:
        match = re.search(pattern, out)
        if match is None:
            problems.append(f"{name}: no {pattern!r} in:\n{out}")
            continue
        problems += [f"{name}: non-positive figure in {match.group(0)!r}"
                     for number in match.groups() if not float(number.replace(",", "")) > 0]
    return problems


def test_every_benchmark_quick_mode_prints_its_figures() -> None:
    """One test for all three (run concurrently): under pytest-xdist they are not spread and run twice."""
    results = _run_all_quick()
    problems = [p for name, (code, out, _) in results.items() for p in _problems(name, code, out)]
    for name, (_, out, seconds) in results.items():
        print(f"--- {name} --quick: {seconds:.1f} s\n{out}")
    assert not problems, "\n\n".join(problems)
