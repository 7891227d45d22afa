"""Legitimate designs real frameworks ship get the same verdicts as the reference: no false alarm, no broken run."""

from __future__ import annotations

import asyncio
import itertools
import os
from dataclasses import replace
from pathlib import Path
from typing import Any, Mapping

import pytest
import torch

from conformance.backends import FakeBackend, FakeBackendConfig
from conformance.cases import fake_backend_factory, run_cases
from conformance.checks.labels import cut_short, finish_type
from conformance.history import WireCall
from conformance.interface import Capabilities, Turn
from conformance.mutants import KeepsAbortedManager, NoneAsZeroManager
from conformance.reference import (EngineError, LoraTransport, ReferenceIntegration, ReferenceManager,
                                   ReferenceUpdater, write_checkpoint_atomic)
from conformance.reference.integration import default_capabilities
from conformance.scenarios import DEFAULT_ROLLOUT, SCENARIOS, Deadlines, Run, Scenario
from conformance.situations.aborted import abort_in_flight
from conformance.situations.producer import until_in_flight
from conformance.situations.scene import generates
from conformance.situations.waiting import wait_for

pytestmark = pytest.mark.cpu
FAST = Deadlines(update_s=5.0, drain_s=5.0, wait_s=5.0, script_s=30.0)


def _all_pass(integration: Any, scenarios: list[str]) -> dict[str, Any]:
    results = run_cases(integration, fake_backend_factory(), scenarios=scenarios, deadlines=FAST)
    bad = {f"{c}-{s}": v.explain() for s, r in results.items() for c, v in r.verdicts.items() if not v.passed}
    assert not bad, bad
    return results


class StickyManager(ReferenceManager):
    """Routes every sample to the first engine (sticky sessions, or a least-loaded router on a quiet fleet)."""

    def __init__(self, *args: Any, **kw: Any) -> None:
        super().__init__(*args, **kw)
        self._next_engine = itertools.repeat(0)


def test_sticky_routing_runs_every_scenario_that_waits_on_engine_activity() -> None:
    """Waits follow the engines the integration uses: with every sample on engine 0, the waits for a request in
    flight, for the next call of a sample and for requests to abort do not wait on engine 1."""
    results = _all_pass(ReferenceIntegration(name="sticky", manager_cls=StickyManager),
                        ["steady-tensor-retract", "mixed-versions", "aborted-groups"])
    h = results["steady-tensor-retract"].history
    assert {c.engine for c in h.integration_calls("/generate")} == {0}
    assert results["steady-tensor-retract"].verdicts["I1-I2"].metrics["integration_overlap_at_pause"] == 1.0


def write_checkpoint_reused_atomically(root: Path, name: str, tensors: Mapping[str, torch.Tensor],
                                       config: Mapping[str, Any]) -> Path:
    """One path for every version, each new checkpoint renamed into place after the old one was renamed away."""
    staged = write_checkpoint_atomic(root, f".{name}.staged", tensors, config)
    final = root / "latest"
    if final.exists():
        os.rename(final, root / f".{name}.replaced")
    os.rename(staged, final)
    return final


def test_a_checkpoint_path_reused_and_replaced_by_a_rename_passes_f3() -> None:
    results = _all_pass(ReferenceIntegration(name="reused-path", disk_writer=write_checkpoint_reused_atomically),
                        ["steady-disk-retract"])
    h = results["steady-disk-retract"].history
    assert {Path(c.payload["model_path"]).name for c in h.integration_calls("/update_weights_from_disk")} == {"latest"}


class InitialVersionZeroManager(ReferenceManager):
    """Counts the initial weights as version 0, published before the first update (versions kept client-side)."""

    def __init__(self, *args: Any, **kw: Any) -> None:
        super().__init__(*args, **kw)
        self._version = 0


def test_an_integration_that_counts_its_initial_weights_as_version_0_is_judged_against_that() -> None:
    caps = Capabilities(stamps_engines=False)
    results = _all_pass(ReferenceIntegration(name="initial-version-0", capabilities=caps,
                                             manager_cls=InitialVersionZeroManager),
                        ["first-drain", "staleness"])
    h = results["first-drain"].history
    assert h.initial_version == 0 and results["first-drain"].verdicts["V3"].metrics["batches_before_first_update"]
    # the same integration reporting None for its initial weights while measuring staleness against 0 still fails
    v = run_cases(ReferenceIntegration(name="none-as-zero", manager_cls=NoneAsZeroManager), fake_backend_factory(),
                  scenarios=["first-drain"], deadlines=FAST)["first-drain"].verdicts["V3"]
    assert v.status == "fail", v.explain()


