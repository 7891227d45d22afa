"""The expectations file as pure logic: parsing, globs, closest ids, strict-xfail judgements, the written file."""

from __future__ import annotations

from pathlib import Path

import pytest

from conformance.cases import CASES
from conformance.expectations import ExpectationsError, load_expectations, render_expectations

pytestmark = pytest.mark.cpu
KNOWN = [c.id for c in CASES]


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "conformance-expectations.toml"
    path.write_text(text)
    return path


def test_an_exact_id_beats_a_glob_and_a_glob_names_a_whole_scenario(tmp_path: Path) -> None:
    ex = load_expectations(write(tmp_path, '''
[[xfail]]
case = "*-failover"
reason = "our failover restarts at 0, #12"

[[xfail]]
case = "V1-failover"
reason = "labels, #13"
link = "https://example.org/13"
'''), KNOWN)
    assert ex.lookup("V1-failover").reason == "labels, #13"
    assert ex.lookup("I3-failover").reason.endswith("#12")
    assert ex.lookup("V1-lora") is None
    assert ex.lookup("V1-failover").describe() == "labels, #13 (https://example.org/13)"


def test_a_backend_entry_applies_to_that_backend_only(tmp_path: Path) -> None:
    ex = load_expectations(write(tmp_path, '[[xfail]]\ncase = "V1-lora"\nreason = "r"\nbackend = "gpu"\n'), KNOWN)
    assert ex.lookup("V1-lora", "gpu") is not None
    assert ex.lookup("V1-lora", "fake") is None


@pytest.mark.parametrize(("text", "fix"), [
    ('[[xfail]]\ncase = "V1-lroa"\nreason = "r"\n', "'V1-lroa' matches no case of the suite; closest: V1-lora"),
    ('[[xfail]]\ncase = "Z9-*"\nreason = "r"\n', "'Z9-*' matches no case of the suite"),
    ('[[xfail]]\ncase = "V1-lora"\n', "'reason' must say why it fails"),
    ('[[xfail]]\ncase = "V1-lora"\nreason = "r"\nissue = 3\n', "unknown key(s) ['issue']"),
    ('[[xfail]]\ncase = "V1-lora"\nreason = "r"\nbackend = "tpu"\n', "'backend' must be one of ['fake', 'gpu', 'sglang', 'vllm']"),
    ('[[known]]\ncase = "V1-lora"\n', "unknown table(s) ['known']"),
    ('xfail = "V1-lora"\n', "'xfail' must be an array of tables"),
    ('[[xfail]\n', "is not valid TOML"),
])
def test_a_bad_entry_is_one_line_that_names_the_fix(tmp_path: Path, text: str, fix: str) -> None:
    with pytest.raises(ExpectationsError) as info:
        load_expectations(write(tmp_path, text), KNOWN)
    assert fix in str(info.value) and "\n" not in str(info.value)


def test_a_missing_file_says_how_to_write_one(tmp_path: Path) -> None:
    with pytest.raises(ExpectationsError, match="--write-expectations"):
        load_expectations(tmp_path / "nope.toml", KNOWN)


def test_strict_xfail_judgements(tmp_path: Path) -> None:
    ex = load_expectations(write(tmp_path, '[[xfail]]\ncase = "V1-*"\nreason = "never stamped, #7"\n'), KNOWN)
    entry = ex.lookup("V1-lora")
    assert ex.judge(entry, "V1-lora", "fail").outcome == "xfail"
    stale = ex.judge(entry, "V1-lora", "pass")
    assert stale.outcome == "unexpected-pass" and "delete the entry or narrow the glob" in stale.message
    broke = ex.judge(entry, "V1-lora", "fail", run_broke=True,
                     witness=["the run broke, so this case cannot pass:", "  error: ValueError: boom"])
    assert broke.outcome == "other-failure" and "error: ValueError: boom" in broke.message
    assert "expected a failure, got unknown (the run broke" in broke.message
    assert ex.judge(entry, "V1-lora", "skipped").outcome == "not-judged"


def test_an_unknown_verdict_is_not_the_expected_failure(tmp_path: Path) -> None:
    """A listed case whose situation was never built answers unknown: the listed failure was not seen."""
    ex = load_expectations(write(tmp_path, '[[xfail]]\ncase = "V1-lora"\nreason = "never stamped, #7"\n'), KNOWN)
    judged = ex.judge(ex.lookup("V1-lora"), "V1-lora", "unknown", witness=[
        "the scenario could not build the situation this check needs:", "  no request was resident at the pause"])
    assert judged.outcome == "other-failure"
    assert ("V1-lora is listed in conformance-expectations.toml: 'V1-lora' (never stamped, #7): expected a failure, "
            "got unknown (the scenario could not build the situation this check needs: no request was resident at "
            "the pause): that is a new failure, not the listed one") == judged.message


def test_a_run_that_raised_is_not_the_expected_failure(tmp_path: Path) -> None:
    """The scenario's run raised before any verdict (an engine lost): an error, never the listed failure."""
    ex = load_expectations(write(tmp_path, '[[xfail]]\ncase = "V1-lora"\nreason = "r"\n'), KNOWN)
    judged = ex.judge(ex.lookup("V1-lora"), "V1-lora", "error",
                      witness=["lora on the fake backend: EngineFailure: engine 1 exited"])
    assert judged.outcome == "other-failure"
    assert "expected a failure, got unknown (error: lora on the fake backend: EngineFailure: engine 1 exited)" \
        in judged.message


def test_written_expectations_load_back_and_list_every_failing_case(tmp_path: Path) -> None:
    text = render_expectations([("V1-lora", "fake"), ("V1-lora", "gpu"), ("I3-failover", "gpu")], "from a run")
    ex = load_expectations(write(tmp_path, text), KNOWN)
    assert [(e.pattern, e.reason, e.backend) for e in ex.entries] == [("I3-failover", "TODO", "gpu"),
                                                                      ("V1-lora", "TODO", None)]
