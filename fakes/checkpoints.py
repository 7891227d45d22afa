"""Checkpoint directories as a trainer writes them and SGLang's ``DefaultModelLoader`` reads them
(``/update_weights_from_disk``, ``--model-path``): ``save_checkpoint`` / ``load_checkpoint`` (safetensors single or
sharded with ``model.safetensors.index.json``, torch ``.bin``), and PEFT LoRA adapter directories
(``save_lora_adapter`` / ``load_lora_adapter``, ``/load_lora_adapter``)."""

from __future__ import annotations

import glob
import json
import math
import os
import struct
from collections.abc import Mapping
from typing import Any

from .safetensors_format import _MAX_HEADER, _safetensors_layout, _st_error, encode_safetensors
from .tensors import TensorBlob, _as_blobs
from .tiny_model import _TINY_CONFIG
from .weight_errors import CheckpointError, WeightError


SAFE_WEIGHTS_INDEX_NAME = "model.safetensors.index.json"
#: load_format values the fake understands (None means "auto").
SUPPORTED_LOAD_FORMATS = ("auto", "safetensors", "pt")
# SGLang's DefaultModelLoader._prepare_weights: glob patterns per load_format; fall_back_to_pt adds "*.pt".
_PATTERNS = {"auto": ["*.safetensors", "*.bin", "*.pt"], "safetensors": ["*.safetensors", "*.pt"], "pt": ["*.pt"]}
# filter_files_not_needed_for_inference
_BIN_BLACKLIST = ("training_args.bin", "optimizer.bin", "optimizer.pt", "scheduler.pt", "scaler.pt")


def _write_bytes(path: str, data: bytes) -> None:
    with open(path, "wb") as f:
        f.write(data)


def _config_for(blobs: Mapping[str, TensorBlob]) -> dict:
    config = dict(_TINY_CONFIG)
    embed = blobs.get("model.embed_tokens.weight")
    if embed is not None and len(embed.shape) == 2:
        config["vocab_size"], config["hidden_size"] = embed.shape
    layers = {int(n.split(".")[2]) for n in blobs if n.startswith("model.layers.") and n.split(".")[2].isdigit()}
    config["num_hidden_layers"] = (max(layers) + 1) if layers else 0
    dtypes = {b.dtype for b in blobs.values()}
    config["torch_dtype"] = "bfloat16" if "bfloat16" in dtypes else (sorted(dtypes)[0] if dtypes else "float32")
    return config


