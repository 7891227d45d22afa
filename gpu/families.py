"""Each engine family's real engines: the upper half of its row (``conformance.families.Family.real`` names the
:class:`RealFamily` here): the programs that start it (the real server, the drop-in fake), its launch line, the reset
between scenarios, how its engines' weights are read, its differential and what it cannot run on GPUs. Nothing in
``gpu/`` branches on a family's name: it reads the row of the program it starts (:func:`real_family`)."""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable, Mapping, Sequence

from conformance.families import DEFAULT_FAMILY, FAMILIES
from fakes.facts import VLLM as VLLM_FACTS

from .launch import FAKE, FAKE_VLLM, FAKES, SGLANG, VLLM, EngineSpec, launch_args, vllm_launch_args
from .reset import reset_engine
from .vllm_reset import reset_vllm_engine
from .weights import checkpoint_view, in_thread, read_all_checksums, read_all_digests

Params = Mapping[str, tuple[str, tuple[int, ...]]]


def _vllm_digests(urls: list[str], params: Params, timeout_s: float) -> list[dict[str, str]]:
    """vLLM's weight checker, of the parameters it shows as the checkpoint names them ({} for an engine left without
    weights)."""
    checksums = in_thread(read_all_checksums(urls, timeout_s), timeout_s + 5.0)
    return [checkpoint_view(c, params) for c in checksums]


NO_GLOO_ENGINE = ("the reference reaches vLLM's native weight transfer through a gloo engine (gpu.vllm_gloo), which "
                  "the suite installs into vLLM's CPU environment only: on GPUs vLLM's engine is NCCL's")
"""Why real vLLM on GPUs skips the scenarios whose only transport is the distributed one."""


def native_transfer_only(scenario: str) -> bool:
    """Whether ``scenario``'s full updates go only through the distributed transport (on vLLM: its native weight
    transfer)."""
    from conformance.scenarios import SCENARIOS

    found = SCENARIOS.get(scenario)
    return found is not None and found.full_updates and tuple(found.transport) == ("distributed",)


def _vllm_on_gpus(scenario: str) -> str | None:
    return NO_GLOO_ENGINE if native_transfer_only(scenario) else None


SIMULATED_TOKENS_PER_S = 2000.0
"""The drop-in fakes' decode speed on a simulated cluster (the speed the suite's deadlines are sized for)."""


@dataclass(frozen=True)
class RealFamily:
    """A family's real engines: what it needs on GPU nodes, its program and its drop-in fake (the same launch line),
    the flags and environment beyond its launch line's, and how the backends reset it and read its weights."""

    title: str
    package: str
    """What must be importable on the GPU nodes."""
    program: tuple[str, ...]
    drop_in: tuple[str, ...]
    """The drop-in fake: the same launch line, on a simulated cluster."""
    launch_args: Callable[[EngineSpec, str, int], list[str]]
    fake_release: Callable[[str], tuple[str, ...]]
    """The drop-in fake's flags for the release it behaves as, given the SGLang profile asked for."""
    reset: Callable[..., Awaitable[dict[str, Any]]]
    """Puts one engine back to the pool's initial state between scenarios (``gpu.reset``)."""
    read_digests: Callable[[list[str], Params, float], list[dict[str, str]]]
    """Per engine, the digest of every parameter it shows (urls, the checkpoint's parameters, a timeout)."""
    shows_all_weights: bool = True
    """Its weight reads show every parameter (SGLang's ``/get_weights_by_name``); otherwise only some (vLLM's weight
    checker: fused and empty ones are left out), read at start."""
    flags: tuple[str, ...] = ()
    env: Mapping[str, str] = field(default_factory=dict)
    weight_transfer: tuple[str, str] | None = None
    """The native weight-transfer backend on GPUs and in the drop-in fake (``--weight-transfer-config``)."""
    memory_flag: str | None = None
    """The flag that takes the share of a GPU's memory an engine may use, where engines share a GPU (SGLang's is
    :attr:`gpu.launch.EngineSpec.mem_fraction_static`)."""
    on_gpus: Callable[[str], str | None] | None = None
    """Why a scenario cannot run on its GPUs (None: it can)."""
    fidelity: str | None = None
    """Its differential's ``main(argv) -> int`` (``module:attribute``), where ``gpu.fidelity`` is not its own."""
    keep_pause: tuple[str, str] | None = None
    """The engine's own pause that keeps its requests where they are and the call that resumes it (``POST`` routes
    with their query): what the backends stop its engines with while a resident cycle works before its first call
    reaches them (``WireControl.keep``). None: the suite does not pause them (SGLang's: its ``in_place`` pause is not
    yet measured against the calls an integration sends before its first pause)."""

    @property
    def programs(self) -> tuple[tuple[str, ...], ...]:
        return self.program, self.drop_in

    def fake_args(self, profile: str) -> tuple[str, ...]:
        """The drop-in fake's own flags: the release it behaves as and its decode speed."""
        return (*self.fake_release(profile), "--fake-tokens-per-second", str(SIMULATED_TOKENS_PER_S))


SGLANG_REAL = RealFamily("SGLang", "sglang", SGLANG, FAKE, launch_args, lambda profile: ("--fake-profile", profile),
                         reset_engine, read_all_digests)
VLLM_REAL = RealFamily(
    "vLLM", "vllm", VLLM, FAKE_VLLM, vllm_launch_args, lambda _: ("--fake-release", VLLM_FACTS.default_release),
    reset_vllm_engine, _vllm_digests, shows_all_weights=False,
    # the tiny model's context; no CUDA graphs (seconds of capture for nothing); the token-in/token-out route whose
    # answers carry version spans; the prompt tokens the prefix cache served, in every answer (C3)
    flags=("--max-model-len", "4096", "--enforce-eager", "--enable-scale-out", "--enable-prompt-tokens-details"),
    # the RL routes (/pause, /resume, /update_weight_version, /weight_info, ...) and runtime LoRA
    env={"VLLM_SERVER_DEV_MODE": "1", "VLLM_ALLOW_RUNTIME_LORA_UPDATING": "1"},
    # the native weight-transfer engine: NCCL on GPUs; the drop-in fake serves gloo (no CUDA)
    weight_transfer=("nccl", "gloo"), memory_flag="--gpu-memory-utilization", on_gpus=_vllm_on_gpus,
    fidelity="gpu.fidelity.vllm:main",
    # keep: running requests frozen on their blocks, new ones queued; the cache kept (a pause's clear_cache preempts
    # what runs), so /resume puts back exactly what was there (EngineCore.pause, v1/engine/core.py, 0.32.0)
    keep_pause=("/pause?mode=keep&clear_cache=false", "/resume"))


def family_of(program: Sequence[str]) -> str:
    """The engine family ``program`` starts (real or drop-in fake); a program no row names (a stand-in server) is
    taken for the default family's drop-in (SGLang's launch line)."""
    for family in FAMILIES.values():
        if family.real is not None and tuple(program) in family.load_real().programs:
            return family.name
    return DEFAULT_FAMILY


def real_family(program: Sequence[str]) -> RealFamily:
    """The real-engines row of the family ``program`` starts."""
    return FAMILIES[family_of(program)].load_real()


def launch_command(spec: EngineSpec, host: str, port: int, program: Sequence[str] = SGLANG,
                   python: str = sys.executable) -> list[str]:
    """The full command line: ``python PROGRAM ARGS`` in the program's family's flags (+ the fake's own flags when
    ``program`` is a fake)."""
    command = [python, *program, *real_family(program).launch_args(spec, host, port)]
    return command + list(spec.fake_args) if tuple(program) in FAKES else command
