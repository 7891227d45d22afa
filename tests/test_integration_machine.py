"""Model-based testing of the whole integration: random trainer actions while rollouts run."""

from __future__ import annotations

import pytest
from hypothesis import Phase, settings
from hypothesis.stateful import run_state_machine_as_test

from conformance.cases import fake_backend_factory, load_integration
from conformance.machine import integration_machine
from conformance.mutants import MUTANTS

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
