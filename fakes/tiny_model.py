"""The built-in tiny model: a deterministic 2-layer Llama (``TINY_SPEC``, ``TINY_CONFIG``, ``tiny_model``), its
deterministic "weights after training step N" (``perturbed``) and a tiny LoRA for it (``tiny_lora``); no torch."""

from __future__ import annotations

import functools
import math
import random
from collections.abc import Mapping
from typing import Any

from .dtypes import _FLOATS, _INTS, _fp8_table, _numel
from .tensors import TensorBlob, _as_blob


_VOCAB, _HIDDEN, _KV, _INTER, _LAYERS = 64, 16, 8, 32, 2


def _tiny_spec() -> dict[str, tuple[str, tuple[int, ...]]]:
    spec: dict[str, tuple[str, tuple[int, ...]]] = {"model.embed_tokens.weight": ("float32", (_VOCAB, _HIDDEN))}
    for i in range(_LAYERS):
        p = f"model.layers.{i}."
        spec[p + "self_attn.q_proj.weight"] = ("bfloat16", (_HIDDEN, _HIDDEN))
        spec[p + "self_attn.k_proj.weight"] = ("bfloat16", (_KV, _HIDDEN))
        spec[p + "self_attn.v_proj.weight"] = ("bfloat16", (_KV, _HIDDEN))
        spec[p + "self_attn.o_proj.weight"] = ("bfloat16", (_HIDDEN, _HIDDEN))
        spec[p + "mlp.gate_proj.weight"] = ("bfloat16", (_INTER, _HIDDEN))
        spec[p + "mlp.up_proj.weight"] = ("bfloat16", (_INTER, _HIDDEN))
        spec[p + "mlp.down_proj.weight"] = ("bfloat16", (_HIDDEN, _INTER))
        spec[p + "input_layernorm.weight"] = ("float32", (_HIDDEN,))
        spec[p + "post_attention_layernorm.weight"] = ("float32", (_HIDDEN,))
    spec["model.norm.weight"] = ("float32", (_HIDDEN,))
    spec["lm_head.weight"] = ("float32", (_VOCAB, _HIDDEN))
    return spec


#: name -> (dtype, shape) of ``tiny_model``: a trainer with torch builds the same parameters from this.
TINY_SPEC: dict[str, tuple[str, tuple[int, ...]]] = _tiny_spec()

#: the ``config.json`` written next to a tiny checkpoint (a 2-layer Llama).
TINY_CONFIG = _TINY_CONFIG = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": _HIDDEN,
    "intermediate_size": _INTER,
    "num_hidden_layers": _LAYERS,
    "num_attention_heads": 2,
    "num_key_value_heads": 1,
    "vocab_size": _VOCAB,
    "max_position_embeddings": 256,
    "rms_norm_eps": 1e-6,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
}


def tiny_model(seed: int = 0) -> dict[str, TensorBlob]:
    """A tiny deterministic Llama-shaped model (``TINY_SPEC``; float32 + bfloat16, 21 tensors, 17.3 KiB); no torch.
    A new dict each call (of immutable blobs, built once per seed: every fake engine starts from it)."""
    return dict(_tiny_model(seed))


@functools.lru_cache(maxsize=8)
def _tiny_model(seed: int) -> dict[str, TensorBlob]:
    out = {}
    for name, (dtype, shape) in TINY_SPEC.items():
        rng = random.Random(f"tiny:{seed}:{name}")
        n = _numel(shape)
        if name.endswith("norm.weight"):
            values = [1.0 + 0.05 * rng.gauss(0.0, 1.0) for _ in range(n)]
        else:
            values = [0.02 * rng.gauss(0.0, 1.0) for _ in range(n)]
        out[name] = TensorBlob.from_values(dtype, shape, values)
    return out


def perturbed(blobs: Mapping[str, Any], step: int, seed: int = 0) -> dict[str, TensorBlob]:
    """Deterministic "weights after training step ``step``": a pure function of (blobs, step, seed), no torch.

    Every step (0 included) gives weights different from ``blobs`` and from every other step. Floats get
    ``x + 0.01 * N(0, 1)`` rounded to their dtype; ints ``+ 1 + step`` (wrapping); bools flip where a
    seeded coin says so; float8 flips the mantissa LSB of finite values. Same names, dtypes, shapes."""
    out = {}
    for name, value in blobs.items():
        blob = _as_blob(value, name)
        rng = random.Random(f"perturb:{seed}:{step}:{name}")
        if blob.dtype in _FLOATS:
            values = [v + 0.01 * rng.gauss(0.0, 1.0) for v in blob.values()]
            new = TensorBlob.from_values(blob.dtype, blob.shape, values)
            if new.data == blob.data and blob.numel:  # all rounded back: force a change
                values[0] = blob.values()[0] + (1.0 if math.isfinite(values[0]) else 0.0)
                new = TensorBlob.from_values(blob.dtype, blob.shape, values)
        elif blob.dtype in _INTS:
            new = TensorBlob.from_values(blob.dtype, blob.shape, [v + 1 + step for v in blob.values()])
        elif blob.dtype == "bool":
            flips = [rng.random() < 0.5 for _ in range(blob.numel)]
            if blob.numel and not any(flips):
                flips[0] = True
            new = TensorBlob.from_values("bool", blob.shape, [v != f for v, f in zip(blob.values(), flips)])
        else:  # float8: flip the mantissa LSB of finite, non-max codes
            table = _fp8_table(blob.dtype)
            data = bytearray(blob.data)
            for i, b in enumerate(data):
                if math.isfinite(table[b]) and math.isfinite(table[b ^ 1]) and rng.random() < 0.5:
                    data[i] = b ^ 1
            new = TensorBlob(blob.dtype, blob.shape, bytes(data))
        out[name] = new
    return out


def tiny_lora(seed: int = 0, r: int = 4) -> dict[str, TensorBlob]:
    """A deterministic rank-``r`` LoRA (q_proj, v_proj) for ``tiny_model``, PEFT tensor names, float32."""
    out = {}
    for i in range(_LAYERS):
        for proj, out_dim in (("q_proj", _HIDDEN), ("v_proj", _KV)):
            base = f"base_model.model.model.layers.{i}.self_attn.{proj}"
            for part, shape in (("lora_A", (r, _HIDDEN)), ("lora_B", (out_dim, r))):
                rng = random.Random(f"lora:{seed}:{base}.{part}")
                out[f"{base}.{part}.weight"] = TensorBlob.from_values(
                    "float32", shape, [0.02 * rng.gauss(0.0, 1.0) for _ in range(_numel(shape))])
    return out
