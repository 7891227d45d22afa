"""``-m sglang``: the conformance cases on real SGLang on CPU, run from one release's environment.

:class:`SglangSetup` is what the plugin's ``sglang`` backend uses, once per pytest session: it says in one line why
the cases cannot run here (no environment for the release: the install command), else builds the tiny model and
one :class:`gpu.pool.EnginePool` of two engines running ``python -m sglang.launch_server`` from the environment
(:data:`gpu.sglang_cpu.CPU_FLAGS` and :data:`~gpu.sglang_cpu.CPU_ENV`), as local processes
(:class:`gpu.local.LocalBackend`) or, with ``ray=True``, as Ray actors on a simulated 2-node cluster
(:class:`gpu.backend.RayBackend`, same proxy, placement, digests and teardown as ``-m gpu``). Every scenario
borrows the same engines and leaves them reset (:mod:`gpu.reset`).

The reference, its mutants and the fake speak to real SGLang alike (tensors pickled inline, the trainer's gloo group
on 127.0.0.1).
"""

from __future__ import annotations

import importlib
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from fakes.facts import SGLANG as SGLANG_FACTS
from fakes.profiles import DEFAULT_PROFILE

from .launch import FAKE, SGLANG, EngineSpec
from .pool import PooledSetup


def lora_on_cpu(release: str) -> str:
    """Why LoRA scenarios skip on real SGLang ``release`` on CPU: a release not measured serving LoRA there."""
    return (f"real SGLang {release} on CPU was not measured serving LoRA (it needs host memory unpinned and the "
            f"torch-native LoRA backend: measured on {', '.join(SGLANG_FACTS.lora_cpu_releases)}), so its LoRA "
            "scenarios run on the fake, on those releases and on GPUs")


HEALTH_TIMEOUT_S = 300.0
"""Start to ``/health`` 200 is 15–50 s on 2 busy cores; a deadline well past it, far below SGLang's own 600 s."""


@dataclass
class SglangSetup(PooledSetup):
    """The ``sglang`` backend of one pytest session."""

    family: ClassVar[str] = "sglang"
    title: ClassVar[str] = "real SGLang"
    installer: ClassVar[str] = "gpu.sglang_cpu"
    """The module that builds and checks the family's environments (``status``, ``check_release``, ``python_of``)."""
    real_program: ClassVar[tuple[str, ...]] = SGLANG

    release: str = DEFAULT_PROFILE
    venv: str | None = None
    """The environment (default: where ``install`` puts the release's)."""
    ray: bool = False
    seed: int = 0
    engines: int = 2
    health_timeout_s: float = HEALTH_TIMEOUT_S
    program: tuple[str, ...] = SGLANG
    python: str | None = None
    """The interpreter that runs ``program`` (default: the environment's)."""
    enable_lora: bool | None = None
    """Start the engines with LoRA; None: where the release was measured serving it on CPU (the fake: always)."""
    fake_args: tuple[str, ...] = ()
    _skip: str | None = field(default=None, init=False)
    _checked: bool = field(default=False, init=False)

    @classmethod
    def with_fake(cls, profile: str = DEFAULT_PROFILE, tokens_per_second: float = 500.0,
                  **kwargs: Any) -> "SglangSetup":
        """The same set-up with the fake's drop-in (``python -m fakes.launch_server``, the same flags) in place of
        real SGLang: what the CPU tests run."""
        return cls(release=profile, program=FAKE, python=sys.executable, enable_lora=True,
                   fake_args=("--fake-profile", profile, "--fake-tokens-per-second", str(tokens_per_second)),
                   **kwargs)

    def skip_reason(self) -> str | None:
        """Why ``-m <family>`` cannot run here (one line), or None; checked once, in well under a second."""
        if not self._checked:
            self._checked = True
            if self.program == self.real_program:
                env = importlib.import_module(self.installer)
                try:
                    found = env.status(env.check_release(self.release), Path(self.venv) if self.venv else None,
                                       import_check=False)
                except env.InstallError as exc:
                    self._skip = f"-m {self.family}: {exc}"
                    return self._skip
                if not found.usable:
                    self._skip = (f"-m {self.family} needs {self.title} {self.release} on CPU: {found.reason}, "
                                  "then rerun")
                else:
                    self.venv = str(found.venv)
        return self._skip

    def why_not(self, scenario: str) -> str | None:
        """Why ``scenario`` cannot run on this backend (its cases are skipped with it), or None: every scenario that
        needs LoRA, where the engines run without it (real SGLang on CPU)."""
        from conformance.scenarios import SCENARIOS

        needs = getattr(SCENARIOS[scenario], "needs", None) if scenario in SCENARIOS else None
        lora = needs.get("lora") if isinstance(needs, dict) else getattr(needs, "lora", False)
        return lora_on_cpu(self.release) if lora and not self.lora else None

    @property
    def lora(self) -> bool:
        """Whether the engines serve LoRA."""
        return self.release in SGLANG_FACTS.lora_cpu_releases if self.enable_lora is None else self.enable_lora

    # -- engines ---------------------------------------------------------------------------------------------

    def config(self) -> Any:
        """What the engines are started with: the tiny model (written once), the family's CPU flags and environment,
        the environment's interpreter."""
        from .backend import RayBackendConfig
        spec = EngineSpec(model_path=self.tiny_model(), enable_lora=self.lora, random_seed=self.seed,
                          disable_cuda_graph=False, extra_args=self.flags(), fake_args=self.fake_args)
        env = importlib.import_module(self.installer)
        python = self.python or str(env.python_of(Path(self.venv) if self.venv else env.default_venv(self.release)))
        return RayBackendConfig(spec, engines=self.engines, nodes=2, program=self.program, python=python,
                                resources_per_engine={"CPU": 1}, health_timeout_s=self.health_timeout_s,
                                profile=self.recorded_profile, env=self.env(), engine_host="127.0.0.1")

    def flags(self) -> tuple[str, ...]:
        """The launch flags beyond the model and address: SGLang's CPU flags (and LoRA's, on real SGLang)."""
        from .sglang_cpu import CPU_FLAGS, CPU_LORA_FLAGS

        return CPU_FLAGS + (CPU_LORA_FLAGS if self.lora and self.program == SGLANG else ())

    def env(self) -> dict[str, str]:
        """The engines' environment (:data:`gpu.sglang_cpu.CPU_ENV`)."""
        from .sglang_cpu import CPU_ENV

        return dict(CPU_ENV)

    @property
    def recorded_profile(self) -> str:
        """The SGLang release the wire is recorded as: the release itself."""
        return self.release

    def make(self, config: Any) -> Any:
        """Local engine processes, or (``ray``) Ray actors on a simulated 2-node cluster started at the first."""
        if not self.ray:
            from .local import LocalBackend

            return LocalBackend(config)
        from .backend import RayBackend

        self.simulated_cluster(nodes=2, cpus_per_node=1)
        return RayBackend(config)

    def describe(self) -> str:
        where = "Ray actors on a simulated 2-node cluster" if self.ray else "local processes"
        name = "the fake's drop-in" if self.fake_args else self.title
        return f"{name} {self.release} on CPU ({where})"


def from_options(release: str | None = None, venv: str | None = None, ray: bool = False, seed: int = 0) -> SglangSetup:
    """The ``sglang`` row's set-up from its options (:func:`gpu.sglang_cpu.chosen` fills what was not given)."""
    from .sglang_cpu import chosen

    release, venv = chosen(release, venv)
    return SglangSetup(release=release, venv=venv, ray=ray, seed=seed)
