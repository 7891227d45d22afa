"""Adopting the suite the way a framework does, each in a pytest session of its own outside this repository: known
failures from an expectations file, the suite as importable test classes, and a plugin that leaves every other
pytest run alone."""

from __future__ import annotations

import contextlib
import json
from pathlib import Path
from typing import Any

import pytest

import conformance.mutants  # noqa: F401  imported here, so the in-process sessions below share them (a second
import conformance.reference  # noqa: F401  import of torch and its kin in one process fails)
import conformance.suite  # noqa: F401
import reports.render  # noqa: F401

with contextlib.suppress(ImportError):  # lazily imported by the scenarios; a second import in one process fails
    import torch  # noqa: F401
from conformance.scenarios import SCENARIOS

pytestmark = pytest.mark.cpu
ROOT = Path(__file__).resolve().parents[1]
SUITE = str(ROOT / "conformance" / "suite")
QUIET = ("-p", "no:cacheprovider", "-p", "no:benchmark")
QUIET_ASYNCIO_INI = "[pytest]\nasyncio_default_fixture_loop_scope = function\n"
"""A project's ini that sets pytest-asyncio's loop scope (unset, its deprecation warning is an error here)."""

BROKEN = '''
from conformance.reference import ReferenceIntegration, ReferenceUpdater

class Raising(ReferenceUpdater):
    async def update(self, weights=None, *, transport="distributed", lora=None):
        raise ConnectionError("trainer lost")

integration = ReferenceIntegration(name="broken-cycle", updater_cls=Raising)
'''


@pytest.fixture
def suite(pytester: pytest.Pytester):
    """``run(*args)``: the repository's suite module, run as a downstream user runs it (in this process)."""
    def run(*args: str) -> pytest.RunResult:
        pytester.chdir()
        return pytester.runpytest_inprocess(SUITE, *QUIET, "-p", "no:xdist", "-m", "cpu", *args)
    return run


def expectations(pytester: pytest.Pytester, *entries: tuple[str, str]) -> str:
    text = "".join(f'[[xfail]]\ncase = "{case}"\nreason = "{reason}"\nlink = "https://example.org/{i}"\n\n'
                   for i, (case, reason) in enumerate(entries))
    return str(pytester.makefile(".toml", **{"conformance-expectations": text}))


# -- known failures as data ---------------------------------------------------------------------------------------

def test_listed_cases_are_strict_expected_failures_and_a_passing_one_is_an_error(pytester: pytest.Pytester,
                                                                               suite) -> None:
    """Strict xfail (V1 still fails on the mutant), a glob, a stale entry (I3 passes: delete or narrow), the report
    keeping expected failures apart with their reasons."""
    path = expectations(pytester, ("V1-lora", "never stamped, tracked in #123"), ("I3-l*", "abort pauses, #7"))
    report = pytester.path / "out" / "conformance-result.json"
    result = suite("--conformance-integration", "conformance.mutants:lora_unstamped", "-k",
                   "lora-fake and not slow-engine",
                   "--conformance-expectations", path, f"--conformance-report={report}", "-rxf")
    result.assert_outcomes(xfailed=1, failed=1, passed=len(SCENARIOS["lora"].checks) - 2)
    result.stdout.fnmatch_lines_random([
        "XFAIL*V1-lora-fake* - expected failure (never stamped, tracked in #123 (https://example.org/0)): [[]V1*FAIL",
        "I3-lora passes now but is listed as an expected failure in conformance-expectations.toml: 'I3-l[*]' "
        "(abort pauses, #7 (https://example.org/1)): delete the entry or narrow the glob"])
    cases = {c["case"]: c for c in json.loads(report.read_text())["cases"]}
    assert cases["V1-lora"]["status"] == "fail" and cases["V1-lora"]["expected"]["outcome"] == "xfail"
    assert cases["I3-lora"]["expected"]["outcome"] == "unexpected-pass" and "expected" not in cases["P7-lora"]
    summary = report.with_suffix(".md").read_text()
    assert "## Expected failures" in summary and "never stamped, tracked in #123" in summary
    assert "https://example.org/0" in summary


def test_an_unknown_case_id_is_a_usage_error_with_the_closest_ids(pytester: pytest.Pytester, suite) -> None:
    path = expectations(pytester, ("V1-lroa", "typo"))
    result = suite("--conformance-expectations", path, "-k", "V3-first-drain")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*conformance-expectations.toml: entry 1: 'V1-lroa' matches no case of the suite; "
                                 "closest: V1-lora*"])
    assert sum("matches no case" in line for line in result.stderr.lines) == 1  # reported once


