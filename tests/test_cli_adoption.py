"""The command line an adopter starts from: the adapter scaffold, the case ids, adopting known failures in one step,
and one-line errors for bad input."""

from __future__ import annotations

import contextlib
import dataclasses
from pathlib import Path

import pytest

from conformance.cases import CASES, fake_backend_factory, load_integration, run_cases
from conformance.cli import main
from conformance.interface import Capabilities
from conformance.scenarios import SCENARIOS

with contextlib.suppress(ImportError):  # lazily imported by the scenarios; a second import in one process fails
    import torch  # noqa: F401

pytestmark = pytest.mark.cpu
ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("style", ["--async", "--sync"])
def test_the_scaffold_runs_at_once_and_fails_every_case_with_what_to_implement(
        tmp_path: Path, style: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture) -> None:
    path = tmp_path / f"adapter_{style[2:]}.py"
    assert main(["new-adapter", str(path), style]) == 0
    assert f"--conformance-integration {path.stem}:integration" in capsys.readouterr().out
    source = path.read_text()
    block = source[source.index("CAPABILITIES = Capabilities("):source.index("\n)\n")]
    assert all(f"    {f.name}=" in block for f in dataclasses.fields(Capabilities))  # every capability spelled out
    assert "ReferenceManager" in source and "ReferenceUpdater" in source  # the reusable pieces are named
    monkeypatch.syspath_prepend(str(tmp_path))
    results = run_cases(load_integration(f"{path.stem}:integration"), fake_backend_factory())
    verdicts = {f"{check}-{name}": v for name, r in results.items() for check, v in r.verdicts.items()}
    skipped = {name: r.skipped for name, r in results.items() if r.skipped}
    assert all("does not declare capability" in why for why in skipped.values()), skipped  # only what it declares
    assert len(verdicts) == len(CASES) - sum(len(SCENARIOS[name].checks) for name in skipped) > 80
    for case_id, v in verdicts.items():  # every case that ran failed, saying what to implement
        assert not v.passed and any("implement Manager.start:" in w for w in v.witness), (case_id, v.witness[:3])


def test_the_scaffold_never_overwrites(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    path = tmp_path / "mine.py"
    path.write_text("# mine\n")
    assert main(["new-adapter", str(path)]) == 2
    assert "exists already" in capsys.readouterr().err and path.read_text() == "# mine\n"
    assert main(["new-adapter", str(tmp_path / "mine.txt")]) == 2


def test_list_cases_prints_every_id_with_its_scenario_and_invariant(capsys: pytest.CaptureFixture) -> None:
    assert main(["--list-cases"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.split()[0] for line in lines] == [c.id for c in CASES]
    assert "V4-S1-failover scenario=failover invariant=V4-S1" in [" ".join(line.split()) for line in lines]


@pytest.mark.parametrize("args", [["--out", "/proc/no-such-dir/results"], ["--expectations", "/no/such.toml"],
                                  ["--engine", "vllm", "--profiles", "all"], ["--engine", "tgi"]])
def test_bad_paths_are_one_line_errors(args: list[str], capsys: pytest.CaptureFixture) -> None:
    assert main(args) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("python -m conformance: error: ") and "\n" not in err and "Traceback" not in err


@pytest.mark.slow
def test_write_expectations_adopts_in_one_step_and_the_next_run_is_green(
        tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """A failing run writes the file (every failing case, reason TODO); the same run with it passes. (In this
    process, as ``python -m conformance`` runs pytest in its own.)"""
    listed = tmp_path / "conformance-expectations.toml"
    base = ["--integration", "conformance.mutants:lora_unstamped"]
    pytest_args = ["--", "-k", "V1-lora-fake or I3-lora-fake", "-p", "no:cacheprovider", "-p", "no:xdist"]
    assert main([*base, "--out", str(tmp_path / "a"), "--write-expectations", str(listed), *pytest_args]) == 1
    assert "1 failing case(s) written" in capsys.readouterr().out
    assert 'case = "V1-lora"\nreason = "TODO"' in listed.read_text()
    assert main([*base, "--out", str(tmp_path / "b"), "--expectations", str(listed), *pytest_args]) == 0
    out = capsys.readouterr().out
    assert "1 passed" in out and "1 xfailed" in out
    assert "## Expected failures" in (tmp_path / "b" / "conformance-result.md").read_text()
