"""What an integration declares decides how the suite runs it, never whether it looks green: an abort-only
integration runs and fails I2/I3 with its cost measured, one that never pauses has the pause checks skipped with
that reason, one without multi-turn runs single-turn samples, and one that keeps versions on the client side is
judged against the cycle timeline (and told plainly that its engines were never stamped)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from conformance.cases import fake_backend_factory, run_one
from conformance.interface import Capabilities, Sample
from conformance.reference import ReferenceIntegration, ReferenceManager, ReferenceUpdater
from conformance.reference.transports import TensorTransport
from conformance.scenarios import Deadlines

pytestmark = pytest.mark.cpu
FAST = Deadlines(update_s=5.0, drain_s=5.0, wait_s=5.0, script_s=20.0)


def _integration(name: str, caps: Capabilities, **pieces: Any) -> ReferenceIntegration:
    return ReferenceIntegration(name=name, capabilities=caps, **pieces)


class AbortPauseUpdater(ReferenceUpdater):
    """Pauses in abort mode, as a framework whose engines may drop what was in flight."""

    def __init__(self, *args: Any, pause_mode: str = "abort", **kw: Any) -> None:
        super().__init__(*args, **kw)
        self.pause_mode = "abort"


def test_an_abort_only_integration_runs_and_fails_with_its_cost_measured() -> None:
    caps = Capabilities(pause_modes=frozenset({"abort"}))
    result = run_one("steady-tensor-in_place", _integration("abort-only", caps, updater_cls=AbortPauseUpdater),
                     fake_backend_factory(), deadlines=FAST)
    assert not result.skipped and result.history is not None and result.history.pause_mode == "abort"
    i2, i3 = result.verdicts["I1-I2"], result.verdicts["I3"]
    assert (i2.checker_status, i3.checker_status) == ("fail", "fail"), (i2.explain(), i3.explain())
    assert "pauses in abort mode (mode: 'abort' sent)" in i3.witness[0]
    # every cycle aborted the suite's resident request on every engine (by construction), and the cost of the
    # integration's own requests is measured (how many were in flight at each pause is up to timing)
    h = result.history
    sentinel_aborts = [c for c in h.sentinel_calls() for o in c.generate_outputs()
                       if o["meta_info"]["finish_reason"]["type"] == "abort"
                       and not any(i.excuses(c) for i in h.injected)]
    assert len(sentinel_aborts) == 2 * len(h.cycles), i2.explain()
    assert any("the suite's long-lived request" in w and "it was paused" in w for w in i2.witness), i2.explain()
    m = i2.metrics
    assert m["aborted_request_rate"] == m["aborted_requests"] / m["requests"] and m["aborted_sample_rate"] >= 0
    # the flush contract is about requests resident across a pause: none are under abort-mode pauses
    assert "C2" not in result.verdicts and "abort mode" in result.skip_reason("C2"), result.skip_reason("C2")


class NeverPausingUpdater(ReferenceUpdater):
    """Updates without pausing: SGLang's update then waits for every request in flight (writer lock)."""

    async def pause_all(self) -> None:
        return None

    async def resume_all(self) -> None:
        return None

    def flush_needed(self) -> bool:
        return False


@pytest.mark.slow  # about 8 s: the cycle's first transfer is held at the wire for its bound (nothing pauses)
def test_an_integration_that_never_pauses_has_the_pause_checks_skipped_with_the_reason() -> None:
    caps = Capabilities(pause_modes=frozenset())
    result = run_one("steady-tensor-retract", _integration("never-pauses", caps, updater_cls=NeverPausingUpdater),
                     fake_backend_factory(), deadlines=FAST)
    assert {c: result.skip_reason(c) for c in ("I3", "I6")} == \
        {c: "the integration never pauses (declares no pause mode)" for c in ("I3", "I6")}
    bad = {c: v.explain() for c, v in result.verdicts.items() if not v.passed}
    assert not bad and {"I1-I2", "V1", "V2", "P6"} <= set(result.verdicts), bad
    assert result.verdicts["I1-I2"].metrics["overlap_at_pause"] == 1.0


def test_without_multi_turn_the_samples_are_single_turn() -> None:
    caps = Capabilities(multi_turn=False)
    integration = _integration("single-turn", caps)
    result = run_one("steady-tensor-retract", integration, fake_backend_factory(), deadlines=FAST)
    assert all(v.passed for v in result.verdicts.values()), [v.explain() for v in result.verdicts.values()]
    samples = [s for b in result.history.batches for g in b.batch.groups for s in g.samples]
    assert samples and all(len(s.turns) == 1 for s in samples)
    assert run_one("mixed-versions", integration, fake_backend_factory()).skipped == \
        "integration does not declare capability 'multi_turn'"


class UnstampedUpdater(ReferenceUpdater):
    async def stamp(self, new: int) -> None:
        return None  # versions live on the client side


