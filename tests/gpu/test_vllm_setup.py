"""The ``vllm`` backend (``gpu.vllm_setup``): vLLM's launch line, its weights read through the weight checker, and the
cases on a pool of engines started as vLLM servers are (here the fake vLLM's drop-in; ``-m vllm`` real vLLM), reset
between scenarios."""

from __future__ import annotations

import asyncio
import hashlib

import pytest

from conformance.cases import run_one
from conformance.mutants import VLLM_MUTANTS
from conformance.reference import vllm as reference
from fakes.vllm import FakeVLLMEngine
from fakes.vllm.engine import CHECKSUM_PREFIX
from gpu.families import family_of, launch_command
from gpu.launch import FAKE_VLLM, VLLM, EngineSpec
from gpu.mutation import mutant_share, run_mutant
from gpu.vllm_setup import VllmSetup
from gpu.weights import EMPTY_DIGEST, checkpoint_view, raw_digests


@pytest.mark.cpu
def test_the_mutant_shares_partition_the_mutants_and_a_bad_share_says_what_to_write() -> None:
    names = sorted(VLLM_MUTANTS)
    shares = [mutant_share(names, f"{k}/3") for k in range(3)]
    assert sorted(n for share in shares for n in share) == names and all(shares)
    assert mutant_share(names, None) == names and mutant_share(names, "") == names
    for bad in ("3/3", "1", "a/3", "-1/3"):
        with pytest.raises(ValueError, match="expected K/N"):
            mutant_share(names, bad)


@pytest.mark.cpu
def test_a_vllm_program_is_launched_with_vllms_flags() -> None:
    spec = EngineSpec(model_path="/m", enable_lora=True, random_seed=3, extra_args=("--enforce-eager",))
    command = launch_command(spec, "127.0.0.1", 8000, VLLM, python="py")
    assert command == ["py", *VLLM, "--model", "/m", "--host", "127.0.0.1", "--port", "8000", "--enable-lora",
                       "--max-lora-rank", "8", "--max-loras", "2", "--seed", "3", "--enforce-eager"]
    fake = launch_command(EngineSpec(model_path="/m", fake_args=("--fake-release", "0.32.0")), "h", 1, FAKE_VLLM)
    assert fake[-2:] == ["--fake-release", "0.32.0"] and "--model" in fake
    assert (family_of(VLLM), family_of(FAKE_VLLM), family_of(("-m", "sglang.launch_server"))) == \
        ("vllm", "vllm", "sglang")


@pytest.mark.cpu
def test_the_weight_checker_shows_the_unfused_parameters_as_sha256_of_their_bytes() -> None:
    """What the vllm backend compares (P6): of the fake vLLM's checksums, those of unfused parameters equal sha256 of
    the trainer's tensors; fused ones and vLLM-on-CPU's empty linear weights are left out."""
    engine = FakeVLLMEngine()
    weights = dict(engine.weights.items())
    checksums = engine.checksums()
    assert all(key.startswith(CHECKSUM_PREFIX) for key in checksums)
    shown = checkpoint_view(checksums, weights)
    assert shown and not any("q_proj" in n or "gate_proj" in n for n in shown)
    assert shown == raw_digests(weights, shown, {})
    assert checkpoint_view({CHECKSUM_PREFIX + n: EMPTY_DIGEST for n in shown}, weights) == {}
    qkv = next(k for k in checksums if "qkv_proj" in k).removeprefix(CHECKSUM_PREFIX)
    rows = b"".join(weights[qkv.replace("qkv_proj", p)].data for p in ("q_proj", "k_proj", "v_proj"))
    assert checksums[CHECKSUM_PREFIX + qkv] == hashlib.sha256(rows).hexdigest()  # q, k, v rows in order
    asyncio.run(engine.aclose())


@pytest.mark.cpu
@pytest.mark.slow  # two engine processes, three scenarios and a mutant (~40 s)
@pytest.mark.timeout(300)
def test_the_cases_run_on_pooled_vllm_servers_reset_between_scenarios_and_p6_judges_their_weights() -> None:
    suite = VllmSetup.with_fake()
    try:
        deadlines = suite.deadlines()
        for scenario in ("steady-disk-retract", "failing-transfer-disk", "lora"):
            result = run_one(scenario, reference, suite.backend_factory(), 0, deadlines)
            assert {c: v.status for c, v in result.verdicts.items() if v.status != "pass"} == {}, scenario
            if scenario != "lora":  # full updates: the trainer's weights digested as the engines show theirs
                assert result.verdicts["P6"].metrics["cycles_checked"] > 0
                assert result.history is not None and result.history.cycles[0].trainer_digest
        killed = run_mutant(VLLM_MUTANTS["vllm_failed_reload_not_restored"], suite.backend_factory(),
                            deadlines=deadlines)
        assert (killed.status, killed.checks) == ("killed", ["P6"]), killed.reason
        stats = suite.pool().stats
        assert stats.leases == 4 and stats.resets + len(stats.discarded) == 4
    finally:
        suite.close()
