"""The expectations file as pure logic: parsing, globs, closest ids, strict judgements of known failures and known
unknowns, the written file, and how the result and its summary mark listed cases."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from conformance.cases import CASES
from conformance.expectations import ExpectationsError, load_expectations, render_expectations
from reports.markdown import render_markdown
from reports.result import validate

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
    ('[[known]]\ncase = "V1-lora"\n', "unknown table(s) ['known']; list entries as [[xfail]] (known failures) or "
                                     "[[unknown]] (known unknowns)"),
    ('[[xfail]]\ncase = "V1-lora"\nreason = "r"\nwitness = "w"\n', "unknown key(s) ['witness']; a [[xfail]] entry"),
    ('[[unknown]]\ncase = "S2-mixed-verions"\nreason = "r"\n',
     "[[unknown]] entry 1: 'S2-mixed-verions' matches no case of the suite; closest: S2-mixed-versions"),
    ('[[unknown]]\ncase = "S2-mixed-versions"\n', "'reason' must say why the situation cannot arise"),
    ('[[unknown]]\ncase = "S2-mixed-versions"\nreason = "r"\nwitness = " "\n', "'witness' must be a non-empty"),
    ('unknown = "S2-mixed-versions"\n', "'unknown' must be an array of tables ([[unknown]] entries)"),
    ('[[xfail]]\ncase = "S2-*"\nreason = "r"\n[[unknown]]\ncase = "*-mixed-versions"\nreason = "r"\n',
     "S2-mixed-versions is listed both as [[xfail]] ('S2-*') and as [[unknown]] ('*-mixed-versions')"),
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


UNMET = ["the scenario could not build the situation this check needs:",
         "  no group generated under more than one version was consumed in 8 updates: S2 is not shown on mixed groups"]


def known_unknown(tmp_path: Path, extra: str = ""):
    ex = load_expectations(write(tmp_path, f'[[unknown]]\ncase = "S2-*"\nreason = "we drop spanning groups, #5"\n'
                                           f'{extra}'), KNOWN)
    return ex, ex.lookup("S2-mixed-versions")


def test_a_known_unknown_must_still_answer_unknown(tmp_path: Path) -> None:
    ex, entry = known_unknown(tmp_path)
    assert entry.kind == "unknown" and ex.lookup("S2-lora").kind == "unknown"
    listed = ex.judge(entry, "S2-mixed-versions", "unknown", witness=UNMET)
    assert listed.outcome == "expected-unknown" and listed.as_listed
    assert listed.message == "known unknown (we drop spanning groups, #5)"
    stale = ex.judge(entry, "S2-mixed-versions", "pass")
    assert stale.outcome == "unexpected-pass" and not stale.as_listed
    assert stale.message == ("S2-mixed-versions passes now but is listed as a known unknown in "
                             "conformance-expectations.toml: 'S2-*' (we drop spanning groups, #5): delete the entry "
                             "or narrow the glob")
    fails = ex.judge(entry, "S2-mixed-versions", "fail", witness=["group g1 mixed versions 0 and 1 unlabelled"])
    assert fails.outcome == "other-failure" and fails.message == (
        "S2-mixed-versions is listed as a known unknown in conformance-expectations.toml: 'S2-*' (we drop spanning "
        "groups, #5): it now fails (group g1 mixed versions 0 and 1 unlabelled): the situation arose and the "
        "invariant broke; fix it, or list it as [[xfail]] in place of [[unknown]]")
    broke = ex.judge(entry, "S2-mixed-versions", "fail", run_broke=True,
                     witness=["the run broke, so this case cannot pass:", "  error: ValueError: boom"])
    assert broke.outcome == "other-failure" and "expected unknown, got no verdict of its own (the run broke, so " \
        "this case cannot pass: error: ValueError: boom): that is a new failure" in broke.message
    raised = ex.judge(entry, "S2-mixed-versions", "error", witness=["EngineFailure: engine 1 exited"])
    assert raised.outcome == "other-failure" and "(error: EngineFailure: engine 1 exited)" in raised.message
    assert ex.judge(entry, "S2-mixed-versions", "skipped").outcome == "not-judged"


def test_a_known_unknown_with_a_witness_must_answer_unknown_for_that_reason(tmp_path: Path) -> None:
    ex, entry = known_unknown(tmp_path, 'witness = "no group generated under more than one version"\n')
    assert ex.judge(entry, "S2-mixed-versions", "unknown", witness=UNMET).outcome == "expected-unknown"
    other = ex.judge(entry, "S2-mixed-versions", "unknown", witness=["checker raised KeyError: 'groups'"])
    assert other.outcome == "other-failure" and other.message.endswith(
        "expected unknown with witness 'no group generated under more than one version', got unknown for another "
        "reason (checker raised KeyError: 'groups'): if that is your design too, change the entry's witness to a "
        "part of it")
    spans = load_expectations(write(tmp_path, '[[unknown]]\ncase = "S2-mixed-versions"\nreason = "r"\n'
                                              'witness = "needs: no group generated"\n'), KNOWN)  # across lines
    assert spans.judge(spans.entries[0], "S2-mixed-versions", "unknown", witness=UNMET).outcome == "expected-unknown"


def test_an_exact_id_outranks_a_glob_of_the_other_kind(tmp_path: Path) -> None:
    ex = load_expectations(write(tmp_path, '[[xfail]]\ncase = "*-mixed-versions"\nreason = "r"\n'
                                           '[[unknown]]\ncase = "S2-mixed-versions"\nreason = "design"\n'), KNOWN)
    assert ex.lookup("S2-mixed-versions").kind == "unknown" and ex.lookup("I1-I2-mixed-versions").kind == "xfail"


def test_written_expectations_list_failures_and_unknowns_apart_and_load_back(tmp_path: Path) -> None:
    text = render_expectations([("I1-I2-mixed-versions", "fake")], "from a run",
                               [("S2-mixed-versions", "fake", UNMET)])
    assert ('[[unknown]]\ncase = "S2-mixed-versions"\nreason = "TODO"\n# the suite: the scenario could not build the '
            'situation this check needs: no group generated under more than one version') in text
    ex = load_expectations(write(tmp_path, text), KNOWN)
    assert [(e.pattern, e.kind, e.reason) for e in ex.entries] == [("I1-I2-mixed-versions", "xfail", "TODO"),
                                                                  ("S2-mixed-versions", "unknown", "TODO")]


RECORDED = Path(__file__).parent / "reports" / "fixtures" / "version_bump_aborts" / "conformance-result.json"


def test_the_result_and_its_summary_mark_known_unknowns_like_expected_failures() -> None:
    result = json.loads(RECORDED.read_text())
    template = result["cases"][0]
    listed = {"reason": "we drop spanning groups", "link": "https://example.org/5", "entry": "S2-*", "kind": "unknown"}
    result["cases"] = [
        {**copy.deepcopy(template), "case": "S2-mixed-versions", "invariant": "S2", "status": "unknown",
         "witness": UNMET, "expected": {**listed, "outcome": "expected-unknown"}},
        {**copy.deepcopy(template), "case": "S2-lora", "invariant": "S2", "scenario": "lora", "status": "pass",
         "witness": [], "expected": {**listed, "outcome": "unexpected-pass"}}]
    validate(result)
    summary = render_markdown(result)
    assert "(1 of the unknowns known: listed in the expectations file)" in summary
    assert ("## Known unknowns (listed in the expectations file)\n\n| case | backend | reason | tracked |\n"
            "|---|---|---|---|\n| S2-mixed-versions | fake | we drop spanning groups | https://example.org/5 |"
            ) in summary
    assert "## New failures" not in summary and "(unknown)" not in summary
    assert "passing now (delete their entries)\n\n- **S2-lora** (fake): entry 'S2-*'" in summary
