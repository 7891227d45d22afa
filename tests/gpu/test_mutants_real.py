"""Every mutant of the reference killed on a real engine on CPU by the checker that kills it on the fake: SGLang's
(``-m sglang``) and vLLM's (``-m vllm``, the vLLM reference's mutants).

The mutants run on the session's real engines (the same pair the conformance cases use, reset between scenarios:
``conformance_session.setup("sglang")`` or ``setup("vllm")``), on the scenarios built to expose them, through
:func:`gpu.mutation.run_mutant` as ``tests/test_mutants.py`` runs them on the fake. A mutant whose scenarios the
real engine on CPU cannot run is skipped with that reason, never passed. ``gpu/scripts/mutant_table.py`` prints the
whole SGLang table per release. CI runs every SGLang one (``.ci/real-sglang.sh``) and a quarter of the vLLM ones,
rotating by commit count (``.ci/real-vllm.sh``; ``WEIGHTSYNC_MUTANT_SHARE=K/N`` limits the vLLM ones to share ``K``
of ``N``: :func:`gpu.mutation.mutant_share`).
"""

from __future__ import annotations

import os

import pytest

from conformance.cases import fake_backend_factory
from conformance.mutants import MUTANTS, VLLM_MUTANTS, Mutant
from gpu.mutation import SHARE_ENV, mutant_share, run_mutant

pytestmark = pytest.mark.timeout(900)


def assert_killed_as_on_the_fake(mutant: Mutant, suite: object, title: str, fake_engine: str, profile: str) -> None:
    """``mutant`` on ``suite``'s real engines: killed, by the same checks as on the fake ``fake_engine``."""
    real = run_mutant(mutant, suite.backend_factory(), why_not=suite.why_not,  # type: ignore[attr-defined]
                      deadlines=suite.deadlines())  # type: ignore[attr-defined]
    if real.status == "skipped":
        pytest.skip(f"{mutant.name} cannot be shown on {title} on CPU: {real.reason}")
    assert real.status == "killed", f"{mutant.name} ({mutant.bug}) {real.status} on {title}: {real.reason}"
    fake = run_mutant(mutant, fake_backend_factory(profile=profile, engine=fake_engine))
    assert real.checks == fake.checks, \
        f"{mutant.name}: killed by {real.checks} on {title}, {fake.checks} on the fake"
    assert not real.failed_without_witness, \
        f"{mutant.name}: cases failed without a witness: {real.failed_without_witness}"


@pytest.mark.sglang
@pytest.mark.parametrize("name", sorted(MUTANTS))
def test_mutant_is_killed_on_real_sglang_as_on_the_fake(name: str, conformance_session) -> None:
    suite = conformance_session.setup("sglang")  # skips with the install command where the environment is missing
    assert_killed_as_on_the_fake(MUTANTS[name], suite, f"real SGLang {suite.release}", "sglang", suite.release)


@pytest.mark.vllm
@pytest.mark.parametrize("name", mutant_share(sorted(VLLM_MUTANTS), os.environ.get(SHARE_ENV)))
def test_vllm_mutant_is_killed_on_real_vllm_as_on_the_fake(name: str, conformance_session) -> None:
    suite = conformance_session.setup("vllm")  # skips with the install command where the environment is missing
    assert_killed_as_on_the_fake(VLLM_MUTANTS[name], suite, f"real vLLM {suite.release}", "vllm",
                                 suite.recorded_profile)
