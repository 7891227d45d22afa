"""The plugin as a user meets it: integration selection, usage errors that say what to fix, capability skips
with their reason, and a mutant failing through the real pytest path."""

from __future__ import annotations

import contextlib
import re
import sys
from pathlib import Path

import pytest

from conformance.cases import (IntegrationError, fake_backend_factory, load_integration, parse_options, run_cases,
                               run_one)
from conformance.scenarios import SCENARIOS

with contextlib.suppress(ImportError):  # lazily imported by the scenarios; a second import in one process fails
    import torch  # noqa: F401

pytestmark = pytest.mark.cpu
ROOT = Path(__file__).resolve().parents[1]
SUITE = str(ROOT / "conformance" / "suite")


@pytest.fixture
def run_suite(pytester: pytest.Pytester):
    """Run the conformance suite as a downstream user would: a pytest session of its own, outside this repository
    (in this process: the suite's modules are already imported, so a session costs no interpreter start)."""
    def run(*args: str) -> pytest.RunResult:
        pytester.chdir()
        pytester.syspathinsert(ROOT)
        return pytester.runpytest_inprocess(SUITE, "-p", "no:cacheprovider", "-p", "no:xdist", "-p", "no:benchmark",
                                            *args)
    return run


@pytest.mark.parametrize(("spec", "fix"), [
    ("conformance.reference", "must be 'module:attribute'"),
    ("no_such_module_xyz:integration", "cannot import integration module 'no_such_module_xyz'"),
    ("conformance.reference:nope", "has no attribute 'nope'"),
    ("conformance.interface:Capabilities", "is not an Integration: it lacks"),
])
def test_a_broken_integration_spec_names_the_fix(spec: str, fix: str) -> None:
    with pytest.raises(IntegrationError, match=fix):
        load_integration(spec)


@pytest.mark.parametrize(("options", "fix"), [
    (["flush"], "integration option 'flush' must be KEY=VALUE"),
    (["colour=red"], "does not take the options ['colour']"),
    (["flush=sideways"], "raised ValueError: flush must be one of ['after_load', 'before_load']"),
])
def test_bad_integration_options_name_the_fix(options: list[str], fix: str) -> None:
    sys.path.insert(0, str(ROOT))
    with pytest.raises(IntegrationError, match=re.escape(fix)):
        load_integration("examples.override_one_step:integration", parse_options(options))


def test_options_reach_the_factory_and_an_integration_takes_none() -> None:
    sys.path.insert(0, str(ROOT))
    built = load_integration("examples.override_one_step:integration", parse_options(["flush=before_load"]))
    assert built.name == "override-one-step[flush=before_load]"
    with pytest.raises(IntegrationError, match="is an Integration, not a factory"):
        load_integration("conformance.reference:integration", {"flush": "x"})


@pytest.mark.slow
def test_an_adapter_with_process_global_state_runs_with_isolated_scenarios(run_suite) -> None:
    sys.path.insert(0, str(ROOT))
    shared = load_integration("examples.process_global_adapter:integration")
    first, second = (run_one(name, shared, fake_backend_factory()) for name in ("first-drain", "aborted-groups"))
    assert not any(v.run_broke for v in first.verdicts.values())
    assert "already initialised in this process" in second.verdicts["I4"].witness[1]
    result = run_suite("-m", "cpu", "--conformance-integration", "examples.process_global_adapter:integration",
                       "--conformance-isolate-scenarios", "-k", "V3-first-drain or I4-aborted-groups")
    result.assert_outcomes(passed=2)


def test_a_broken_integration_is_a_usage_error(run_suite) -> None:
    result = run_suite("-m", "cpu", "--conformance-integration", "no_such_module_xyz:integration")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*weightsync-conformance: cannot import integration module 'no_such_module_xyz'*"])


def test_an_unknown_profile_is_a_usage_error(run_suite) -> None:
    result = run_suite("-m", "cpu", "--conformance-sglang-profile", "9.9")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*--conformance-sglang-profile '9.9' is not known*"])


def test_a_mutant_fails_through_pytest_with_its_witness(run_suite) -> None:
    result = run_suite("-m", "cpu", "--conformance-integration", "conformance.mutants:lora_unstamped",
                       "-k", "V1-lora-fake", "--conformance-seed", "7")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*seed=7*", "*?V1 versions agree? FAIL*", "*engines were never stamped*(LoRA)*"])


def test_on_the_vllm_engine_the_default_is_the_vllm_reference_and_a_vllm_mutant_fails_with_its_witness(
        run_suite) -> None:
    passed = run_suite("-m", "cpu", "--conformance-engine", "vllm", "-k", "steady-disk-in_place")
    passed.assert_outcomes(passed=12)
    passed.stdout.fnmatch_lines(["*integration=conformance.reference:vllm engine=vllm *"])
    failed = run_suite("-m", "cpu", "--conformance-engine", "vllm", "--conformance-integration",
                       "conformance.mutants:vllm_pause_default_abort", "-k", "I3-steady-disk-in_place-fake")
    failed.assert_outcomes(failed=1)
    failed.stdout.fnmatch_lines(["*?I3 * FAIL*", "*abort*"])


