"""The model an engine serves: `--model-path DIR` read the way SGLang reads it, or the built-in tiny model.

`load_served_model(path, dtype, load_format)` reads a Hugging Face model directory (`config.json` + the weight
files `DefaultModelLoader` picks: safetensors single or sharded, torch `.bin`, what `save_pretrained` writes) and
holds every floating-point parameter in the model dtype SGLang resolves (`configs/model_config.py
_get_and_verify_dtype`, 0.5.23: `--dtype auto` takes `config.json`'s `torch_dtype`/`dtype`, float32 checkpoints are
served in float16, bfloat16 for Gemma), so `/get_model_info`, `/get_server_info` and `/get_weights_by_name`
answer from it. `BUILTIN_MODEL_PATH` names the built-in tiny model (`weights.tiny_model`, a 2-layer Llama in
mixed float32/bfloat16 kept as it is).
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from . import weights as W

BUILTIN_MODEL_PATH = "fake-sglang/tiny-llama"
#: `--dtype` values (`_STR_DTYPE_TO_TORCH_DTYPE` in SGLang's model_config.py) → torch dtype name
DTYPES = {"half": "float16", "float16": "float16", "float": "float32", "float32": "float32", "bfloat16": "bfloat16"}
_FLOATING = ("float64", "float32", "float16", "bfloat16")


class ModelPathError(ValueError):
    """`--model-path` names nothing the fake can serve (one line, for the CLI)."""


@dataclass(frozen=True)
class ServedModel:
    """What one engine serves: its path, weights, `config.json` and the dtype floating parameters are held in."""

    path: str
    weights: W.WeightStore
    config: Mapping[str, Any] = field(default_factory=dict)
    dtype: str | None = None  # None: as stored (the built-in model)

    @property
    def architectures(self) -> list[str]:
        return list(self.config.get("architectures") or ["LlamaForCausalLM"])

    @property
    def model_type(self) -> str:
        return str(self.config.get("model_type") or "llama")


def builtin_model(seed: int = 0) -> ServedModel:
    """The built-in tiny model (the default of every fake engine)."""
    return ServedModel(BUILTIN_MODEL_PATH, W.WeightStore(W.tiny_model(seed)), dict(W.TINY_CONFIG))


def resolve_dtype(config: Mapping[str, Any], dtype: str = "auto") -> str:
    """The dtype SGLang builds the model in for `--dtype` and `config.json` (`_get_and_verify_dtype`)."""
    config_dtype = config.get("dtype") or config.get("torch_dtype") or "float32"
    config_dtype = DTYPES.get(str(config_dtype), str(config_dtype))
    dtype = dtype.lower()
    if dtype != "auto":
        if dtype not in DTYPES:
            raise ModelPathError(f"Unknown dtype: {dtype}")
        return DTYPES[dtype]
    if config_dtype == "float32":
        return "bfloat16" if str(config.get("model_type", "")).startswith("gemma") else "float16"
    return config_dtype if config_dtype in _FLOATING else "float16"


def read_config(path: str) -> dict[str, Any]:
    """`config.json` of a model directory (`{}` when there is none; SGLang would fail to build the model)."""
    config_path = os.path.join(path, "config.json")
    if not os.path.isfile(config_path):
        return {}
    try:
        with open(config_path, "rb") as f:
            config = json.loads(f.read().decode("utf-8"))
    except (OSError, ValueError) as e:
        raise ModelPathError(f"{config_path} cannot be parsed: {e}") from None
    if not isinstance(config, dict):
        raise ModelPathError(f"{config_path} must hold a JSON object")
    return config


def load_served_model(path: str, dtype: str = "auto", load_format: str | None = None, seed: int = 0) -> ServedModel:
    """Read the model directory `path` (or the built-in model for `BUILTIN_MODEL_PATH`). Raises ModelPathError."""
    if path == BUILTIN_MODEL_PATH:
        return builtin_model(seed)
    if not os.path.isdir(path):
        raise ModelPathError(
            f"--model-path {path!r} is not a local directory (real SGLang would try the Hugging Face Hub; the fake "
            f"serves local model directories, or {BUILTIN_MODEL_PATH!r} for its built-in tiny model)")
    config = read_config(path)
    model_dtype = resolve_dtype(config, dtype)
    try:
        blobs = W.load_checkpoint(path, load_format)
    except W.WeightError as e:
        raise ModelPathError(f"cannot load the model at {path!r}: {e}") from None
    held = {name: (blob.astype(model_dtype) if blob.dtype in _FLOATING else blob) for name, blob in blobs.items()}
    return ServedModel(path, W.WeightStore(held), config, model_dtype)