def _shard(names: list[str], shards: int) -> list[list[str]]:
    groups: list[list[str]] = [[] for _ in range(shards)]
    per = math.ceil(len(names) / shards) if names else 0
    for i, name in enumerate(names):
        groups[min(i // per, shards - 1) if per else 0].append(name)
    return groups


def save_checkpoint(path: str, blobs: Mapping[str, Any], fmt: str = "safetensors", shards: int = 1, *,
                    filename: str | None = None, config: Mapping | None = None) -> None:
    """Write a checkpoint directory the way a Hugging Face trainer does (``save_pretrained``):

    * ``fmt="safetensors"``: ``model.safetensors`` (metadata ``{"format": "pt"}``), or with ``shards=N > 1``
      ``model-0000i-of-0000N.safetensors`` + ``model.safetensors.index.json`` (stdlib writer).
    * ``fmt="pt"``: ``pytorch_model.bin`` via ``torch.save`` (``safe_serialization=False``), or shards
      ``pytorch_model-0000i-of-0000N.bin`` + ``pytorch_model.bin.index.json``. Note: SGLang's
      ``load_format="pt"`` globs ``*.pt`` only; a ``.bin`` checkpoint loads with ``None``/``"auto"``.
    * ``filename`` (``shards == 1`` only) overrides the weight file name (e.g. ``"model.pt"``).
    * always a ``config.json`` (``config`` or a minimal Llama config inferred from the names).

    Files are written in place, not atomically (a reader racing the writer sees a partial checkpoint)."""
    if fmt not in ("safetensors", "pt"):
        raise ValueError(f"fmt must be 'safetensors' or 'pt', got {fmt!r}")
    if shards < 1:
        raise ValueError(f"shards must be >= 1, got {shards}")
    if filename is not None and shards != 1:
        raise ValueError("filename is only for single-file checkpoints")
    items = _as_blobs(blobs)
    _write_weight_files(path, items, fmt, shards, filename)
    cfg = dict(config) if config is not None else _config_for(items)
    _write_bytes(os.path.join(path, "config.json"), json.dumps(cfg, indent=2).encode())


def _write_weight_files(path: str, items: dict[str, TensorBlob], fmt: str, shards: int, filename: str | None) -> None:
    os.makedirs(path, exist_ok=True)
    stem, ext = ("model", "safetensors") if fmt == "safetensors" else ("pytorch_model", "bin")
    if shards == 1:
        files = {filename or f"{stem}.{ext}": list(items)}
    else:
        files = {f"{stem}-{i + 1:05d}-of-{shards:05d}.{ext}": group
                 for i, group in enumerate(_shard(list(items), shards))}
    for fname, names in files.items():
        part = {n: items[n] for n in names}
        target = os.path.join(path, fname)
        if fmt == "safetensors":
            _write_bytes(target, encode_safetensors(part, {"format": "pt"}))
        else:
            import torch  # lazy

            torch.save({n: b.to_torch() for n, b in part.items()}, target)
    if shards > 1:
        index = {"metadata": {"total_size": sum(b.nbytes for b in items.values())},
                 "weight_map": {n: fname for fname, names in files.items() for n in names}}
        index_name = SAFE_WEIGHTS_INDEX_NAME if fmt == "safetensors" else "pytorch_model.bin.index.json"
        _write_bytes(os.path.join(path, index_name), json.dumps(index, indent=2, sort_keys=True).encode())


def _load_torch_file(path: str) -> dict[str, TensorBlob]:
    fname = os.path.basename(path)
    try:
        import torch  # lazy
    except ImportError:
        raise CheckpointError(f"{fname}: reading torch checkpoints needs torch, which is not installed") from None
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # noqa: BLE001 - any unpickling failure is a bad checkpoint
        first = str(e).strip().splitlines()[0] if str(e).strip() else ""
        raise CheckpointError(
            f"{fname}: cannot be read by torch.load ({type(e).__name__}: {first}); "
            f"truncated or still being written?", stage="load") from None
    if not isinstance(state, Mapping):
        raise CheckpointError(f"{fname}: expected a state dict (name -> tensor), got {type(state).__name__}")
    out = {}
    for name, tensor in state.items():
        if not isinstance(tensor, torch.Tensor):
            raise CheckpointError(f"{fname}: entry {name!r} is a {type(tensor).__name__}, not a tensor")
        try:
            out[str(name)] = TensorBlob.from_torch(tensor)
        except WeightError as e:
            raise CheckpointError(f"{fname}: tensor {name!r}: {e}") from None
    return out


def _load_safetensors_file(path: str) -> dict[str, TensorBlob]:
    """Read one safetensors file: the header, then each tensor's bytes straight from the file (one copy, no
    per-element decoding)."""
    fname = os.path.basename(path)
    try:
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            prefix = f.read(8)
            if len(prefix) == 8:
                (n,) = struct.unpack("<Q", prefix)
                if n <= _MAX_HEADER and 8 + n <= size:
                    prefix += f.read(n)
            start, entries, _ = _safetensors_layout(prefix, size, fname)
            f.seek(start)
            out = {}
            for begin, end, name, dtype, shape in entries:
                data = f.read(end - begin)
                if len(data) != end - begin:
                    raise _st_error(fname, "incomplete metadata, file not fully covered",
                                    "the file shrank while being read; still being written?")
                out[name] = TensorBlob(dtype, shape, data)
            return out
    except OSError as e:
        raise CheckpointError(f"{fname}: cannot be read: {e}") from None


def load_checkpoint(path: str, load_format: str | None = None, *, strict: bool = False,
                    missing_shards: str = "error") -> dict[str, TensorBlob]:
    """Read the checkpoint directory ``path`` like SGLang's ``DefaultModelLoader`` (local directory).

    File selection (``_prepare_weights``): by ``load_format`` -- ``None``/``"auto"``: the first of
    ``*.safetensors``, ``*.bin``, ``*.pt`` that matches; ``"safetensors"``: ``*.safetensors`` (else ``*.pt``);
    ``"pt"``: ``*.pt`` only. With safetensors and a ``model.safetensors.index.json``, only files named in its
    ``weight_map`` are read (a stale ``model.safetensors`` next to shards is ignored). ``.bin`` files named
    like trainer state (``training_args.bin``, ``optimizer.bin`` ...) are skipped.

    By default it does what SGLang does with a half-written sharded checkpoint: an index naming a shard that is
    not on disk fails (``missing_shards="error"``, 0.5.23 ``weight_utils.filter_duplicate_safetensors_files``:
    "references N shard file(s) missing") or is silently loaded without it (``"skip"``, up to 0.5.16); a shard
    missing a tensor the index puts in it, or a tensor in two files, is loaded as it is (partial update).
    ``strict=True`` rejects all three. Raises ``CheckpointError`` (see its ``stage``)."""
    if missing_shards not in ("error", "skip"):
        raise ValueError(f"missing_shards must be 'error' or 'skip', got {missing_shards!r}")
    fmt = "auto" if load_format is None else load_format
    if fmt not in SUPPORTED_LOAD_FORMATS:
        raise CheckpointError(
            f"Unknown load_format: {load_format!r}; the fake engine supports None, "
            + ", ".join(repr(f) for f in SUPPORTED_LOAD_FORMATS), stage="loader")
    if not os.path.isdir(path):
        what = "is a file, not a directory" if os.path.exists(path) else "does not exist"
        raise CheckpointError(
            f"model path {path!r} {what} (SGLang then treats it as a Hugging Face Hub repo id and the "
            f"download fails); a trainer writing to a temporary directory may not have renamed it yet",
            stage="iterator")
    files: list[str] = []
    use_safetensors = False
    for pattern in _PATTERNS[fmt]:
        files = sorted(glob.glob(os.path.join(path, pattern)))
        if files:
            use_safetensors = pattern == "*.safetensors"
            break
    index_map: dict[str, str] | None = None
    if use_safetensors:
        index_path = os.path.join(path, SAFE_WEIGHTS_INDEX_NAME)
        if os.path.isfile(index_path):
            try:
                with open(index_path, "rb") as f:
                    index = json.loads(f.read().decode("utf-8"))
                index_map = dict(index["weight_map"])
            except (OSError, ValueError, KeyError, TypeError) as e:
                raise CheckpointError(
                    f"{SAFE_WEIGHTS_INDEX_NAME} cannot be parsed ({type(e).__name__}: {e}); "
                    f"truncated or still being written?", stage="iterator") from None
            listed = {os.path.join(path, f) for f in index_map.values()}
            missing = sorted(f for f in set(index_map.values()) if not os.path.isfile(os.path.join(path, f)))
            if missing and strict:
                raise CheckpointError(
                    f"{SAFE_WEIGHTS_INDEX_NAME} names shard(s) that do not exist: {', '.join(missing)} "
                    f"(half-written checkpoint?)", stage="iterator")
            if missing and missing_shards == "error":
                raise CheckpointError(
                    f"{SAFE_WEIGHTS_INDEX_NAME} references {len(missing)} shard file(s) missing from {path} "
                    f"(incomplete download?): {missing}", stage="iterator")
            files = [f for f in files if f in listed]
    else:
        files = [f for f in files if not any(f.endswith(x) for x in _BIN_BLACKLIST)]
    if not files:
        patterns = ", ".join(_PATTERNS[fmt])
        raise CheckpointError(
            f"Cannot find any model weights with `{path}` (load_format={fmt!r} looks for {patterns})",
            stage="iterator")
    out: dict[str, TensorBlob] = {}
    origin: dict[str, str] = {}
    for file in files:
        fname = os.path.basename(file)
        part = _load_safetensors_file(file) if use_safetensors else (
            _load_safetensors_file(file) if file.endswith(".safetensors") else _load_torch_file(file))
        for name, blob in part.items():
            if strict and name in out:
                raise CheckpointError(f"tensor {name!r} appears in both {origin[name]} and {fname}")
            out[name] = blob
            origin[name] = fname
    if strict and index_map is not None:
        for name, fname in index_map.items():
            if origin.get(name) != fname:
                raise CheckpointError(
                    f"{fname} does not contain tensor {name!r} that {SAFE_WEIGHTS_INDEX_NAME} puts there "
                    f"(partial shard?)", stage="load")
    return out


def load_lora_adapter(path: str) -> dict:
    """Read a PEFT adapter directory: ``adapter_config.json`` + the weight files SGLang's loader picks
    (``adapter_model.safetensors``, else ``*.bin``/``*.pt``). Returns ``{"config": dict, "tensors": dict}``.
    Raises ``CheckpointError`` when the directory, the config or the weights are missing or partial."""
    if not os.path.isdir(path):
        raise CheckpointError(f"LoRA adapter path {path!r} is not a directory", stage="iterator")
    config_path = os.path.join(path, "adapter_config.json")
    if not os.path.isfile(config_path):
        raise CheckpointError(f"Can't find 'adapter_config.json' at {path!r}", stage="iterator")
    try:
        with open(config_path, "rb") as f:
            config = json.loads(f.read().decode("utf-8"))
    except (OSError, ValueError) as e:
        raise CheckpointError(f"adapter_config.json cannot be parsed ({type(e).__name__}: {e}); "
                              f"truncated or still being written?", stage="iterator") from None
    if not isinstance(config, dict):
        raise CheckpointError("adapter_config.json must hold a JSON object", stage="iterator")
    missing = [k for k in ("r", "target_modules") if k not in config]
    if missing:
        raise CheckpointError(f"adapter_config.json lacks {', '.join(missing)}", stage="iterator")
    tensors = load_checkpoint(path, "auto")
    return {"config": config, "tensors": tensors}


def save_lora_adapter(path: str, tensors: Mapping[str, Any], config: Mapping | None = None,
                      fmt: str = "safetensors") -> None:
    """Write ``adapter_config.json`` + ``adapter_model.safetensors`` (``fmt="pt"``: ``adapter_model.bin``)."""
    cfg = dict(config) if config is not None else {
        "peft_type": "LORA", "r": 4, "lora_alpha": 8, "lora_dropout": 0.0, "bias": "none",
        "target_modules": ["q_proj", "v_proj"], "task_type": "CAUSAL_LM"}
    if fmt not in ("safetensors", "pt"):
        raise ValueError(f"fmt must be 'safetensors' or 'pt', got {fmt!r}")
    filename = "adapter_model.safetensors" if fmt == "safetensors" else "adapter_model.bin"
    _write_weight_files(path, _as_blobs(tensors), fmt, 1, filename)
    _write_bytes(os.path.join(path, "adapter_config.json"), json.dumps(cfg, indent=2).encode())
