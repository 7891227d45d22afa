"""The stand-in trainer of every scenario: deterministic weights and LoRA adapters per step, seeded.

Its tensors are ``torch.Tensor`` where torch is installed (what a framework's trainer hands its transports), else
``fakes.weights.TensorBlob`` made with the stdlib (the base install: the reference then declares no distributed
transport, the one that needs torch).
"""

from __future__ import annotations

import random
from typing import Any, Mapping

from fakes.weights import TensorBlob, WeightStore, perturbed

from ..interface import LoraAdapter


def _torch() -> Any | None:
    """The torch module, or None where it is not installed."""
    try:
        import torch
    except ModuleNotFoundError:
        return None
    return torch


class Trainer:
    """A stand-in trainer: deterministic new weights per step, over the engines' own parameter names.

    ``initial`` holds torch tensors or ``TensorBlob``\\ s; with torch installed every tensor it hands out is a torch
    tensor (computed with torch), else a ``TensorBlob`` (``fakes.weights.perturbed``)."""

    def __init__(self, initial: Mapping[str, Any], seed: int) -> None:
        self.torch = _torch()
        if self.torch is None:
            self.initial: dict[str, Any] = dict(WeightStore(initial))
        else:
            self.initial = {n: t.to_torch() if isinstance(t, TensorBlob) else t for n, t in initial.items()}
        self.seed = seed

    def weights(self, step: int) -> dict[str, Any]:
        torch = self.torch
        if torch is None:
            return perturbed(self.initial, step, self.seed)
        gen = torch.Generator().manual_seed(self.seed * 1000 + step)
        return {n: (t.float() + 0.01 * step * torch.randn(t.shape, generator=gen)).to(t.dtype)
                for n, t in self.initial.items()}

    def poisoned(self, step: int) -> dict[str, Any]:
        """Weights the engines must reject: the last parameter has the wrong shape (a transfer in buckets lands
        its early buckets before the failure)."""
        weights = self.weights(step)
        name = list(weights)[-1]
        last = weights[name]
        shape = tuple(d + 1 for d in last.shape)
        weights[name] = TensorBlob.zeros(last.dtype, shape) if self.torch is None else \
            self.torch.zeros(*shape, dtype=last.dtype)
        return weights

    def lora(self, step: int, rank: int = 2) -> LoraAdapter:
        """A rank-``rank`` adapter of the first layer's q_proj and v_proj (SGLang stacks q, k and v: an adapter with
        q_proj needs v_proj, ``lora/lora.py`` normalize_qkv_proj), seeded by the step."""
        q_proj = next(n for n in self.initial if "q_proj" in n)
        shapes = {}
        for name in (q_proj, q_proj.replace("q_proj", "v_proj")):
            out_dim, in_dim = self.initial[name].shape
            prefix = "base_model.model." + name.removesuffix(".weight")
            shapes.update({f"{prefix}.lora_A.weight": (rank, in_dim), f"{prefix}.lora_B.weight": (out_dim, rank)})
        return LoraAdapter(name="policy", config={"r": rank, "lora_alpha": 2 * rank,
                                                  "target_modules": ["q_proj", "v_proj"], "peft_type": "LORA"},
                           tensors=self._gaussian(shapes, step))

    def _gaussian(self, shapes: Mapping[str, tuple[int, ...]], step: int) -> dict[str, Any]:
        """Standard-normal float32 tensors of these shapes, seeded by (seed, step)."""
        torch = self.torch
        if torch is None:
            rng = random.Random(f"lora:{self.seed}:{step}")
            return {name: TensorBlob.from_values("float32", shape, [rng.gauss(0.0, 1.0)
                                                                    for _ in range(shape[0] * shape[1])])
                    for name, shape in shapes.items()}
        gen = torch.Generator().manual_seed(self.seed * 1000 + step)
        return {name: torch.randn(*shape, generator=gen) for name, shape in shapes.items()}
