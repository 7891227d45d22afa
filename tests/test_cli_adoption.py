"""The command line an adopter starts from: the adapter scaffold, the case ids, adopting known failures in one step,
and one-line errors for bad input."""

from __future__ import annotations

import contextlib
import dataclasses
import json
from pathlib import Path

import pytest

from conformance.backends import FakeBackend
from conformance.cases import CASES, fake_backend_factory, load_integration, run_cases
from conformance.cli import main
from conformance.interface import Capabilities
from conformance.scenarios import SCENARIOS
from conformance.situations.registry import SITUATIONS

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
    cannot = {s.why_not(FakeBackend()) for s in SITUATIONS.values()} - {None}  # what the fake SGLang cannot build
    assert all("does not declare capability" in why or why in cannot for why in skipped.values()), skipped
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


class FakePytest:
    """Stands in for ``pytest.main``: keeps the arguments, writes ``result`` (when set) where the report goes, and
    exits with ``code``."""

    def __init__(self, code: int = 0, result: dict | None = None) -> None:
        self.code, self.result, self.args = code, result, []

    def __call__(self, args: list[str]) -> int:
        self.args = list(args)
        report = next(a.split("=", 1)[1] for a in args if a.startswith("--conformance-report="))
        if self.result is not None:
            Path(report).write_text(json.dumps(self.result))
        return self.code


def test_pytest_arguments_after_the_separator_reach_pytest_as_options(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``-q -- -k NAME``: argparse keeps the ``--`` after the unknown ``-q``; passed on, pytest took ``-k`` and NAME
    for paths (``module or package not found: -k``) and the result was empty."""
    fake = FakePytest()
    monkeypatch.setattr("conformance.cli.pytest.main", fake)
    assert main(["-q", "--out", str(tmp_path), "--", "-k", "V1-lora", "-m", "gpu"]) == 0
    assert "--" not in fake.args and fake.args[-5:] == ["-q", "-k", "V1-lora", "-m", "gpu"]


@pytest.mark.parametrize(("code", "says"), [
    (5, "the pytest arguments ['-k', 'V1-lroa'] with -m cpu selected no case, so "),
    (4, "pytest refused its arguments ['-k', 'V1-lroa'] (its error is above), so no case ran and "),
])
def test_a_run_that_judges_no_case_is_an_error_that_says_what_to_give(
        code: int, says: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture) -> None:
    monkeypatch.setattr("conformance.cli.pytest.main", FakePytest(code, {"cases": [], "preflight": []}))
    listed = tmp_path / "conformance-expectations.toml"
    assert main(["--out", str(tmp_path), "--write-expectations", str(listed), "--", "-k", "V1-lroa"]) == code
    out, err = capsys.readouterr()
    # one line of its own (stderr is the process's: a thread an earlier test of this worker left may write there)
    (line,) = [line for line in err.splitlines() if line.startswith("python -m conformance: error: ")]
    assert line.startswith(f"python -m conformance: error: {says}"), err
    assert line.endswith(f"; {listed} was not written") and not listed.exists(), err
    assert "conformance result:" not in out


def test_written_expectations_leave_out_the_cases_no_entry_excuses(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture) -> None:
    """A fail is an [[xfail]] entry, an unknown an [[unknown]] one; an error or a broken run has no verdict of its
    own, which a strict entry never matches: listed, the next run fails on it, so it is named instead."""
    def case(case_id: str, status: str, **details: object) -> dict:
        return {"case": case_id, "backend": "fake", "status": status, "witness": ["why"], "details": details}

    cases = [case("V1-lora", "fail"), case("S2-mixed-versions", "unknown"), case("I3-lora", "error"),
             case("V2-lora", "fail", run_broke=True)]
    monkeypatch.setattr("conformance.cli.pytest.main", FakePytest(1, {"cases": cases, "preflight": []}))
    listed = tmp_path / "conformance-expectations.toml"
    assert main(["--out", str(tmp_path), "--write-expectations", str(listed)]) == 1
    out, err = capsys.readouterr()
    assert "1 failing case(s) written as [[xfail]] and 1 unknown as [[unknown]]" in out
    assert err.startswith("expectations: 2 case(s) not written, as no entry excuses a run that broke or raised") \
        and err.strip().endswith(": I3-lora, V2-lora")
    text = listed.read_text()
    assert '[[xfail]]\ncase = "V1-lora"' in text and '[[unknown]]\ncase = "S2-mixed-versions"' in text
    assert "I3-lora" not in text and "V2-lora" not in text


@pytest.mark.slow
def test_a_k_selection_after_the_separator_runs_the_selected_case(
        tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """The issue's command, for real: ``python -m conformance -q -- -k NAME`` runs NAME."""
    args = ["-q", "--out", str(tmp_path), "--", "-k", "V3-first-drain-fake", "-p", "no:cacheprovider", "-p", "no:xdist"]
    assert main(args) == 0
    assert [c["case"] for c in json.loads((tmp_path / "conformance-result.json").read_text())["cases"]] == \
        ["V3-first-drain"]


@pytest.mark.slow
def test_written_expectations_make_a_design_with_an_impossible_situation_green(
        tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """version_bump_aborts fails I1-I2 and never lets S2's situation arise (every spanning group is dropped): the
    file lists the one as [[xfail]], the other as [[unknown]], and the next run with it passes."""
    listed = tmp_path / "conformance-expectations.toml"
    base = ["--integration", "conformance.mutants:version_bump_aborts"]
    pytest_args = ["--", "-k", "mixed-versions-fake", "-p", "no:cacheprovider", "-p", "no:xdist"]
    assert main([*base, "--out", str(tmp_path / "a"), "--write-expectations", str(listed), *pytest_args]) == 1
    assert "1 failing case(s) written as [[xfail]] and 1 unknown as [[unknown]]" in capsys.readouterr().out
    text = listed.read_text()
    assert '[[xfail]]\ncase = "I1-I2-mixed-versions"' in text and '[[unknown]]\ncase = "S2-mixed-versions"' in text
    assert main([*base, "--out", str(tmp_path / "b"), "--expectations", str(listed), *pytest_args]) == 0
    out = capsys.readouterr().out
    assert "2 xfailed" in out and "failed" not in out.replace("xfailed", "")
    cases = {c["case"]: c for c in json.loads((tmp_path / "b" / "conformance-result.json").read_text())["cases"]}
    assert cases["S2-mixed-versions"]["expected"]["outcome"] == "expected-unknown"
    assert "## Known unknowns" in (tmp_path / "b" / "conformance-result.md").read_text()