def test_missing_capabilities_skip_with_the_reason(run_suite) -> None:
    result = run_suite("-m", "cpu", "--conformance-integration", "examples.requests_adapter:integration",
                       "-k", "lora-fake and not slow-engine", "-rs")
    result.assert_outcomes(skipped=len(SCENARIOS["lora"].checks))
    result.stdout.fnmatch_lines(["*integration does not declare capability 'lora'*"])


@pytest.mark.slow
@pytest.mark.parametrize("example", ["examples.requests_adapter:integration", "examples.httpx_adapter:integration",
                                     "examples.override_one_step:integration"])
def test_example_adapters_pass_every_case_they_can_run(example: str) -> None:
    sys.path.insert(0, str(ROOT))
    results = run_cases(load_integration(example), fake_backend_factory())
    ran = {name: r for name, r in results.items() if not r.skipped}
    assert ran, f"{example} ran no scenario"
    bad = {f"{check}-{name}": v.explain() for name, r in ran.items() for check, v in r.verdicts.items() if not v.passed}
    assert not bad, "\n".join(bad.values())
    overlap = {name: r.verdicts["I1-I2"].metrics["overlap_at_pause"] for name, r in ran.items()
               if "I1-I2" in r.verdicts}
    assert overlap and set(overlap.values()) == {1.0}, overlap  # every engine had a request resident at every pause


def test_an_undeclared_capability_is_named_in_the_terminal_summary_and_the_report(run_suite, pytester, tmp_path) -> None:
    import json

    from reports.result import validate

    pytester.makepyfile(undeclared_partial="from conformance.reference import PartialRolloutManager, "
                        "ReferenceIntegration, default_capabilities\n"
                        "integration = ReferenceIntegration(name='undeclared', manager_cls=PartialRolloutManager, "
                        "capabilities=default_capabilities())\n")
    pytester.syspathinsert()
    report = tmp_path / "result.json"
    result = run_suite("-m", "cpu", "--conformance-integration", "undeclared_partial:integration",
                       f"--conformance-report={report}", "-k", "I4-aborted-groups")
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(["*shows capability 'partial_rollout', which the integration does not declare*"
                                 "declare Capabilities(partial_rollout=True) to run partial-rollout*"])
    written = json.loads(report.read_text())
    validate(written)
    assert [(u["capability"], u["shown_in"], u["unlocks"]) for u in written["undeclared"]] == [
        ("partial_rollout", ["aborted-groups"], ["partial-rollout"])]
    assert "## Capabilities shown but not declared" in report.with_suffix(".md").read_text()


def test_a_case_node_id_names_its_scenario_group_and_other_tests_none() -> None:
    from weightsync_conformance.plugin import case_group

    base = "conformance/suite/test_invariants.py::TestConformance::test_case"
    assert case_group(f"{base}[I1-I2-steady-disk-retract-fake]") == \
        "conformance/suite/test_invariants.py::TestConformance::steady-disk-retract.fake"
    assert case_group(f"{base}[V4-S1-staleness-fake]") == case_group(f"{base}[S3-staleness-fake]")
    assert case_group("tests/test_plugin.py::test_case[x]") is None
    assert case_group("tests/test_plugin.py::test_other") is None


@pytest.mark.slow
@pytest.mark.parametrize("dist", ["load", "loadgroup"])
def test_under_xdist_a_scenarios_cases_share_one_worker(pytester: pytest.Pytester, dist: str) -> None:
    """Each scenario runs once: its cases go to one worker, with the plugin's scheduling (pytest 9 ignores the
    renamed node ids xdist's ``xdist_group`` relies on)."""
    pytester.chdir()
    pytester.syspathinsert(ROOT)
    result = pytester.runpytest_inprocess(SUITE, "-p", "no:cacheprovider", "-p", "no:benchmark", "-v", "-n", "2",
                                          "--dist", dist, "-m", "cpu", "-k", "first-drain or staleness")
    result.assert_outcomes(passed=len(SCENARIOS["first-drain"].checks) + len(SCENARIOS["staleness"].checks))
    workers: dict[str, set[str]] = {}
    for line in result.outlines:
        found = re.search(r"\[(gw\d)\].*PASSED .*test_case\[[A-Z0-9-]+?-(first-drain|staleness)-fake\]", line)
        if found:
            workers.setdefault(found[2], set()).add(found[1])
    assert workers and all(len(w) == 1 for w in workers.values()), workers
