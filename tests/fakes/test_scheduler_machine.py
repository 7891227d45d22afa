"""Hypothesis state machine over the pure ``Scheduler``: random submit/step/pause/resume/abort/version/flush."""

from __future__ import annotations

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from fakes.clock import ManualClock
from fakes.scheduler import FINISHED, RUNNING, WAITING, Request, Scheduler

pytestmark = pytest.mark.cpu

CAPACITY = 3
MACHINE_SETTINGS = settings(max_examples=30, stateful_step_count=30, deadline=None)


class SchedulerMachine(RuleBasedStateMachine):
    """The model: which requests were submitted, how many final outcomes each got, the version set last."""

    profile = "0.5.23"

    def __init__(self) -> None:
        super().__init__()
        self.s = Scheduler(self.profile, max_running_requests=CAPACITY, clock=ManualClock(), seed=0)
        self.outcomes: dict[Request, int] = {}
        self.gate_closed = False  # tokenizer-side pause: nothing new reaches the scheduler
        self.version = "default"
        self.versions = {"default"}
        self.count = 0

    def _finished(self, reqs) -> None:
        for req in reqs:
            assert req.state == FINISHED and req.finish_reason is not None
            self.outcomes[req] += 1

    @initialize()
    def start(self) -> None:
        assert self.s.live() == []

    # -- rules --------------------------------------------------------------------------------------
    @precondition(lambda self: not self.gate_closed and not self.s.paused)
    @rule(max_new_tokens=st.integers(0, 5), prefix=st.sampled_from(["r", "r1", "x"]), stop=st.booleans())
    def submit(self, max_new_tokens: int, prefix: str, stop: bool) -> None:
        req = Request(
            rid=f"{prefix}{self.count}",
            input_ids=[1, 2, 3],
            max_new_tokens=max_new_tokens,
            stop_token_ids=tuple(range(32, 60)) if stop else (),
        )
        self.count += 1
        self.outcomes[req] = 0
        self.s.submit(req)

    @rule()
    def step(self) -> None:
        tokens_before = sum(len(r.output_ids) for r in self.outcomes)
        paused = self.s.paused
        result = self.s.step()
        tokens_after = sum(len(r.output_ids) for r in self.outcomes)
        if paused:
            assert result.admitted == result.emitted == result.finished == ()
            assert tokens_after == tokens_before, "a token was produced while paused"
        for req in result.emitted + result.finished:
            if req.output_ids and req in result.emitted:
                assert req.token_versions[-1] == self.s.version
        self._finished(result.finished)

    @rule(mode=st.sampled_from(["in_place", "retract"]))
    def pause(self, mode: str) -> None:
        before = {r: len(r.output_ids) for r in self.s.running}
        retracted = self.s.pause(mode)
        if mode == "retract":
            assert set(retracted) == set(before) and self.s.running == []
            assert all(len(r.output_ids) == before[r] for r in retracted)  # retraction keeps tokens

    @rule()
    def pause_abort(self) -> None:
        """``pause(mode="abort")``: the tokenizer gate closes and everything in the scheduler is aborted."""
        self.gate_closed = True
        self._finished(self.s.abort(abort_all=True))

    @rule()
    def resume(self) -> None:
        self.s.resume()
        self.gate_closed = False

    @precondition(lambda self: any(not r.finished for r in self.outcomes))
    @rule(data=st.data())
    def abort_prefix(self, data: st.DataObject) -> None:
        rid = data.draw(st.sampled_from(sorted(r.rid for r in self.outcomes)))
        prefix = rid[: data.draw(st.integers(1, len(rid)))]
        hit_waiting = {r for r in self.s.waiting if r.rid.startswith(prefix)}
        done = self.s.abort(prefix)
        assert set(done) == hit_waiting
        self._finished(done)

    @rule()
    def abort_all(self) -> None:
        self._finished(self.s.abort(abort_all=True))
        assert self.s.waiting == [] and all(r.abort_pending for r in self.s.running)

    @rule(version=st.sampled_from(["1", "2", "3"]))
    def set_version(self, version: str) -> None:
        self.s.set_version(version, "machine")
        self.version = version
        self.versions.add(version)

    @rule()
    def flush(self) -> None:
        profile = self.s.profile
        paused_ignores = profile.flush_ignores_waiting_while_paused and self.s.paused
        ignore_waiting = not profile.flush_checks_waiting or paused_ignores
        expected = not self.s.running and (ignore_waiting or not self.s.waiting)
        assert self.s.is_idle_for_flush() is expected

    # -- invariants ------------------------------------------------------------------------------------
    @invariant()
    def running_within_capacity(self) -> None:
        assert len(self.s.running) <= CAPACITY

    @invariant()
    def every_request_in_exactly_one_place(self) -> None:
        live = self.s.live()
        assert len(live) == len(set(live))
        for req, outcomes in self.outcomes.items():
            if req in self.s.running:
                assert req.state == RUNNING and outcomes == 0
            elif req in self.s.waiting:
                assert req.state == WAITING and outcomes == 0
            else:
                assert req.state == FINISHED and outcomes == 1, (req.rid, req.state, outcomes)

    @invariant()
    def version_changes_only_through_set_version(self) -> None:
        assert self.s.version == self.version
        for req in self.outcomes:
            assert set(req.token_versions) <= self.versions

    @invariant()
    def never_more_tokens_than_asked(self) -> None:
        """Even the extra decode step of an abort stays within ``max_new_tokens`` (a running request is
        always below it)."""
        for req in self.outcomes:
            assert len(req.output_ids) <= req.max_new_tokens

    def teardown(self) -> None:
        """Drain: after resume every submitted request reaches exactly one final outcome."""
        self.s.resume()
        for _ in range(200):
            if not self.s.has_work():
                break
            self._finished(self.s.step().finished)
        assert not self.s.has_work()
        assert all(n == 1 for n in self.outcomes.values()), {r.rid: n for r, n in self.outcomes.items()}


class SchedulerMachine0523(SchedulerMachine):
    profile = "0.5.23"


class SchedulerMachine0510(SchedulerMachine):
    profile = "0.5.10"


class SchedulerMachine054(SchedulerMachine):
    profile = "0.5.4"


TestScheduler0523 = SchedulerMachine0523.TestCase
TestScheduler0510 = SchedulerMachine0510.TestCase
TestScheduler054 = SchedulerMachine054.TestCase
for _case in (TestScheduler0523, TestScheduler0510, TestScheduler054):
    _case.settings = MACHINE_SETTINGS
del _case