def test_partial_rollout_resumes_aborted_calls_across_an_update_and_passes() -> None:
    """The reference with partial rollout (aborted turns resumed, never recycled) on the partial-rollout scenario:
    a consumed group is as old as the part of a turn generated before the abort, and the group records it."""
    from conformance.reference import partial_rollout

    results = _all_pass(partial_rollout, ["partial-rollout", "aborted-groups"])
    h = results["partial-rollout"].history
    resumed = [t for rec in h.batches for g in rec.batch.groups for s in g.samples for t in s.turns if t.continues]
    assert resumed and not h.unmet


@pytest.mark.parametrize("stamps_engines", [True, False], ids=["engine-labels", "client-side"])
def test_calls_sent_while_the_engines_are_paused_are_judged_under_the_weights_that_admitted_them(
        stamps_engines: bool) -> None:
    """The answers-while-paused scenario hands the integration answers while every engine is paused. With engine
    labels the reference sends its next calls at once: SGLang's pause gate holds them and the labels say they ran
    under the new weights. With client-side versions it holds them itself until the cycle published (its own gate):
    none meets SGLang's, and every call counts as sent under the version it records. Both pass."""
    caps = Capabilities(stamps_engines=stamps_engines)
    results = _all_pass(ReferenceIntegration(name=f"gate-{stamps_engines}", capabilities=caps),
                        ["answers-while-paused"])
    h = results["answers-while-paused"].history
    gated = [c for c in h.integration_calls("/generate") if h.gate_cycle(c) is not None]
    assert bool(gated) == stamps_engines and not h.unmet and len(h.cycles) == 2


class CompleteAtBudgetManager(ReferenceManager):
    """Counts a turn answered with abort but with its whole token budget generated as complete, and trains it (the
    abort landed in the step that finished the request: every token is there)."""

    def cut_short(self, turn: Turn) -> bool:
        return turn.finish_reason == "abort" and turn.completion_tokens < self.config.max_new_tokens


async def _abort_with_left(run: Run, left: int) -> WireCall:
    """On a stepped fake backend: stop the clock while a request of the integration's has at least ``left`` tokens
    of its budget to go, step until it has exactly ``left``, abort every engine's requests (the aborted ones
    finish on the next step, decoding one token more), and return that request's call once answered."""
    backend: FakeBackend = run.backend  # type: ignore[assignment]

    def running() -> dict[str, int]:
        return {rid: n for rid, n in backend.tokens_left().items() if n >= left}
    while True:
        await until_in_flight(run, 1)
        await wait_for(lambda: bool(running()), run.deadlines.wait_s, f"a request with {left} token(s) to go")
        async with backend.held():
            if not (candidates := running()):
                continue  # it finished while the clock was being stopped
            rid, n = max(candidates.items(), key=lambda item: item[1])
            await backend.step(n - left)
            assert backend.tokens_left().get(rid) == left, (rid, left, backend.tokens_left())
            await abort_in_flight(run)
        break
    call = next(c for c in generates(run) if isinstance(c.payload, dict) and c.payload.get("rid") == rid)
    await wait_for(lambda: call.t_end is not None, run.deadlines.wait_s, f"the answer to {rid}")
    return call


