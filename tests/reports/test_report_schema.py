"""The result schema: what the plugin and ``python -m conformance`` really write validates (also under ``-n 3``,
where the result must still be complete), the envelope is strict, histories are permissive."""

from __future__ import annotations

import copy
import gzip
import json
import re
from pathlib import Path

import jsonschema
import pytest
from conftest import BASELINE, RECORDED, ROOT, run_python

from weightsync_conformance.cli import PLUGIN, plugin_installed
from conformance.cases import CASES
from conformance.scenarios import SCENARIOS
from reports.diff import diff
from reports.result import SCHEMA_PATH, ResultError, load_result, validate

pytestmark = pytest.mark.cpu
SCHEMA = json.loads(SCHEMA_PATH.read_text())
SUITE = str(ROOT / "conformance" / "suite")
SCENARIO = "first-drain"
"""The scenario the runs here use: the quickest (two cases)."""


def validate_history(history: dict) -> None:
    jsonschema.validate(history, {"$defs": SCHEMA["$defs"], "$ref": "#/$defs/history"},
                        cls=jsonschema.Draft202012Validator)


def histories_of(result_path: Path) -> dict[str, dict]:
    result = json.loads(result_path.read_text())
    refs = {c["history"] for c in result["cases"] if c["history"]}
    return {ref: json.loads(gzip.decompress((result_path.parent / ref).read_bytes())) for ref in refs}


def test_the_schema_is_a_valid_json_schema() -> None:
    jsonschema.Draft202012Validator.check_schema(SCHEMA)


def test_the_recorded_result_and_its_histories_validate(recorded: dict) -> None:
    validate(recorded)
    histories = histories_of(RECORDED)
    assert len(histories) == 2
    for history in histories.values():
        validate_history(history)


@pytest.mark.parametrize(("change", "where"), [
    (lambda r: r.update(extra=1), "(top)"),
    (lambda r: r["cases"][0].update(verdict_colour="red"), "cases/0"),
    (lambda r: r["cases"][0].update(status="passed"), "cases/0/status"),
    (lambda r: r["run"].pop("seed"), "run"),
    (lambda r: r.update(schema_version=3), "schema_version"),
])
def test_the_envelope_is_strict(recorded: dict, change, where: str) -> None:
    broken = copy.deepcopy(recorded)
    change(broken)
    with pytest.raises(ResultError, match=re.escape(f"at {where}:")):
        validate(broken)


def test_histories_accept_fields_a_newer_suite_adds() -> None:
    history = next(iter(histories_of(RECORDED).values()))
    history["wire"][0]["priority"] = "high"
    history["cycles"][0]["resident_at_pause"] = [3, 2]
    history["nodes"] = ["node-a", "node-b"]
    history["something_new"] = {"any": "shape"}
    validate_history(history)
    history["wire"][0].pop("path")
    with pytest.raises(jsonschema.ValidationError, match="'path' is a required property"):
        validate_history(history)


def test_a_result_of_another_schema_version_is_refused(tmp_path: Path, recorded: dict) -> None:
    (tmp_path / "r.json").write_text(json.dumps({**recorded, "schema_version": 99}))
    with pytest.raises(ResultError, match="schema version 99, this suite reads 1"):
        load_result(tmp_path / "r.json")