@pytest.mark.parametrize("scenario", ["staleness", "mixed-versions"])
def test_client_side_versions_are_judged_against_the_cycle_timeline(scenario: str) -> None:
    caps = Capabilities(stamps_engines=False)
    integration = _integration("client-side", caps, updater_cls=UnstampedUpdater)  # the reference manager reads
    # policy_version itself when the integration declares stamps_engines=False
    result = run_one(scenario, integration, fake_backend_factory(), deadlines=FAST)
    for check in ("S2", "S3"):
        if check in result.verdicts:
            assert result.verdicts[check].passed, result.verdicts[check].explain()
    if "V1" in result.verdicts:
        assert result.verdicts["V1"].witness[0].startswith("the engines were never stamped")


def test_client_side_records_that_ignore_earlier_turns_fail_s2() -> None:
    class LastTurnOnly(ReferenceManager):
        def oldest_version(self, samples: list[Sample]) -> tuple[int | None, int]:
            return super().oldest_version([replace(s, turns=s.turns[-1:]) for s in samples])

    integration = _integration("client-side-last-turn", Capabilities(stamps_engines=False),
                               updater_cls=UnstampedUpdater, manager_cls=LastTurnOnly)
    result = run_one("mixed-versions", integration, fake_backend_factory(), deadlines=FAST)
    assert result.verdicts["S2"].checker_status == "fail", result.verdicts["S2"].explain()
    assert "was sent under versions as old as" in result.verdicts["S2"].witness[0]


class FailFastTensorTransport(TensorTransport):
    """Pushes the engines one after the other and raises at the first refusal: the next engine is never called."""

    async def transfer(self, engines, weights, version) -> None:
        payload = await self._staged_for(weights, version)
        for engine in engines:
            await engine.update_weights_from_tensor(payload)
        self._staged = None


class FailFastIntegration(ReferenceIntegration):
    def make_transports(self, env):
        return {**super().make_transports(env), "tensor": FailFastTensorTransport(self.tensor_encoder)}


def test_a_cycle_that_fails_at_the_first_refusal_leaves_the_next_one_unused_without_breaking_the_run() -> None:
    result = run_one("failing-transfer-tensor", FailFastIntegration(name="fail-fast"), fake_backend_factory(),
                     deadlines=FAST)
    h = result.history
    assert h is not None and not h.breaks, [b.message for b in h.breaks]
    refused = [c for c in h.integration_calls("/update_weights_from_tensor") if c.t_start < h.cycles[0].t_end]
    assert [c.engine for c in refused] == [0], refused  # engine 1's refusal was never reached
    bad = {c: v.explain() for c, v in result.verdicts.items() if not v.passed}
    assert not bad, bad


@pytest.mark.slow  # about 12 s: the scenario keeps building its mixed-version group until its bound
def test_a_situation_another_failure_prevents_is_unknown_for_the_check_that_needed_it() -> None:
    """Abort-mode pauses abort every group that spans an update, so no mixed-version group is ever consumed: S2
    answers unknown with that reason, the run is not broken, and the checks that see the abort still fail."""
    caps = Capabilities(pause_modes=frozenset({"abort"}))
    result = run_one("mixed-versions", _integration("abort-only", caps, updater_cls=AbortPauseUpdater),
                     fake_backend_factory(), deadlines=FAST)
    h = result.history
    assert h is not None and not h.breaks, [b.message for b in h.breaks]
    s2 = result.verdicts["S2"]
    assert s2.status == "unknown" and any("no group generated under more than one version" in w for w in s2.witness)
    assert result.verdicts["I3"].status == "fail" and result.verdicts["I1-I2"].status == "fail"


def test_pauses_the_wire_shows_in_abort_mode_skip_c2_with_the_reason_and_fail_i3() -> None:
    """An integration that declares in_place but pauses with an empty body (SGLang: abort): C2 has nothing resident
    to judge, so it is skipped with what the wire showed (never unknown); I3 fails on the mode."""
    from conformance.mutants import MUTANTS

    result = run_one("steady-tensor-in_place", MUTANTS["pause_abort"].integration, fake_backend_factory())
    assert "C2" not in result.verdicts
    assert "took effect in abort mode" in (result.skip_reason("C2") or "")
    assert result.verdicts["I3"].status == "fail"
    reference = run_one("steady-tensor-in_place", ReferenceIntegration(), fake_backend_factory())
    assert reference.verdicts["C2"].status == "pass" and reference.skip_reason("C2") is None


def _partial_rollout_undeclared() -> ReferenceIntegration:
    from conformance.reference import PartialRolloutManager, default_capabilities

    return ReferenceIntegration(name="partial-rollout-undeclared", manager_cls=PartialRolloutManager,
                                capabilities=default_capabilities())


def test_a_capability_the_history_shows_but_the_integration_does_not_declare_is_named_with_what_it_unlocks() -> None:
    """Resumed turns (``Turn.continues``) from an integration that does not declare partial rollout: the result names
    the capability, the witness and the scenario declaring it would run; the reference shows nothing undeclared."""
    result = run_one("aborted-groups", _partial_rollout_undeclared(), fake_backend_factory())
    assert [(u["capability"], u["unlocks"]) for u in result.undeclared] == [("partial_rollout", ["partial-rollout"])]
    assert "Turn.continues" in result.undeclared[0]["evidence"]
    assert run_one("aborted-groups", ReferenceIntegration(), fake_backend_factory()).undeclared == []