def test_the_ini_option_finds_the_file(pytester: pytest.Pytester, suite) -> None:
    expectations(pytester, ("Z9-nothing", "typo"))
    pytester.makeini(QUIET_ASYNCIO_INI + "conformance_expectations = conformance-expectations.toml\n")
    result = suite("-c", str(pytester.path / "tox.ini"), "-k", "V3-first-drain")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*'Z9-nothing' matches no case of the suite*"])


def test_a_listed_case_whose_run_broke_is_a_new_failure_not_the_listed_one(pytester: pytest.Pytester,
                                                                          suite) -> None:
    pytester.makepyfile(broken_cycle=BROKEN)
    pytester.syspathinsert()
    path = expectations(pytester, ("V1-lora", "labels, #3"))
    result = suite("--conformance-integration", "broken_cycle:integration", "-k", "V1-lora-fake",
                   "--conformance-expectations", path)
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*V1-lora is listed in conformance-expectations.toml: 'V1-lora' (labels, #3*): "
                                 "expected a failure, got unknown (the run broke*trainer lost*): that is a new "
                                 "failure*"])


NO_SESSIONS = '''
from conformance.reference import ReferenceIntegration, ReferenceUpdater

class NoSessions(ReferenceUpdater):
    async def begin_sessions(self):
        return None

    async def end_sessions(self):
        return None

integration = ReferenceIntegration(name="no-sessions", updater_cls=NoSessions)
'''


@pytest.mark.slow
def test_an_integration_without_weight_update_sessions_is_told_once_before_the_first_scenario(
        pytester: pytest.Pytester, suite) -> None:
    pytester.makepyfile(no_sessions=NO_SESSIONS)
    pytester.syspathinsert()
    result = suite("--conformance-integration", "no_sessions:integration", "-k", "steady-tensor-retract or V1-lora")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    text = "\n".join(result.outlines + result.errlines)
    assert text.count("integration 'no-sessions' never opens a weight-update session; SGLang 0.5.23 requires one for "
                      "tensor and distributed updates") == 1, text[-3000:]
    result.assert_outcomes()  # stopped before any case ran
    older = suite("--conformance-integration", "no_sessions:integration", "-k", "V1-steady-tensor-retract",
                  "--conformance-sglang-profile", "0.5.15")
    older.assert_outcomes(passed=1)  # no sessions on 0.5.15: nothing to say


def test_a_run_the_preflight_stopped_reports_the_failed_check_with_its_witness(pytester: pytest.Pytester,
                                                                              suite) -> None:
    """No case ran, yet the result is not "pass 0, fail 0 on no backend": it carries the release check as a failed
    check, its message and the refused calls (JSON, valid against the schema, and Markdown)."""
    from reports.result import validate

    pytester.makepyfile(no_sessions=NO_SESSIONS)
    pytester.syspathinsert()
    report = pytester.path / "out" / "conformance-result.json"
    result = suite("--conformance-integration", "no_sessions:integration", "-k", "V1-steady-tensor-retract",
                   f"--conformance-report={report}")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    written = json.loads(report.read_text())
    validate(written)
    assert written["cases"] == [] and len(written["preflight"]) == 1
    finding = written["preflight"][0]
    assert finding["check"] == "release-check" and finding["status"] == "fail"
    assert (finding["integration"], finding["profile"]) == ("no-sessions", "0.5.23")
    assert "never opens a weight-update session" in finding["message"]
    assert finding["witness"][0] == "no call to /begin_weight_update or /end_weight_update on any engine"
    assert any(" /update_weights_from_" in w and "answered 400" in w for w in finding["witness"][1:]), finding
    summary = report.with_suffix(".md").read_text()
    assert "on no backend: stopped by the preflight" in summary and "❌ release-check fail" in summary
    assert "## Preflight: release-check failed (no-sessions, SGLang 0.5.23)" in summary
    assert finding["witness"][1] in summary


