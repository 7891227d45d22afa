"""Every mutant of the reference killed on real SGLang on CPU by the checker that kills it on the fake (``-m sglang``).

The mutants run on the session's real engines (the same pair the conformance cases use, reset between scenarios:
``conformance_session.setup("sglang")``), on the scenarios built to expose them, through :func:`gpu.mutation.run_mutant`
as ``tests/test_mutants.py`` runs them on the fake. A mutant whose scenarios real SGLang on CPU cannot run is
skipped with that reason, never passed. ``gpu/scripts/mutant_table.py`` prints the whole table per release.
CI runs every one of them (``.ci/real-sglang.sh``).
"""

from __future__ import annotations

import pytest

from conformance.cases import fake_backend_factory
from conformance.mutants import MUTANTS
from gpu.mutation import run_mutant

pytestmark = [pytest.mark.sglang, pytest.mark.timeout(900)]


@pytest.mark.parametrize("name", sorted(MUTANTS))
def test_mutant_is_killed_on_real_sglang_as_on_the_fake(name: str, conformance_session) -> None:
    suite = conformance_session.setup("sglang")  # skips with the install command where the environment is missing
    mutant = MUTANTS[name]
    real = run_mutant(mutant, suite.backend_factory(), why_not=suite.why_not,
                      deadlines=suite.deadlines())
    if real.status == "skipped":
        pytest.skip(f"{name} cannot be shown on real SGLang on CPU: {real.reason}")
    assert real.status == "killed", f"{name} ({mutant.bug}) {real.status} on real SGLang {suite.release}: " \
                                    f"{real.reason}"
    fake = run_mutant(mutant, fake_backend_factory(profile=suite.release))
    assert real.checks == fake.checks, f"{name}: killed by {real.checks} on real SGLang, {fake.checks} on the fake"
    assert not real.failed_without_witness, f"{name}: cases failed without a witness: {real.failed_without_witness}"

