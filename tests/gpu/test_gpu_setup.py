"""``-m gpu`` as a user meets it: on a machine without GPUs or sglang every case skips with one reason, in seconds;
where it runs, the aborted-sample rate of every scenario is gated by ``--max-aborted-rate``."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from gpu import gpu_setup as gpu_suite
from conformance.dialect import VOCABULARY_PROFILE
from gpu.families import launch_command
from gpu.launch import FAKE, FAKE_VLLM
from gpu.gpu_setup import GpuSetup

pytestmark = pytest.mark.cpu
ROOT = Path(__file__).resolve().parents[2]
SUITE = str(ROOT / "conformance" / "suite")

GPU_AS_FAKE = '''
import pytest
from conformance.cases import fake_backend_factory
from conformance.checks import CHECKS
from conformance.checks.verdict import Verdict
from conformance.scenarios import DEADLINES
from conformance.dialect import VOCABULARY_PROFILE
from gpu.families import launch_command
from gpu.launch import FAKE, FAKE_VLLM
from gpu.gpu_setup import GpuSetup

GpuSetup.skip_reason = lambda self: None          # as on a GPU machine
GpuSetup.backend_factory = lambda self: fake_backend_factory()
GpuSetup.deadlines = lambda self: DEADLINES
RATES = {"steady-disk-retract": 0.5, "steady-disk-in_place": 0.25}

def i1_i2(history):
    return Verdict("I1-I2", "pass", [], {"aborted_sample_rate": RATES[history.scenario]})
CHECKS["I1-I2"] = i1_i2
'''


@pytest.fixture
def run_suite(pytester: pytest.Pytester):
    def run(*args: str) -> pytest.RunResult:
        pytester.chdir()
        pytester._monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(ROOT), str(pytester.path),
                                                                    os.environ.get("PYTHONPATH", "")]))
        pytester._monkeypatch.delenv("RAY_ADDRESS", raising=False)
        return pytester.runpytest_subprocess(SUITE, "-p", "no:cacheprovider", "-n", "0", *args, timeout=120)
    return run


@pytest.mark.slow
def test_without_gpus_every_gpu_case_skips_with_one_reason_in_seconds(run_suite) -> None:
    t0 = time.monotonic()
    result = run_suite("-m", "gpu", "--conformance-nodes", "2", "-rs")
    assert time.monotonic() - t0 < 60
    outcomes = result.parseoutcomes()
    assert outcomes.get("skipped", 0) >= 70 and set(outcomes) <= {"skipped", "deselected"}, outcomes
    reasons = {line.split(": ", 1)[1] for line in result.stdout.lines if line.startswith("SKIPPED [")}
    assert len(reasons) == 1, reasons
    assert "-m gpu needs real SGLang on GPUs: sglang is not installed" in reasons.pop()


@pytest.mark.slow
def test_the_aborted_sample_rate_gates_each_scenario(run_suite, pytester: pytest.Pytester) -> None:
    pytester.makepyfile(gpu_as_fake=GPU_AS_FAKE)
    result = run_suite("-p", "gpu_as_fake", "-m", "gpu",
                       "-k", "I1-I2 and (steady-disk-retract or steady-disk-in_place)",
                       "--conformance-max-aborted-rate", "0.3")
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines(["*aborted_sample_rate 0.5 on steady-disk-retract exceeds --conformance-max-aborted-rate 0.3*"])


@pytest.mark.slow
def test_a_bad_rate_is_a_usage_error(run_suite) -> None:
    result = run_suite("-m", "gpu", "--conformance-max-aborted-rate", "1.5")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*--conformance-max-aborted-rate must be between 0 and 1*"])


def test_the_skip_reason_names_everything_missing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(gpu_suite.importlib.util, "find_spec", lambda name: None)
    monkeypatch.setattr(gpu_suite, "visible_gpus", lambda: 0)
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    reason = GpuSetup(nodes=2).skip_reason()
    assert reason == ("-m gpu needs real SGLang on GPUs: ray is not installed; sglang is not installed; no GPU is "
                      "visible here and no Ray cluster was given (--conformance-ray-address or RAY_ADDRESS) "
                      f"({gpu_suite.INSTALL_HINT})")


def test_an_unusable_cluster_is_an_error_every_time_not_a_skip(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(gpu_suite, "missing_software", lambda *packages: [])

    def refuse(address: str | None) -> None:
        raise ConnectionError(f"could not reach {address}")
    monkeypatch.setattr("gpu.cluster.connect", refuse)
    suite = GpuSetup(nodes=2, ray_address="10.9.9.9:6379")
    for _ in range(2):
        with pytest.raises(RuntimeError, match="cannot use the Ray cluster: ConnectionError: could not reach 10.9.9.9"):
            suite.skip_reason()


@pytest.mark.parametrize(("nodes", "gpu", "memory"), [(1, 0.5, 0.4), (2, 1.0, None), (3, 1.0, None)])
def test_engines_take_a_gpu_each_or_share_one_on_a_node(nodes: int, gpu: float, memory: float | None) -> None:
    for engine, memory_args in (("sglang", ()), ("vllm", ("--gpu-memory-utilization", str(memory)) if memory else ())):
        suite = GpuSetup(nodes=nodes, engine=engine)
        try:
            config = suite.config()
        finally:
            suite.close()
        assert (config.engines, config.nodes) == (max(2, nodes), nodes)
        assert config.resources_per_engine == {"CPU": 1, "GPU": gpu}
        assert config.spec.enable_lora and config.program == suite.launch.program
        assert config.spec.mem_fraction_static == (memory if engine == "sglang" else None)
        transfer = ("--weight-transfer-config", '{"backend": "nccl"}') if engine == "vllm" else ()
        assert config.spec.extra_args == (*suite.launch.flags, *transfer, *memory_args)
        assert set(config.model_files) >= {"config.json", "model.safetensors", "tokenizer.json"}


def test_vllm_runs_with_its_rl_routes_and_a_weight_transfer_engine_and_the_wire_in_the_suites_words() -> None:
    suite = GpuSetup(nodes=2, engine="vllm", profile="0.5.10")
    try:
        config = suite.config()
    finally:
        suite.close()
    command = launch_command(config.spec, "10.0.0.5", 30000, config.program, python="py")
    assert command[:3] == ["py", "-m", "vllm.entrypoints.openai.api_server"]
    assert command[command.index("--weight-transfer-config") + 1] == '{"backend": "nccl"}'
    assert "--enable-scale-out" in command and "--max-model-len" in command
    assert config.env["VLLM_SERVER_DEV_MODE"] == "1" and suite.family == "vllm"
    assert config.profile == VOCABULARY_PROFILE  # vLLM's wire is recorded in SGLang's default release's words


def test_a_simulated_cluster_runs_the_drop_in_fakes_on_the_same_launch_line() -> None:
    for engine, drop_in in (("sglang", FAKE), ("vllm", FAKE_VLLM)):
        real, simulated = (GpuSetup(nodes=2, engine=engine, model_path="/models/tiny", simulate=simulate)
                           for simulate in (False, True))
        try:
            a, b = real.config(), simulated.config()
        finally:
            real.close(), simulated.close()
        assert b.program == drop_in and b.engine_host == "127.0.0.1"
        # the same launch line but the native weight-transfer backend: NCCL on GPUs, gloo in the drop-in fake
        gloo = [arg.replace('"nccl"', '"gloo"') for arg in a.spec.extra_args]
        assert list(b.spec.extra_args) == gloo and b.resources_per_engine == a.resources_per_engine
        assert ('"gloo"' in " ".join(b.spec.extra_args)) is (engine == "vllm")
        assert launch_command(b.spec, "h", 1, b.program)[len(drop_in) + 1:] == \
            [arg.replace('"nccl"', '"gloo"') for arg in launch_command(a.spec, "h", 1, a.program)[len(drop_in) + 1:]] \
            + list(b.spec.fake_args)
        assert (real.why_not("steady-distributed-retract") is None) is (engine == "sglang")
        assert simulated.why_not("steady-distributed-retract") is None and real.why_not("steady-disk-retract") is None


def test_the_simulated_cluster_needs_only_ray(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(gpu_suite, "visible_gpus", lambda: 0)
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    assert GpuSetup(nodes=2, engine="vllm", simulate=True).skip_reason() is None
    monkeypatch.setattr(gpu_suite.importlib.util, "find_spec", lambda name: None)
    assert GpuSetup(nodes=2, simulate=True).skip_reason() == (
        f"-m gpu on a simulated cluster needs Ray: ray is not installed ({gpu_suite.INSTALL_HINT})")


def test_vllm_without_vllm_skips_saying_so(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(gpu_suite.importlib.util, "find_spec", lambda name: None if name == "vllm" else object())
    monkeypatch.setattr(gpu_suite, "visible_gpus", lambda: 0)
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    assert GpuSetup(nodes=2, engine="vllm").skip_reason() == (
        "-m gpu needs real vLLM on GPUs: vllm is not installed; no GPU is visible here and no Ray cluster was given "
        f"(--conformance-ray-address or RAY_ADDRESS) ({gpu_suite.INSTALL_HINT})")


def test_after_engines_failed_to_start_later_scenarios_fail_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    from gpu.backend import EngineFailure, RayBackend

    starts: list[int] = []

    def never_healthy(self) -> None:
        starts.append(1)
        raise EngineFailure("engine 0 did not start: did not answer 200 on /health within 600s")
    monkeypatch.setattr(RayBackend, "start", never_healthy)
    suite = GpuSetup(nodes=2)
    try:
        for _ in range(3):
            with pytest.raises(EngineFailure, match="within 600s"):
                suite.deadlines()  # what the session asks before each scenario (the pool's engines start there)
    finally:
        suite.close()
    assert len(starts) == 1


def test_the_gloo_plugin_installed_into_vllms_environment_names_this_repositorys_register() -> None:
    """``gpu.vllm_cpu``'s installer writes an entry point (``vllm.general_plugins``) that vLLM loads in every process:
    it must name a function of this repository (where the engines' ``PYTHONPATH`` finds it: ``gpu.vllm_setup``)."""
    import importlib

    from gpu.vllm_cpu import GLOO_PLUGIN
    from gpu.vllm_gloo import PLUGIN

    section, entry = GLOO_PLUGIN["entry_points.txt"].splitlines()[:2]
    name, target = (part.strip() for part in entry.split("="))
    module, attr = target.split(":")
    assert section == "[vllm.general_plugins]" and name == PLUGIN
    assert callable(getattr(importlib.import_module(module), attr))
