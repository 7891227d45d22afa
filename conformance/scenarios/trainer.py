"""The stand-in trainer of every scenario: deterministic weights and LoRA adapters per step (torch, seeded)."""

from __future__ import annotations

from typing import Any, Mapping

from ..interface import LoraAdapter


class Trainer:
    """A stand-in trainer: deterministic new weights per step, over the engines' own parameter names."""

    def __init__(self, initial: Mapping[str, Any], seed: int) -> None:
        self.initial, self.seed = dict(initial), seed

    def weights(self, step: int) -> dict[str, Any]:
        import torch

        gen = torch.Generator().manual_seed(self.seed * 1000 + step)
        return {n: (t.float() + 0.01 * step * torch.randn(t.shape, generator=gen)).to(t.dtype)
                for n, t in self.initial.items()}

    def poisoned(self, step: int) -> dict[str, Any]:
        """Weights the engines must reject: the last parameter has the wrong shape (a transfer in buckets lands
        its early buckets before the failure)."""
        import torch

        weights = self.weights(step)
        name = list(weights)[-1]
        weights[name] = torch.zeros(*(d + 1 for d in weights[name].shape), dtype=weights[name].dtype)
        return weights

    def lora(self, step: int, rank: int = 2) -> LoraAdapter:
        import torch

        gen = torch.Generator().manual_seed(self.seed * 1000 + step)
        q_proj = next(n for n in self.initial if "q_proj" in n)
        out_dim, in_dim = self.initial[q_proj].shape
        prefix = "base_model.model." + q_proj.removesuffix(".weight")
        return LoraAdapter(name="policy", config={"r": rank, "lora_alpha": 2 * rank, "target_modules": ["q_proj"],
                                                  "peft_type": "LORA"},
                           tensors={f"{prefix}.lora_A.weight": torch.randn(rank, in_dim, generator=gen),
                                    f"{prefix}.lora_B.weight": torch.randn(out_dim, rank, generator=gen)})
