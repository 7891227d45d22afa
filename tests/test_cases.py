"""A run that breaks fails: an unexpected update failure, a call with no answer within its deadline (a hang) or a
scenario that times out fails every case of its scenario, with what broke and the calls left open as the
witness; the checker's own answer is kept beside it."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from typing import Any, Iterator

import pytest

from conformance import DEFAULT_INTEGRATION
from conformance.cases import evaluate, fake_backend_factory, load_integration, run_one
from conformance.checks import CHECKS
from conformance.history import Breakage, History, OpenCall
from conformance.mutants import MUTANTS
from conformance.reference import ReferenceIntegration, ReferenceManager, ReferenceUpdater
from conformance.scenarios import DEADLINES, SCENARIOS, Deadlines
from fakes.profiles import DEFAULT_PROFILE

pytestmark = pytest.mark.cpu
FAST = Deadlines(update_s=1.0, drain_s=2.0, wait_s=2.0, script_s=5.0)


def test_a_broken_history_fails_every_check_and_keeps_what_the_checker_said() -> None:
    h = History("s", "i", "fake", "0.5.23", 0, breaks=[Breakage(
        "hang", "Updater.update() (cycle 0, disk) did not return within 20s", 21.0,
        [OpenCall(1, "POST", "/update_weights_from_disk", 1.0), OpenCall(0, "POST", "/generate", 0.5)])])
    for check in CHECKS:
        v = evaluate(check, h)
        assert v.status == "fail" and v.run_broke, check
        assert v.checker_status in ("pass", "unknown"), check
        assert v.witness[:4] == [
            "the run broke, so this case cannot pass:",
            "hang: Updater.update() (cycle 0, disk) did not return within 20s (at t=21.000s)",
            "  open call: engine 1 POST /update_weights_from_disk open since t=1.000s (20.0 s without an answer)",
            "  and 1 /generate call(s) still open"], v.witness


def test_an_unbroken_run_keeps_the_checker_verdict() -> None:
    v = evaluate("V1", History("s", "i", "fake", "0.5.23", 0))
    assert (v.status, v.run_broke, v.checker_status) == ("unknown", False, "unknown")


def test_an_update_that_hangs_fails_every_case_with_the_call_it_is_stuck_on() -> None:
    """A LoRA adapter unloaded under paused requests that use it: SGLang's unload waits for them forever."""
    result = run_one("lora", MUTANTS["lora_reload_in_place"].integration, fake_backend_factory(), deadlines=FAST)
    assert result.verdicts and all(v.status == "fail" and v.run_broke for v in result.verdicts.values())
    witness = "\n".join(result.verdicts["V1"].witness)
    assert "hang: Updater.update() (cycle 1, tensor, LoRA) did not return within 1s" in witness, witness
    assert "open call: engine 0 POST /unload_lora_adapter open since" in witness, witness
    assert result.verdicts["P7"].checker_status == "fail"  # and the checker itself saw why


class _FailsSecondUpdate(ReferenceUpdater):
    async def stamp(self, new: int) -> None:
        if new == 2:
            raise RuntimeError("trainer lost its NCCL group")
        await super().stamp(new)


def test_an_unexpected_update_failure_fails_every_case() -> None:
    integration = ReferenceIntegration(name="fails-second-update", updater_cls=_FailsSecondUpdate)
    result = run_one("steady-tensor-retract", integration, fake_backend_factory(), deadlines=FAST)
    for check, v in result.verdicts.items():
        assert v.status == "fail" and v.run_broke, check
        assert ("error: update cycle 1 (tensor) failed: RuntimeError: trainer lost its NCCL group"
                in v.witness[1]), v.witness


def test_a_scenario_past_its_deadline_fails_as_a_timeout() -> None:
    async def forever(run) -> None:
        await run.start()
        await asyncio.Event().wait()

    scenario = replace(SCENARIOS["steady-tensor-retract"], name="never-ends", script=forever)
    SCENARIOS[scenario.name] = scenario
    try:
        result = run_one(scenario.name, load_integration(DEFAULT_INTEGRATION), fake_backend_factory(),
                         deadlines=replace(FAST, script_s=0.5))
    finally:
        del SCENARIOS[scenario.name]
    witness = result.verdicts["V1"].witness
    assert witness[1].startswith("timeout: scenario never-ends did not return within 0.5s"), witness


class _StuckStop(ReferenceManager):
    async def stop(self) -> None:
        await asyncio.Event().wait()


def test_a_manager_that_never_stops_is_a_hang() -> None:
    integration = ReferenceIntegration(name="stuck-stop", manager_cls=_StuckStop)
    result = run_one("first-drain", integration, fake_backend_factory(), deadlines=replace(FAST, wait_s=1.0))
    witness = result.verdicts["V3"].witness
    assert "hang: Manager.stop() did not return within 1s" in witness[1], witness
    assert result.verdicts["V3"].checker_status == "pass"


def _numbers(values: list[int]) -> Iterator[tuple[int, Any]]:
    """A helper-process job: each value back as its result, the last first; "x" an exception, "exit" the process dies."""
    import os

    for index in reversed(range(len(values))):
        if values[index] == "exit":
            os._exit(3)
        yield index, ValueError("not a number") if values[index] == "x" else values[index]


@pytest.mark.slow  # a helper process
def test_a_batch_run_ahead_in_a_helper_process_settles_each_key_as_it_comes_or_with_the_reason() -> None:
    import functools

    from conformance.cases import RunAhead

    ahead = RunAhead(2)
    try:
        ahead.submit_batch(["a", "b", "c"], functools.partial(_numbers, [1, "x", 3]))
        ahead.submit_batch(["p", "q"], functools.partial(_numbers, ["exit", 2]))
        assert ahead.started("b") and not ahead.started("z")
        assert (ahead.result("a"), ahead.result("c")) == (1, 3)
        with pytest.raises(ValueError, match="not a number"):
            ahead.result("b")
        assert ahead.result("q") == 2
        with pytest.raises(RuntimeError, match=r"helper process ended \(exit code 3\) before this scenario's result"):
            ahead.result("p")
        with pytest.raises(ValueError, match="started already"):
            ahead.submit_batch(["c", "d"], functools.partial(_numbers, [1, 2]))
    finally:
        ahead.close()


@pytest.mark.slow  # a helper process
def test_scenarios_run_in_the_helper_process_come_back_whole_with_the_verdicts_of_a_run_here() -> None:
    """What the main job's session runs ahead in the helper process (every second scenario) is judged the same."""
    import functools

    from conformance.cases import RunAhead, batch_in_child, run_cases

    names = ["aborted-groups"]
    ahead = RunAhead(2)
    try:
        ahead.submit_batch(names, functools.partial(batch_in_child, names, DEFAULT_INTEGRATION, {},
                                                    DEFAULT_PROFILE, 0, DEADLINES, 2))
        there = [ahead.result(n) for n in names]
    finally:
        ahead.close()
    here = run_cases(load_integration(DEFAULT_INTEGRATION), fake_backend_factory(), scenarios=names)
    assert [{c: v.status for c, v in r.verdicts.items()} for r in there] == \
        [{c: v.status for c, v in here[n].verdicts.items()} for n in names]
    assert all(r.history is not None and r.history.scenario == n and r.history.wire for r, n in zip(there, names))
