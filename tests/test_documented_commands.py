"""Every documented backend command (``pytest -m gpu|sglang|vllm ...`` in the README and ``docs/``) collects what it
promises: its tests, and each conformance case exactly once where it names no path or the suite's. A command that
collects nothing (the cluster command once did: ``1215 deselected``, exit 5) cannot land again. The cluster commands
that name a report write it here too, every case skipped with one reason (no GPUs on this machine)."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from conformance.cases import CASES

pytestmark = [pytest.mark.cpu, pytest.mark.slow]
ROOT = Path(__file__).resolve().parents[1]
DOCUMENTS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
BACKEND_MARKERS = {"gpu", "sglang", "vllm"}
SUITE = "conformance/suite"
PROJECT_COMMAND = "pytest -m gpu --nodes 2"
"""How the project is known to its users (its design's cluster check), documented or not."""
COLLECTED = re.compile(r"^(?:(\d+)/)?(\d+) tests? collected|^no tests collected", re.MULTILINE)


def documented_commands() -> list[str]:
    """The ``pytest -m <backend marker>`` commands of the documents (code-block lines, continuations joined, comments
    dropped; inline code spans), and the project's own."""
    found: dict[str, None] = {PROJECT_COMMAND: None}
    for path in DOCUMENTS:
        text = path.read_text()
        blocks = re.findall(r"```[a-z]*\n(.*?)```", text, flags=re.DOTALL)
        lines = [re.sub(r"\s+#.*$", "", line) for block in blocks
                 for line in block.replace("\\\n", " ").splitlines()]
        prose = re.sub(r"```.*?```", "", text, flags=re.DOTALL).replace("\n", " ")
        for command in [*lines, *re.findall(r"`([^`]+)`", prose)]:
            command = " ".join(command.split())
            words = command.split()
            if words[:2] == ["pytest", "-m"] and len(words) > 2 and words[2] in BACKEND_MARKERS:
                found.setdefault(command, None)
    return list(found)


def runnable(command: str, *extra: str) -> list[str]:
    """``command`` as this interpreter's pytest, one process, no cache, plus ``extra``."""
    words, out = shlex.split(command)[1:], []
    skip = 0
    for word in words:
        if skip:
            skip -= 1
        elif word in ("-n", "--dist"):
            skip = 1
        else:
            out.append(word)
    return [sys.executable, "-m", "pytest", *out, "-p", "no:cacheprovider", *extra]


def paths_of(command: str) -> list[str]:
    return [w for w in shlex.split(command)[1:] if "/" in w and not w.startswith("-") and ":" not in w]


def environment() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "PYTEST_ADDOPTS", "PYTEST_XDIST_WORKER")}


def collect(command: str) -> tuple[str, subprocess.CompletedProcess[str]]:
    return command, subprocess.run(runnable(command, "--collect-only", "-q"), cwd=ROOT, env=environment(),
                                   capture_output=True, text=True, timeout=120)


def test_the_documents_name_the_backend_commands() -> None:
    commands = documented_commands()
    assert {c.split()[2] for c in commands} == BACKEND_MARKERS, commands
    assert any("--conformance-engine vllm" in c for c in commands if c.split()[2] == "gpu"), commands


def test_every_documented_backend_command_collects_its_tests_and_each_case_once() -> None:
    with ThreadPoolExecutor(max_workers=2) as pool:
        runs = list(pool.map(collect, documented_commands()))
    counts: dict[str, tuple[int, int]] = {}
    problems = []
    for command, run in runs:
        match = COLLECTED.search(run.stdout)
        selected = int(match.group(1) or match.group(2)) if match and match.group(2) else 0
        cases = sum("::test_case[" in line for line in run.stdout.splitlines())
        counts[command] = (selected, cases)
        if run.returncode != 0 or selected == 0:
            problems.append(f"{command!r} collects nothing (exit {run.returncode}):\n{run.stdout[-800:]}"
                            f"{run.stderr[-800:]}")
        elif not paths_of(command) or SUITE in paths_of(command):
            if cases != len(CASES):
                problems.append(f"{command!r} collects {cases} conformance cases, not each of the {len(CASES)} once")
    print("\n".join(f"{selected:>5} tests, {cases:>4} cases  {command}" for command, (selected, cases)
                    in counts.items()))
    assert not problems, "\n\n".join(problems)


def test_the_cluster_commands_write_their_report_here_every_case_skipped_with_one_reason(tmp_path: Path) -> None:
    """Without GPUs every case skips with one reason, and the report the command names is written (the Ray address
    of a cluster that is not here is left out; the report goes under ``tmp_path``)."""
    cluster = [c for c in documented_commands() if c.split()[2] == "gpu" and "--conformance-report" in c]
    assert cluster, "the README names a cluster command with its report"
    for i, command in enumerate(cluster):
        words = shlex.split(command)
        for option in ("--conformance-ray-address", "--conformance-report"):
            if option in words:
                del words[words.index(option):words.index(option) + 2]
        report = tmp_path / str(i) / "gpu.json"
        run = subprocess.run(runnable(shlex.join(words), "--conformance-report", str(report), "-rs"), cwd=ROOT,
                             env=environment(), capture_output=True, text=True, timeout=120)
        reasons = {line.split(": ", 1)[1] for line in run.stdout.splitlines() if line.startswith("SKIPPED [")}
        assert run.returncode == 0 and f"{len(CASES)} skipped" in run.stdout, run.stdout[-2000:] + run.stderr
        family = "vLLM" if "--conformance-engine vllm" in command else "SGLang"
        assert len(reasons) == 1 and f"-m gpu needs real {family} on GPUs" in reasons.pop(), reasons
        result = json.loads(report.read_text())
        assert len(result["cases"]) == len(CASES) and {c["status"] for c in result["cases"]} == {"skipped"}


@pytest.mark.parametrize(("options", "message"), [
    (["--nodes", "2", "--conformance-nodes", "3"], "--nodes 2 and --conformance-nodes 3 disagree: give one of them"),
    (["--conformance-simulated-cluster", "--conformance-ray-address", "127.0.0.1:6379"],
     "--conformance-simulated-cluster starts its own Ray cluster on this machine"),
])
def test_contradicting_cluster_options_are_a_usage_error(options: list[str], message: str) -> None:
    run = subprocess.run(runnable("pytest -m gpu", *options, "--collect-only", "-q"), cwd=ROOT, env=environment(),
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == pytest.ExitCode.USAGE_ERROR and message in run.stderr, run.stdout[-1000:] + run.stderr
