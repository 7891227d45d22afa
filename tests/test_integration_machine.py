"""Model-based testing of the whole integration: random trainer actions while rollouts run."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import Phase, settings
from hypothesis.stateful import run_state_machine_as_test

from conformance.cases import fake_backend_factory, load_integration
from conformance.history import History
from conformance.interface import Integration
from conformance.machine import integration_machine
from conformance.mutants import MUTANTS
from conformance.reference import HttpEngineClient, ReferenceIntegration

pytestmark = pytest.mark.cpu

BUDGET = settings(max_examples=3, stateful_step_count=6, deadline=None, derandomize=True)


def test_reference_holds_every_invariant_under_random_trainer_actions() -> None:
    machine = integration_machine(load_integration("conformance.reference:integration"), fake_backend_factory())
    run_state_machine_as_test(machine, settings=BUDGET)


def test_a_mutant_fails_and_shrinks_to_a_short_readable_sequence() -> None:
    machine = integration_machine(MUTANTS["publish_before_transfer"].integration, fake_backend_factory())
    with pytest.raises(AssertionError) as failure:
        run_state_machine_as_test(machine, settings=settings(BUDGET, max_examples=10,
                                                             phases=[Phase.generate, Phase.shrink]))
    message = str(failure.value)
    assert "V2" in message or "P1" in message, message


class _RetractPauseClient(HttpEngineClient):
    """Pauses in retract whatever mode the integration was asked to run in (not abort: only I3's comparison with
    the configured mode catches it)."""

    def request_body(self, endpoint: str, payload: Any) -> Any:
        return {**payload, "mode": "retract"} if endpoint == "/pause_generation" else payload


def _failure(integration: Integration, pause_mode: str) -> str:
    machine = integration_machine(integration, fake_backend_factory(), pause_mode=pause_mode)
    with pytest.raises(AssertionError) as failure:
        run_state_machine_as_test(machine, settings=settings(BUDGET, phases=[Phase.generate]))
    return str(failure.value)


def test_the_machine_records_the_history_a_scenario_records() -> None:
    """Set up as every scenario is: the pause mode asked for and whether the engines are stamped are in the
    history, so I3 and S2 judge the model-based run as configured."""
    seen: list[History] = []

    class Recording(integration_machine(load_integration("conformance.reference:integration"),
                                        fake_backend_factory(), pause_mode="in_place")):
        def teardown(self) -> None:
            seen.append(self.history)
            super().teardown()

    run_state_machine_as_test(Recording, settings=settings(BUDGET, max_examples=1, stateful_step_count=1))
    assert [(h.pause_mode, h.stamps_engines) for h in seen] == [("in_place", True)]


def test_the_machine_catches_an_abort_mode_pause() -> None:
    message = _failure(MUTANTS["pause_abort"].integration, "retract")
    assert "[I3 pause mode sent] FAIL" in message and "pauses in abort mode" in message, message


def test_the_machine_catches_a_pause_in_another_mode_than_asked() -> None:
    message = _failure(ReferenceIntegration(name="retract-pauses", client_cls=_RetractPauseClient), "in_place")
    assert "[I3 pause mode sent] FAIL" in message and "asked to run in in_place" in message, message