async def _aborts_at_the_budget(run: Run) -> None:
    """Aborts the engines as a request of the integration's decodes its last token (answered abort, with its whole
    budget), then as another has half its budget to go (cut short), and consumes what the integration made of
    both."""
    await run.start()
    for left in (1, run.rollout.max_new_tokens // 2):
        call = await _abort_with_left(run, left)
        if [cut_short(call.payload, out) for out in call.generate_outputs()] != [left > 1]:
            run.unmet(("I4",), f"{call.payload['rid']}, aborted with {left} token(s) to go, was answered "
                               f"{[finish_type(out) for out in call.generate_outputs()]}")
    await run.drain(run.rollout.buffer_capacity + run.rollout.max_in_flight_groups)


@pytest.mark.parametrize("manager", [CompleteAtBudgetManager, ReferenceManager, KeepsAbortedManager],
                         ids=["trains-complete-aborts", "reference", "keeps-aborted-mutant"])
def test_a_turn_aborted_with_its_whole_budget_generated_may_train_as_complete(
        manager: type[ReferenceManager], monkeypatch: pytest.MonkeyPatch) -> None:
    """SGLang answers abort when the abort lands in the step that decoded a request's last token (placed on that
    token by a stepped fake). A manager that trains such a turn as complete (its whole budget is there) passes I4,
    like the reference that recycles it; one that trains every aborted turn still fails."""
    name = "aborts-at-the-budget"
    monkeypatch.setitem(SCENARIOS, name, Scenario(
        name, "aborts land as requests decode their last token", _aborts_at_the_budget, ("aborted",),
        rollout=replace(DEFAULT_ROLLOUT, batch_size=1, group_size=1, turns=1)))
    stepped = lambda: FakeBackend(FakeBackendConfig(engines=1, tokens_per_second=100.0, stepped=True))  # noqa: E731
    result = run_cases(ReferenceIntegration(name=manager.__name__, manager_cls=manager), stepped, scenarios=[name],
                       deadlines=FAST)[name]
    v = result.verdicts["I4"]
    if manager is KeepsAbortedManager:
        assert v.status == "fail" and "finish_reason abort" in v.witness[0], v.explain()
        return
    assert v.passed and v.metrics["complete_aborts"] >= 1 and v.metrics["aborted_requests"] >= 1, v.explain()
    assert (v.metrics["complete_aborts_trained"] >= 1) is (manager is CompleteAtBudgetManager), v.metrics


class CleansUpAfterPublishingUpdater(ReferenceUpdater):
    """Publishes each version, then cleans up before ``update()`` returns (old checkpoints removed, a log line): the
    manager's calls sent meanwhile record the new version."""

    async def update(self, *args: Any, **kw: Any) -> int:
        version = await super().update(*args, **kw)
        await asyncio.sleep(0.3)  # sleep-ok: the clean-up's own time, the design under test
        return version


@pytest.mark.parametrize("stamps_engines", [False, True], ids=["client-side", "engine-labels"])
def test_work_after_publishing_is_judged_by_the_publish_not_by_update_returning(stamps_engines: bool) -> None:
    """A batch consumed, or a call sent, between the publish and ``update()`` returning carries the new version:
    the first update included (the older candidate is "no version yet")."""
    caps = Capabilities(stamps_engines=stamps_engines)
    _all_pass(ReferenceIntegration(name=f"cleanup-{stamps_engines}", capabilities=caps,
                                   updater_cls=CleansUpAfterPublishingUpdater),
              ["first-drain"])


class NeverUnloadsLora(LoraTransport):
    """Loads each version under a new name and never unloads one (a framework that keeps every adapter: memory is
    its concern, not P7's)."""

    async def unload(self, engines: Any, name: str) -> None:
        return None


def test_a_lora_design_that_never_unloads_passes_p7() -> None:
    results = _all_pass(ReferenceIntegration(name="never-unloads", lora_cls=NeverUnloadsLora), ["lora"])
    v = results["lora"].verdicts["P7"]
    assert v.metrics["unloads"] == 0 and v.metrics["loads"] >= 1, v.metrics


class NoPauseForLoraUpdater(ReferenceUpdater):
    """Loads adapters while the engines generate (an adapter load needs no pause); pauses for full weights."""

    async def update(self, weights: Any = None, *, transport: str = "distributed", lora: Any = None) -> int:
        self._lora_cycle = lora is not None
        return await super().update(weights, transport=transport, lora=lora)

    async def pause_all(self) -> None:
        if not self._lora_cycle:
            await super().pause_all()


def test_a_design_that_never_pauses_for_a_lora_reload_is_not_judged_on_pauses_it_never_needed() -> None:
    results = _all_pass(ReferenceIntegration(name="no-pause-for-lora", updater_cls=NoPauseForLoraUpdater), ["lora"])
    h = results["lora"].history
    assert not list(h.integration_calls("/pause_generation")) and all(c.lora for c in h.cycles)
    assert {"I3", "I6"} <= set(results["lora"].skipped_checks), results["lora"].skipped_checks


def _with_pause_modes(integration: Any, *modes: str) -> Any:
    return replace(integration, name=f"{integration.name}-{'-'.join(modes)}-only",
                   capabilities=replace(integration.capabilities, pause_modes=frozenset(modes)))


def test_a_keep_only_vllm_integration_runs_every_scenario_in_its_own_mode() -> None:
    """vLLM frameworks pause with ``keep`` and declare nothing else: with ``clear_cache=false`` (the vocabulary's
    in_place) the scenarios that ask for retract run in in_place, and pass, instead of being skipped."""
    from conformance.reference import vllm

    keep_only = _with_pause_modes(vllm, "in_place")
    results = run_cases(keep_only, fake_backend_factory(engine="vllm"), deadlines=FAST,
                        scenarios=["steady-disk-retract"])
    bad = {f"{c}-{s}": v.explain() for s, r in results.items() for c, v in r.verdicts.items() if not v.passed}
    assert not bad and not any(r.skipped for r in results.values()), bad
    h = results["steady-disk-retract"].history
    assert {c.sent_as for c in h.integration_calls("/pause_generation")} == {"POST /pause?mode=keep&clear_cache=false"}


def test_a_check_that_needs_the_other_pause_mode_skips_saying_so() -> None:
    retract_only = _with_pause_modes(ReferenceIntegration(name="reference"), "retract")
    result = run_cases(retract_only, fake_backend_factory(), deadlines=FAST,
                       scenarios=["steady-tensor-in_place"])["steady-tensor-in_place"]
    assert result.skipped_checks["C2"] == ("the integration runs this scenario in its only pause mode, retract "
                                           "(declares ['retract']), and C2 needs a pause in in_place")
    assert all(v.passed for v in result.verdicts.values()), {c: v.explain() for c, v in result.verdicts.items()}


class RetriesRefusalsUpdater(ReferenceUpdater):
    """Retries a refused transfer with back-off for ``RETRY_S`` before it raises (real retry budgets run for a
    minute; here scaled down with the deadlines)."""

    RETRY_S = 3.0

    async def transfer(self, *args: Any, **kw: Any) -> Any:
        deadline = asyncio.get_running_loop().time() + self.RETRY_S
        while True:
            try:
                return await super().transfer(*args, **kw)
            except EngineError:
                if asyncio.get_running_loop().time() > deadline:
                    raise
                await asyncio.sleep(0.5)  # sleep-ok: the design's back-off between retries


@pytest.mark.slow  # 8 s of retries: the README command's budget
@pytest.mark.parametrize("budget_s", [None, 6.0], ids=["suite-deadline", "declared-budget"])
def test_an_update_that_retries_for_longer_than_the_suites_deadline_declares_its_budget(budget_s: Any) -> None:
    """With the update deadline at 2 s, an update that retries a refusal for 3 s is a hang, and the witness says how
    to declare the budget; declared (6 s), the cycle fails as the design says and every case passes."""
    caps = replace(default_capabilities(), update_budget_s=budget_s)
    integration = ReferenceIntegration(name=f"retries-{budget_s}", capabilities=caps, updater_cls=RetriesRefusalsUpdater)
    result = run_cases(integration, fake_backend_factory(), scenarios=["failing-transfer-tensor"],
                       deadlines=replace(FAST, update_s=2.0))["failing-transfer-tensor"]
    if budget_s is None:
        assert result.history.breaks and "declare Capabilities.update_budget_s" in result.history.breaks[0].message
        return
    bad = {c: v.explain() for c, v in result.verdicts.items() if not v.passed}
    assert not bad and not result.history.breaks, bad
    assert max(c.t_end - c.t_start for c in result.history.cycles) > RetriesRefusalsUpdater.RETRY_S


def test_a_declared_update_budget_extends_the_deadlines_and_the_case_timeout(pytestconfig: pytest.Config) -> None:
    from conformance.scenarios import DEADLINES
    from conformance.suite import case_timeout_s

    extended = DEADLINES.with_update_budget(DEADLINES.update_s + 60)
    assert (extended.update_s, extended.script_s) == (DEADLINES.update_s + 60, DEADLINES.script_s + 120)
    assert DEADLINES.with_update_budget(1.0) == DEADLINES == DEADLINES.with_update_budget(None)
    assert case_timeout_s(pytestconfig, DEADLINES.update_s + 60) == case_timeout_s(pytestconfig) + 120
    with pytest.raises(ValueError, match="update_budget_s must be a positive number"):
        Capabilities(update_budget_s=0)


def write_checkpoint_marker_last(root: Path, name: str, tensors: Mapping[str, torch.Tensor],
                                 config: Mapping[str, Any]) -> Path:
    """The checkpoint's folder made in place; each file written aside and renamed in, a marker written last (the
    engines are told to load it only once it is there: the reference loads after the writer returned)."""
    staged = write_checkpoint_atomic(root, f".{name}.staged", tensors, config)
    final = root / name
    final.mkdir()
    for file in sorted(staged.iterdir()):
        os.rename(file, final / file.name)
    staged.rmdir()
    (final / "COMPLETE").write_text("")
    return final


def test_a_checkpoint_made_in_place_with_a_marker_written_last_passes_f3() -> None:
    """No engine reads a file that is not complete and final: what F3 holds, whatever the publish protocol."""
    results = _all_pass(ReferenceIntegration(name="marker-last", disk_writer=write_checkpoint_marker_last),
                        ["steady-disk-retract", "slow-engine-disk"])
    fs = results["steady-disk-retract"].history.fs
    assert any(e.kind == "created" and not e.name.startswith(".") for e in fs), fs


def test_an_integration_that_never_pauses_skips_the_scenario_that_needs_its_engines_paused() -> None:
    """A framework that never pauses (and waits for its own answers before each update) cannot be handed answers
    while its engines are paused: the scenario is skipped with that reason instead of holding those answers past the
    update deadline."""
    never = ReferenceIntegration(name="never-pauses", capabilities=default_capabilities(pause_modes=frozenset()))
    result = run_cases(never, fake_backend_factory(), scenarios=["answers-while-paused"],
                       deadlines=FAST)["answers-while-paused"]
    assert result.skipped and "the integration never pauses" in result.skipped, result.skipped


async def _gate_once_the_buffer_is_full(run: Run) -> None:
    """The update with answers held at the wire begins while the producer is blocked on its full buffer (a fast
    engine fills it before the cycle starts): nothing is in flight, so no answer comes until a batch is taken."""
    await run.start()
    manager, wire = run.roles.manager, run.backend.wire
    await wait_for(lambda: manager.buffered_groups == run.rollout.buffer_capacity and not wire.in_flight(),
                             run.deadlines.wait_s, "the producer blocked on its full buffer")
    await run.update(gate=True)
    await run.drain(1)


def test_answers_held_at_a_pause_come_from_a_producer_that_was_blocked_on_its_full_buffer(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The suite takes a batch, as a trainer would, so the producer sends the request whose answer it holds (CI saw
    the wait run out on real vLLM: its turns are short enough to fill the buffer before the cycle began)."""
    name = "gate-after-full-buffer"
    monkeypatch.setitem(SCENARIOS, name, Scenario(
        name, "a gated update once the buffer is full", _gate_once_the_buffer_is_full, (),
        rollout=replace(DEFAULT_ROLLOUT, batch_size=1, group_size=1, turns=1, max_in_flight_groups=1,
                        buffer_capacity=2), needs_pause=True))
    result = run_cases(ReferenceIntegration(), fake_backend_factory(), scenarios=[name], deadlines=FAST)[name]
    assert not result.history.breaks, result.history.breaks  # before the fix: "timed out ... waiting for an answer"
    assert all(v.status != "fail" for v in result.verdicts.values()), \
        {c: v.explain() for c, v in result.verdicts.items()}


class ResyncOnRejoinManager(ReferenceManager):
    """Another style of recovery: an engine that died is synced as soon as it answers again, on the rollout side
    (the last published checkpoint loaded into it, then its label), and rejoins at once, without waiting for the next
    update."""

    def __init__(self, engines: Any, env: Any, **kw: Any) -> None:
        super().__init__(engines, env, **kw)
        self.checkpoints = env.workdir / "checkpoints"
        self.resyncs: set[asyncio.Task[None]] = set()

    def engine_lost(self, engine: Any, error: EngineError) -> bool:
        lost = super().engine_lost(engine, error)
        if lost and not self.resyncs:
            task = asyncio.create_task(self._resync(engine))
            self.resyncs.add(task)
            task.add_done_callback(self.resyncs.discard)
        return lost

    async def _resync(self, engine: Any) -> None:
        async with asyncio.timeout(10):
            while True:  # back when it answers /health (a condition with a deadline)
                try:
                    await engine._call("/health", method="GET")
                    break
                except EngineError:
                    await asyncio.sleep(0.02)
            version = self.weight_version
            await engine.update_weights_from_disk(self.checkpoints / f"v{version}")
            await engine.update_weight_version(str(version))
        self.lost.remove(engine)


def test_an_engine_resynced_as_soon_as_it_rejoins_passes_p9() -> None:
    """P9 judges the weights a restarted engine serves, not when the integration syncs it: loading the last published
    checkpoint into it as soon as it is back, outside any update cycle, passes (using it before: rejoins_unsynced)."""
    caps = default_capabilities(transports=frozenset({"disk"}))
    results = _all_pass(ReferenceIntegration(name="resync-on-rejoin", capabilities=caps,
                                             manager_cls=ResyncOnRejoinManager), ["engine-restarted"])
    h = results["engine-restarted"].history
    restart = next(i for i in h.injected if i.kind == "restart")
    loads = [c for c in h.integration_calls("/update_weights_from_disk", restart.engine) if c.t_start > restart.t]
    assert loads and not any(c.t_start <= loads[0].t_start for c in h.cycles if c.t_start > restart.t), \
        "the restarted engine was synced by the next cycle, not on its own"
    served = [c for c in h.integration_calls("/generate", restart.engine) if c.t_start > loads[0].t_end]
    assert served and results["engine-restarted"].verdicts["P9"].metrics["restarts"] == 1
