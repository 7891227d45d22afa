"""``python -m reports diff BASE NEW``: exit 1 on a new failure, a case no longer verified or a metric regression
beyond its threshold; 0 on no change; 2 on bad input."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
from conftest import BASELINE, RECORDED, run_python

from reports.diff import THRESHOLDS, diff
from reports.result import load_result, validate

pytestmark = pytest.mark.cpu


@pytest.fixture
def base() -> dict:
    return load_result(BASELINE)


def case(result: dict, name: str) -> dict:
    return next(c for c in result["cases"] if c["case"] == name)


def test_the_committed_baseline_is_a_valid_all_pass_result_of_the_reference(base: dict) -> None:
    validate(base)
    assert base["run"]["integration"]["spec"] == "conformance.reference:integration"
    assert {c["backend"] for c in base["cases"]} == {"fake"}
    assert base["summary"]["pass"] == len(base["cases"]) > 50


def test_no_change_is_no_regression(base: dict) -> None:
    assert diff(base, copy.deepcopy(base)).regressions == []


def test_a_new_failure_is_a_regression_and_a_fix_is_reported(base: dict) -> None:
    new = copy.deepcopy(base)
    case(new, "I1-I2-steady-tensor-in_place").update(status="fail", witness=["request r1 (engine 0) was aborted"])
    changes = diff(base, new)
    assert changes.regressions == ["I1-I2-steady-tensor-in_place [fake]: fail (was pass): request r1 (engine 0) "
                                   "was aborted"]
    assert diff(new, base).fixed == ["I1-I2-steady-tensor-in_place [fake]: fail → pass"]
    assert not diff(new, base).regressions


@pytest.mark.parametrize("status", ["unknown", "error"])
def test_unknown_and_error_are_failures_too(base: dict, status: str) -> None:
    new = copy.deepcopy(base)
    case(new, "V1-lora")["status"] = status
    assert len(diff(base, new).regressions) == 1


@pytest.mark.parametrize(("metric", "old", "new", "regressed"), [
    ("aborted_sample_rate", 0.0, 0.02, True),
    ("aborted_sample_rate", 0.0, 0.01, False),
    ("aborted_sample_rate", 0.3, 0.1, False),
    ("staleness_mean", 0.2, 0.8, True),
    ("staleness_mean", 0.2, 0.6, False),
    ("staleness_max", 1, 2, True),
])
def test_metric_regressions_beyond_the_threshold(base: dict, metric: str, old: float, new: float,
                                                 regressed: bool) -> None:
    before, after = copy.deepcopy(base), copy.deepcopy(base)
    case(before, "S3-staleness")["metrics"][metric] = old
    case(after, "S3-staleness")["metrics"][metric] = new
    changes = diff(before, after)
    assert bool(changes.regressions) is regressed, changes.lines()
    if regressed:
        assert changes.regressions == [f"S3-staleness [fake]: {metric} {old:.3g} → {new:.3g} (more than "
                                       f"+{THRESHOLDS[metric]:g})"]


def test_cases_that_no_longer_run_are_regressions_unless_the_run_was_a_subset(base: dict) -> None:
    new = copy.deepcopy(base)
    new["cases"] = [c for c in new["cases"] if c["scenario"] == "lora"]
    assert diff(base, new).regressions and not diff(base, new, subset=True).regressions
    skipped = copy.deepcopy(base)
    case(skipped, "V1-lora").update(status="skipped", reason="integration does not declare capability 'lora'")
    assert diff(base, skipped, subset=True).regressions == [
        "V1-lora [fake]: passed in the baseline, now skipped (integration does not declare capability 'lora')"]


@pytest.mark.slow  # a second Python process
def test_the_cli_exit_codes(tmp_path: Path, base: dict) -> None:
    (tmp_path / "same.json").write_text(json.dumps(base))
    same = run_python("-m", "reports", "diff", str(BASELINE), str(tmp_path / "same.json"), cwd=tmp_path)
    assert (same.returncode, same.stdout.strip()) == (0, "no regression (0 fixed)")
    worse = run_python("-m", "reports", "diff", str(BASELINE), str(RECORDED), "--subset", cwd=tmp_path)
    assert worse.returncode == 1 and "REGRESSION I1-I2-steady-tensor-in_place [fake]: fail (was pass)" in worse.stdout
    assert "REGRESSION I1-I2-steady-tensor-in_place [fake]: aborted_sample_rate 0 →" in worse.stdout
    loose = run_python("-m", "reports", "diff", str(BASELINE), str(RECORDED), "--subset",
                       "--threshold", "aborted_sample_rate=0.5", "--threshold", "aborts_per_update=100", cwd=tmp_path)
    assert "aborted_sample_rate" not in loose.stdout and loose.returncode == 1  # the failure itself remains
    for args, message in ((["--threshold", "colour=1"], "is not METRIC=NUMBER"),
                          (["--threshold", "staleness_max=x"], "is not METRIC=NUMBER")):
        bad = run_python("-m", "reports", "diff", str(BASELINE), str(RECORDED), *args, cwd=tmp_path)
        assert bad.returncode == 2 and message in bad.stderr
    missing = run_python("-m", "reports", "diff", str(BASELINE), str(tmp_path / "nope.json"), cwd=tmp_path)
    assert missing.returncode == 2 and missing.stderr.strip() == f"python -m reports: {tmp_path / 'nope.json'}: " \
                                                                 "no such file"