@pytest.mark.slow
def test_an_own_update_cycle_with_the_reference_manager_conforms(monkeypatch: pytest.MonkeyPatch) -> None:
    """The documented way for a framework whose rollout manager needs Ray or GPUs: its own cycle as the Updater,
    the reference manager as the rollout manager (examples/own_cycle_reference_manager.py)."""
    from conformance.cases import fake_backend_factory, load_integration, run_cases

    monkeypatch.syspath_prepend(str(ROOT))
    results = run_cases(load_integration("examples.own_cycle_reference_manager:integration"), fake_backend_factory())
    ran = {name: r for name, r in results.items() if not r.skipped}
    assert {"steady-disk-retract", "failover", "failing-transfer-disk", "one-engine-rejects", "staleness"} <= set(ran)
    bad = [v.explain() for r in ran.values() for v in r.verdicts.values() if not v.passed]
    assert not bad, "\n".join(bad)
    from conformance.situations.registry import missing

    unbuilt = {name: missing(SCENARIOS[name].situations, r.history) for name, r in ran.items()}
    assert not any(unbuilt.values()), unbuilt  # what each scenario says it builds, its history holds
    # its cycle pauses engine after engine, after writing the checkpoint: still, every engine holds the manager's
    # requests when the cycle first reaches it — in the scenarios whose every update is held until requests are
    # resident (after a refused update, the good one that follows is not: an engine may be idle when it lands) — or
    # the suite's hold for them went on at its bound, and the history says so (a loaded machine: the verdict stands,
    # what it rests on is recorded)
    after_refusal = {"failing-transfer-disk", "failing-transfer-tensor", "failing-transfer-distributed",
                     "one-engine-rejects", "lora-refused", "lora-refused-by-one"}
    judged = {name: r for name, r in ran.items() if "I1-I2" in r.verdicts and name not in after_refusal}
    assert len(judged) >= 4
    unexplained = {name: _idle_without_expired_hold(r.history) for name, r in judged.items()}
    assert not any(unexplained.values()), unexplained
    shown = {name: r.verdicts["I1-I2"].metrics["integration_overlap_at_pause"] for name, r in judged.items()}
    assert all(v > 0 for v in shown.values()), shown


def _idle_without_expired_hold(h: Any) -> list[str]:
    """The (cycle, engine) pairs where the cycle's first disturbing call found none of the integration's requests
    resident and no hold of the suite went on at its bound there."""
    used = {w.engine for w in h.integration_calls("/generate")}
    found = []
    for c, engine, first in h.disturbing_calls():
        if engine not in used or any(w.origin == "integration" for w in h.resident_at(engine, first.t_start)):
            continue
        if not any(i.kind == "hold-expired" and i.engine == engine and c.t_start <= i.t <= c.t_end
                   for i in h.injected):
            found.append(f"cycle {c.index}, engine {engine}")
    return found


COUNTED = '''
import os
from conformance.reference import ReferenceIntegration

def make_integration():
    with open(os.environ["WEIGHTSYNC_TEST_CALLS"], "a") as log:
        log.write("called\\n")
    return ReferenceIntegration(name="counted")
'''