@pytest.mark.slow
def test_the_main_job_under_xdist_writes_a_complete_valid_result(tmp_path: Path) -> None:
    """``python -m conformance --out DIR -n 2``: the controller writes the result; every case pytest ran is in it
    exactly once with pytest's outcome, names the history of the worker that ran its scenario, and matches the
    committed baseline; cases skipped before their run (the GPU backend here) are there with the reason;
    ``--dump-history`` writes each scenario run as JSON; the HTML's path is printed."""
    out, dump = tmp_path / "results", tmp_path / "dump"
    done = run_python("-m", "conformance", "--out", str(out), "-n", "2", "-m", "cpu or gpu", "-k", SCENARIO,
                      f"--conformance-dump-history={dump}", "-rA", cwd=tmp_path)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert f"HTML report: {out / 'conformance-result.html'}" in done.stdout
    passed = {line.split("::", 1)[1].strip() for line in done.stdout.splitlines() if line.startswith("PASSED ")}
    result_path = out / "conformance-result.json"
    result = json.loads(result_path.read_text())
    validate(result)
    assert result["run"]["workers"] == 2 and result["run"]["integration"]["capabilities"]["failover"] is True
    cases = {c["nodeid"]: c for c in result["cases"]}
    expected = [c.id for c in CASES if c.scenario == SCENARIO]
    assert len(cases) == len(result["cases"]) == 2 * len(expected)  # on fake and on gpu
    ran = {nodeid.split("::", 1)[1]: c for nodeid, c in cases.items() if c["backend"] == "fake"}
    assert set(ran) == passed and sorted(c["case"] for c in ran.values()) == sorted(expected)
    assert all(c["status"] == "pass" and c["outcome"] == "passed" for c in ran.values())
    skipped = [c for c in cases.values() if c["backend"] == "gpu"]
    assert all(c["status"] == "skipped" and c["outcome"] == "skipped" and c["reason"] for c in skipped)
    assert result["summary"] == {"pass": len(expected), "fail": 0, "unknown": 0, "skipped": len(expected), "error": 0}
    for c in ran.values():
        assert c["worker"] in ("gw0", "gw1", "gw2") and c["history"].endswith(f".fake.{c['worker']}.json.gz"), c
    for history in histories_of(result_path).values():
        validate_history(history)
    assert sorted(p.name for p in dump.iterdir()) == sorted({Path(c["history"]).name.removesuffix(".gz")
                                                             for c in ran.values()})
    for path in dump.iterdir():
        validate_history(json.loads(path.read_text()))
    assert (out / "conformance-result.md").read_text().startswith("# Conformance: reference on fake")
    assert "<svg" in (out / "conformance-result.html").read_text()
    changes = diff(load_result(BASELINE), result, subset=True)
    assert not changes.regressions, changes.lines()


@pytest.mark.slow
def test_without_xdist_real_cases_and_a_broken_case_reach_the_result(pytester: pytest.Pytester) -> None:
    """In one process: the suite's own cases (first-drain) carry their verdict and history, a conformance test
    whose setup fails before ``conformance_record`` still gets its case (``error``, with what went wrong), and the run
    names the integration as loaded, with its options."""
    pytester.makepyfile(test_broken="""
        import pytest
        from conformance.cases import Case

        pytestmark = pytest.mark.cpu

        @pytest.fixture
        def engines():
            raise RuntimeError("engine 0 never became healthy")

        @pytest.mark.parametrize("backend", ["fake"])
        @pytest.mark.parametrize("case", [Case("first-drain", "V3")], ids=lambda c: c.id)
        def test_invariant(case, backend, engines):
            pass
    """)
    pytester.makepyfile(my_adapter="""
        from conformance.reference import integration

        def make(flavour, retries=0):
            return integration
    """)
    pytester.syspathinsert()
    result_path = pytester.path / "out" / "r.json"
    plugin = [] if plugin_installed() else ["-p", PLUGIN]
    run = pytester.runpytest(SUITE, "test_broken.py", "-p", "no:cacheprovider", "-p", "no:xdist", "-p", "no:benchmark",
                             *plugin, "-m", "cpu", "-k", SCENARIO, f"--conformance-report={result_path}",
                             "--conformance-integration=my_adapter:make", "--conformance-integration-option=flavour=mild",
                             "--conformance-integration-option=retries=2")
    run.assert_outcomes(passed=len(SCENARIOS[SCENARIO].checks), errors=1)
    result = json.loads(result_path.read_text())
    validate(result)
    real = [c for c in result["cases"] if c["nodeid"].startswith("conformance/suite/")]
    broken = [c for c in result["cases"] if c not in real]  # outside the rootdir: its node id has no path
    assert [(c["case"], c["status"], c["outcome"], c["history"]) for c in broken] == \
        [("V3-first-drain", "error", "failed", None)]
    assert any("engine 0 never became healthy" in w for w in broken[0]["witness"])
    assert sorted(c["case"] for c in real) == sorted(f"{c}-first-drain" for c in SCENARIOS[SCENARIO].checks)
    assert all(c["status"] == "pass" and c["worker"] is None for c in real)
    assert {c["history"] for c in real} == {"r-histories/first-drain.fake.json.gz"}
    validate_history(json.loads(gzip.decompress((result_path.parent / real[0]["history"]).read_bytes())))
    assert result["summary"] == {"pass": len(real), "fail": 0, "unknown": 0, "skipped": 0, "error": 1}
    assert result["run"]["integration"] | {"capabilities": None} == {
        "spec": "my_adapter:make", "name": "reference", "options": {"flavour": "mild", "retries": 2},
        "capabilities": None}
    assert result["run"]["integration"]["capabilities"]["transports"] == ["disk", "distributed", "tensor"]