@pytest.mark.slow
def test_the_integration_factory_is_called_once_per_session(pytester: pytest.Pytester, suite,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """Collection, the release check, two scenarios, the report's metadata: one call of the factory."""
    pytester.makepyfile(counted=COUNTED)
    pytester.syspathinsert()
    calls = pytester.path / "calls.log"
    monkeypatch.setenv("WEIGHTSYNC_TEST_CALLS", str(calls))
    result = suite("--conformance-integration", "counted:make_integration", "-k", "first-drain-fake or V1-lora-fake",
                   f"--conformance-report={pytester.path / 'r' / 'conformance-result.json'}")
    result.assert_outcomes(passed=len(SCENARIOS["first-drain"].checks) + 1)
    assert calls.read_text() == "called\n"


# -- the suite as importable test classes -------------------------------------------------------------------------

ADOPTER_TESTS = '''
import pytest
from conformance.suite import ConformanceSuite


class TestMutant(ConformanceSuite):
    integration = "conformance.mutants:lora_unstamped"
    scenarios = ["lora"]
    backends = ["fake"]
    marks = {"V1-lora": pytest.mark.xfail(reason="known: never stamped", strict=True)}


class TestParametrised(ConformanceSuite):
    scenarios = ["first-drain"]
    backends = ["fake"]

    @pytest.fixture(scope="class", params=["reference", "override-one-step"])
    @classmethod
    def conformance_integration(cls, request):
        from conformance.reference import ReferenceIntegration
        return ReferenceIntegration(name=request.param)


def test_our_own_unit_test():
    assert True
'''


@pytest.mark.slow
def test_an_adopter_subclasses_the_suite_selects_marks_and_parametrises(pytester: pytest.Pytester) -> None:
    pytester.makeini(QUIET_ASYNCIO_INI)
    pytester.makepyfile(test_weight_sync=ADOPTER_TESTS)
    result = pytester.runpytest_inprocess(*QUIET, "-p", "no:xdist", "-v", "-k", "V1 or I3 or first-drain or own")
    result.assert_outcomes(xfailed=1, passed=2 + 2 * len(SCENARIOS["first-drain"].checks))  # I3-lora, own
    result.stdout.fnmatch_lines_random([
        "*TestMutant::test_case[[]V1-lora-fake[]] XFAIL*",
        "*TestMutant::test_case[[]I3-lora-fake[]] PASSED*",
        "*TestParametrised::test_case[[]V3-first-drain-fake-reference[]] PASSED*",
        "*TestParametrised::test_case[[]S2-first-drain-fake-override-one-step[]] PASSED*",
        "*test_our_own_unit_test PASSED*"])
    strict = pytester.runpytest_inprocess(*QUIET, "-p", "no:xdist", "-k", "TestParametrised and V3",
                                          "--conformance-integration", "no_such_module:x")
    assert strict.ret == pytest.ExitCode.USAGE_ERROR  # the session's integration is still checked once, up front
    pytester.makepyfile(test_typo=ADOPTER_TESTS.replace("conformance.mutants:lora_unstamped", "ourfw.nope:integration"))
    typo = pytester.runpytest_inprocess(*QUIET, "-p", "no:xdist", "test_typo.py")
    assert typo.ret == pytest.ExitCode.USAGE_ERROR  # a class's own integration: one usage error, before any case
    assert sum("cannot import integration module 'ourfw.nope'" in line for line in typo.errlines) == 1


# -- a plugin that stays out of the way ----------------------------------------------------------------------------

ADOPTER_CONFTEST = '''
def pytest_addoption(parser):
    parser.addoption("--model-path", default="/models/ours", help="the framework's own option")
    parser.addoption("--integration", action="store_true", help="the framework's own integration-test switch")
'''
ADOPTER_OWN_TESTS = '''
import sys

def test_model_path(request):
    assert request.config.getoption("--model-path") == "/models/llama"

def test_integration_flag(request):
    assert request.config.getoption("--integration") is True

def test_nothing_of_the_suite_was_imported():
    # at most the package markers, the fake's table of releases (plain data, for the options' help), the backend
    # table (plain data, for the markers and each backend's options) and the engine families' rows (plain data, for
    # --conformance-engine; each row loads its pieces only when used)
    heavy = sorted(m for m in sys.modules if m.startswith(("conformance.", "reports", "gpu", "weightsync_conformance.c",
                                                           "fakes.engine", "fakes.app", "fakes.server", "fakes.vllm"))
                   and m not in ("conformance.backend_table", "conformance.families"))
    assert not heavy, heavy
'''


@pytest.mark.slow
def test_a_project_without_conformance_cases_runs_unchanged(pytester: pytest.Pytester) -> None:
    """Its conftest defines --model-path and --integration, it runs -n 2 --dist load: the same outcome and output
    with the plugin as without it (no header line, xdist's own load scheduling, nothing of the suite imported)."""
    pytester.makeini(QUIET_ASYNCIO_INI)
    pytester.makeconftest(ADOPTER_CONFTEST)
    pytester.makepyfile(test_own=ADOPTER_OWN_TESTS)
    args = ("-p", "no:cacheprovider", "-p", "no:benchmark", "-v", "-n", "2", "--dist", "load", "--model-path",
            "/models/llama", "--integration")
    with_plugin = pytester.runpytest_inprocess(*args)
    without = pytester.runpytest_inprocess(*args, "-p", "no:weightsync_conformance")
    with_plugin.assert_outcomes(passed=3)
    without.assert_outcomes(passed=3)
    assert not [line for line in with_plugin.outlines if "weightsync-conformance:" in line]
    assert any("scheduling tests via LoadScheduling" in line for line in with_plugin.outlines)

    def body(result: pytest.RunResult) -> list[str]:
        return sorted(line for line in result.outlines if not line.startswith(("plugins:", "rootdir:", "=====", "[gw"))
                      and " in " not in line)  # the workers' order varies from run to run
    assert body(with_plugin) == body(without)
    helped = pytester.runpytest_inprocess("--help")
    helped.stdout.fnmatch_lines(["*--conformance-integration=MODULE:ATTR*", "*--conformance-model-path=DIR*"])
    assert not [line for line in helped.outlines if "alias of --conformance-" in line]
