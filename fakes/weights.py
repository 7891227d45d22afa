"""The weights a fake SGLang engine holds, and every way a trainer can hand it new ones.

Spec: ``../shared/docs/sglang-api.md`` §3 (weight-update endpoints). Vendorable: stdlib only at import
time; ``torch`` (and ``numpy``, for ``TensorBlob.from_torch``) are imported lazily, only by the code
paths that need them (torch ``.bin`` checkpoints, torch-pickled tensor payloads, the gloo transport).

Contents
--------
* ``TensorBlob`` -- one tensor as (torch dtype name, shape, raw little-endian bytes); ``WeightStore`` --
  an immutable name -> blob mapping with an order-independent ``digest()`` and an all-or-nothing
  ``updated()``. ``tiny_model`` / ``perturbed`` give deterministic weights without torch.
* Checkpoints (``/update_weights_from_disk``): ``save_checkpoint`` / ``load_checkpoint`` read and write
  the layouts SGLang's ``DefaultModelLoader`` reads. The safetensors format is implemented here with the
  stdlib: ``u64 little-endian N`` + ``N`` bytes of UTF-8 JSON header (``{name: {"dtype": "BF16",
  "shape": [..], "data_offsets": [begin, end]}, "__metadata__": {str: str}}``, offsets relative to the
  byte buffer that follows the header, padded with spaces to 8 bytes) + the raw data. Reading validates it
  the way the ``safetensors`` library does and raises ``CheckpointError`` with the same reasons
  (``"Error while deserializing header: incomplete metadata, file not fully covered"`` ...).
* Tensor payloads (``/update_weights_from_tensor``): ``encode_tensor_payload`` / ``decode_tensor_payload``.
  Encodings (one base64 string per TP rank on the wire; the decoder detects which one it got):

  ``"torch"``        what SGLang's ``MultiprocessingSerializer.serialize(named_tensors, output_str=True)``
                     produces: a ``multiprocessing.reduction.ForkingPickler`` pickle of a list of
                     ``(name, tensor)``. With torch's reductions registered, CPU tensors are moved to shared
                     memory and the pickle carries *handles* (a file descriptor served by the sender's
                     ``multiprocessing.resource_sharer``), like SGLang's CUDA IPC handles: decodable **once**,
                     on the same host, while the sender lives, by the sender or a process that shares its
                     ``multiprocessing`` authkey (a child). That is the colocated-engine case.
  ``"pickle"``       a plain ``pickle`` of the same list: tensors inline (self-contained, any process).
                     Real SGLang accepts it too (its deserializer is ``pickle``-based).
  ``"safetensors"``  base64 of a safetensors buffer. **Fake-only** (real SGLang cannot unpickle it): for
                     trainers and tests without torch.

  Pickles are read with an allow-list unpickler (torch, ``multiprocessing.resource_sharer``,
  ``collections.OrderedDict``, plain builtins), as SGLang's newer ``SafeUnpickler`` does. It keeps garbage
  and stray objects out; it is not a security boundary (torch's own rebuild functions are allowed).
* The distributed transport (``/init_weights_update_group`` + ``/update_weights_from_distributed``):
  ``DistributedGroup`` joins a real ``torch.distributed`` gloo group built exactly like SGLang's
  ``init_custom_process_group`` builds its group (rendezvous ``tcp://`` TCPStore hosted by rank 0,
  ``PrefixStore(group_name)``, then the ``"{group_name}/"`` and ``"cpu/"`` prefixes
  ``_new_process_group_helper`` adds), but without touching torch's global process-group registry, so
  several ranks (fake engines, the trainer) can live in one process. A trainer that uses SGLang-style
  ``init_custom_process_group(backend="gloo", ...)`` + ``dist.broadcast(t, src=0, group=g)`` interoperates.
* ``load_lora_adapter`` (``/load_lora_adapter``), ``values_preview`` (``/get_weights_by_name``).
"""

from __future__ import annotations

import base64
import binascii
import functools
import glob
import hashlib
import io
import json
import math
import os
import pickle
import random
import socket
import struct
import threading
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

__all__ = [
    "TensorBlob",
    "WeightError",
    "CheckpointError",
    "WeightStore",
    "weights_digest",
    "tiny_model",
    "TINY_SPEC",
    "TINY_CONFIG",
    "perturbed",
    "encode_safetensors",
    "decode_safetensors",
    "save_checkpoint",
    "load_checkpoint",
    "SUPPORTED_LOAD_FORMATS",
    "PAYLOAD_FORMATS",
    "TENSOR_LOAD_FORMATS",
    "LocalSerializedTensor",
    "FlattenedTensorMetadata",
    "encode_tensor_payload",
    "encode_weight_sync_payload",
    "encode_flattened_bucket",
    "decode_tensor_payload",
    "DistributedGroup",
    "trainer_group",
    "distributed_metadata",
    "load_lora_adapter",
    "save_lora_adapter",
    "tiny_lora",
    "values_preview",
]


# ----------------------------------------------------------------------------------------------------------
# errors
# ----------------------------------------------------------------------------------------------------------


class WeightError(Exception):
    """A weight update cannot be applied. ``str(e)`` is what the engine puts in its 400 body."""


class CheckpointError(WeightError):
    """A checkpoint cannot be read.

    ``stage`` tells the engine which SGLang message wraps it (``model_runner.update_weights_from_disk``):
    ``"loader"`` -> ``"Failed to get model loader: ..."`` (bad load_format), ``"iterator"`` ->
    ``"Failed to get weights iterator: <e>."`` (no such directory, no weight files, bad index),
    ``"load"`` -> ``"Failed to update weights: <e>.\\nRolling back to original weights."`` (a weight file
    that cannot be read: truncated/partial safetensors, unreadable torch ``.bin``, missing tensors).
    """

    def __init__(self, message: str, stage: str = "load"):
        super().__init__(message)
        self.stage = stage


# ----------------------------------------------------------------------------------------------------------
# dtypes
# ----------------------------------------------------------------------------------------------------------

# torch dtype name -> (safetensors code, item size in bytes)
_DTYPES: dict[str, tuple[str, int]] = {
    "float64": ("F64", 8),
    "float32": ("F32", 4),
    "float16": ("F16", 2),
    "bfloat16": ("BF16", 2),
    "float8_e4m3fn": ("F8_E4M3", 1),
    "float8_e5m2": ("F8_E5M2", 1),
    "int64": ("I64", 8),
    "int32": ("I32", 4),
    "int16": ("I16", 2),
    "int8": ("I8", 1),
    "uint8": ("U8", 1),
    "bool": ("BOOL", 1),
}
_ST_TO_DTYPE = {code: name for name, (code, _) in _DTYPES.items()}
# the aliases ``getattr(torch, name)`` resolves (SGLang resolves distributed dtypes that way)
_ALIASES = {"float": "float32", "double": "float64", "half": "float16", "long": "int64", "int": "int32",
            "short": "int16"}
_FLOATS = ("float64", "float32", "float16", "bfloat16")
_INTS = ("int64", "int32", "int16", "int8", "uint8")
_INT_FMT = {"int64": "q", "int32": "i", "int16": "h", "int8": "b", "uint8": "B"}


def _dtype_name(dtype: Any) -> str:
    """Canonical torch dtype name for ``dtype`` (a name, an alias, or a ``torch.dtype``)."""
    if not isinstance(dtype, str):
        text = str(dtype)
        if text.startswith("torch."):  # a torch.dtype object
            dtype = text[len("torch."):]
        else:
            raise WeightError(f"dtype must be a torch dtype name, got {dtype!r}")
    name = _ALIASES.get(dtype, dtype)
    if name in _DTYPES:
        return name
    if dtype.startswith("torch.") and dtype[len("torch."):] in _DTYPES:
        raise WeightError(
            f"unsupported dtype {dtype!r}: use the bare torch dtype name {dtype[len('torch.'):]!r} "
            f"(SGLang resolves dtypes with getattr(torch, name))"
        )
    raise WeightError(f"unsupported dtype {dtype!r}; supported: {', '.join(_DTYPES)}")


def _itemsize(dtype: str) -> int:
    return _DTYPES[dtype][1]


def _numel(shape: tuple[int, ...]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


@functools.lru_cache(maxsize=None)
def _fp8_table(dtype: str) -> tuple[float, ...]:
    values = []
    for b in range(256):
        if dtype == "float8_e5m2":  # the top byte of an IEEE half
            values.append(struct.unpack("<e", struct.pack("<H", b << 8))[0])
            continue
        sign = -1.0 if b & 0x80 else 1.0
        exp, man = (b >> 3) & 0xF, b & 0x7
        if exp == 0xF and man == 0x7:
            values.append(math.nan)  # e4m3fn: no infinities, S.1111.111 is NaN
        elif exp == 0:
            values.append(sign * man / 8.0 * 2.0**-6)
        else:
            values.append(sign * (1.0 + man / 8.0) * 2.0 ** (exp - 7))
    return tuple(values)


def _decode(dtype: str, data: bytes | memoryview, count: int) -> list:
    """The first ``count`` elements of ``data`` as Python numbers (exact)."""
    size = _itemsize(dtype)
    data = bytes(data[: count * size])
    if dtype == "float32":
        return list(struct.unpack(f"<{count}f", data))
    if dtype == "float64":
        return list(struct.unpack(f"<{count}d", data))
    if dtype == "float16":
        return list(struct.unpack(f"<{count}e", data))
    if dtype == "bfloat16":
        halves = struct.unpack(f"<{count}H", data)
        return list(struct.unpack(f"<{count}f", struct.pack(f"<{count}I", *(h << 16 for h in halves))))
    if dtype in ("float8_e4m3fn", "float8_e5m2"):
        table = _fp8_table(dtype)
        return [table[b] for b in data]
    if dtype == "bool":
        return [b != 0 for b in data]
    return list(struct.unpack(f"<{count}{_INT_FMT[dtype]}", data))


def _to_f32(x: float) -> float:
    """Round a Python float to the nearest float32 (inf on overflow), as ``tensor.to(torch.float32)``."""
    try:
        return struct.unpack("<f", struct.pack("<f", x))[0]
    except OverflowError:
        return math.copysign(math.inf, x)


def _pack_float(fmt: str, x: float) -> bytes:
    try:
        return struct.pack("<" + fmt, x)
    except OverflowError:
        return struct.pack("<" + fmt, math.copysign(math.inf, x))


def _bf16_bits(x: float) -> int:
    """float -> bfloat16 bits, round-to-nearest-even from float32 (torch's conversion)."""
    bits = struct.unpack("<I", _pack_float("f", x))[0]
    if (bits & 0x7F800000) == 0x7F800000 and bits & 0x007FFFFF:  # NaN: keep sign, quiet
        return ((bits >> 16) & 0x8000) | 0x7FC0
    return ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16) & 0xFFFF


_TORCH_CAST_MIN_BYTES = 1 << 22  # torch casts ~100x faster than numpy's float16 path; worth its import above this


def _cast_floats(data: bytes, src: str, dst: str) -> bytes | None:
    """float64/float32/float16/bfloat16 -> another of them, vectorised (``tensor.to`` itself for large tensors
    when torch is installed, else numpy with the same bits: round to nearest even, inf on overflow); None when
    neither is installed or a side is not such a float."""
    if src not in _FLOATS or dst not in _FLOATS:
        return None
    if len(data) >= _TORCH_CAST_MIN_BYTES:
        try:
            import torch  # lazy, optional
        except ImportError:
            pass
        else:
            converted = torch.frombuffer(bytearray(data), dtype=getattr(torch, src)).to(getattr(torch, dst))
            return converted.view(torch.uint8).numpy().tobytes()
    try:
        import numpy as np  # lazy, optional
    except ImportError:
        return None
    native = {"float64": np.float64, "float32": np.float32, "float16": np.float16}
    if src == "bfloat16":
        values = (np.frombuffer(data, dtype="<u2").astype(np.uint32) << 16).view(np.float32)
    else:
        values = np.frombuffer(data, dtype=np.dtype(native[src]).newbyteorder("<"))
    with np.errstate(over="ignore", invalid="ignore"):
        if dst != "bfloat16":
            return values.astype(np.dtype(native[dst]).newbyteorder("<")).tobytes()
        bits = values.astype("<f4").view(np.uint32)  # float64 -> float32 first, as torch does
    nan = ((bits & 0x7F800000) == 0x7F800000) & ((bits & 0x007FFFFF) != 0)
    rounded = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16) & 0xFFFF
    quiet = ((bits >> 16) & 0x8000) | 0x7FC0
    return np.where(nan, quiet, rounded).astype("<u2").tobytes()


def _encode(dtype: str, values: list) -> bytes:
    """Python numbers -> raw little-endian bytes of ``dtype`` (floats rounded like torch, ints wrap)."""
    if dtype == "float32":
        return b"".join(_pack_float("f", float(v)) for v in values)
    if dtype == "float64":
        return struct.pack(f"<{len(values)}d", *(float(v) for v in values))
    if dtype == "float16":
        return b"".join(_pack_float("e", float(v)) for v in values)
    if dtype == "bfloat16":
        return struct.pack(f"<{len(values)}H", *(_bf16_bits(float(v)) for v in values))
    if dtype == "bool":
        return bytes(1 if v else 0 for v in values)
    if dtype in _INT_FMT:
        bits = 8 * _itemsize(dtype)
        out = []
        for v in values:
            if isinstance(v, float):
                if not math.isfinite(v):
                    raise WeightError(f"cannot convert {v} to {dtype}")
                v = int(v)  # truncation toward zero, like torch
            v &= (1 << bits) - 1
            if dtype != "uint8" and v >= 1 << (bits - 1):
                v -= 1 << bits
            out.append(v)
        return struct.pack(f"<{len(out)}{_INT_FMT[dtype]}", *out)
    raise WeightError(f"cannot convert values to {dtype} without torch")


# ----------------------------------------------------------------------------------------------------------
# TensorBlob
# ----------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class TensorBlob:
    """One tensor: torch dtype name (``float32``, ``bfloat16`` ...), shape, raw little-endian C-order bytes.

    The constructor normalises ``dtype`` (aliases such as ``"half"`` or a ``torch.dtype`` become the canonical
    name), ``shape`` (any int sequence -> tuple) and ``data`` (any bytes-like -> ``bytes``), and raises
    ``WeightError`` when ``len(data)`` does not match the shape.
    """

    dtype: str
    shape: tuple[int, ...]
    data: bytes

    def __post_init__(self) -> None:
        dtype = _dtype_name(self.dtype)
        try:
            shape = tuple(int(d) for d in self.shape)
        except (TypeError, ValueError):
            raise WeightError(f"shape must be a sequence of ints, got {self.shape!r}") from None
        if any(d < 0 for d in shape):
            raise WeightError(f"negative dimension in shape {list(shape)}")
        data = self.data if isinstance(self.data, bytes) else bytes(self.data)
        expected = _numel(shape) * _itemsize(dtype)
        if len(data) != expected:
            raise WeightError(
                f"{dtype} tensor of shape {list(shape)} needs {expected} bytes, got {len(data)}"
            )
        object.__setattr__(self, "dtype", dtype)
        object.__setattr__(self, "shape", shape)
        object.__setattr__(self, "data", data)

    def __repr__(self) -> str:
        return f"TensorBlob(dtype={self.dtype!r}, shape={self.shape!r}, nbytes={self.nbytes}, digest={self.digest()[:12]})"

    @property
    def nbytes(self) -> int:
        return len(self.data)

    @property
    def numel(self) -> int:
        return _numel(self.shape)

    @classmethod
    def zeros(cls, dtype: str, shape: tuple[int, ...] | list[int]) -> TensorBlob:
        dtype = _dtype_name(dtype)
        return cls(dtype, tuple(shape), bytes(_numel(tuple(shape)) * _itemsize(dtype)))

    @classmethod
    def from_values(cls, dtype: str, shape: tuple[int, ...] | list[int], values: list) -> TensorBlob:
        """Build from flat Python numbers (floats rounded like torch; not for float8)."""
        dtype = _dtype_name(dtype)
        return cls(dtype, tuple(shape), _encode(dtype, list(values)))

    @classmethod
    def from_torch(cls, tensor: Any) -> TensorBlob:
        """Copy a (dense) torch tensor, on any device, into a blob. Imports torch and numpy lazily."""
        import torch  # lazy

        if not isinstance(tensor, torch.Tensor):
            raise WeightError(f"expected a torch.Tensor, got {type(tensor).__name__}")
        if tensor.layout != torch.strided or tensor.is_quantized:
            raise WeightError(f"only dense tensors are supported, got layout {tensor.layout}")
        dtype = _dtype_name(tensor.dtype)
        t = tensor.detach()
        if t.device.type != "cpu":
            t = t.cpu()
        raw = t.contiguous().reshape(-1).view(torch.uint8)
        try:
            data = raw.numpy().tobytes()
        except (ImportError, RuntimeError):  # a torch build without numpy
            data = bytes(raw.tolist())
        return cls(dtype, tuple(tensor.shape), data)

    def to_torch(self) -> Any:
        """A new CPU torch tensor with this blob's dtype, shape and bytes. Imports torch lazily."""
        import torch  # lazy

        dt = getattr(torch, self.dtype)
        if not self.data:
            return torch.empty(self.shape, dtype=dt)
        return torch.frombuffer(bytearray(self.data), dtype=dt).reshape(self.shape)

    def digest(self) -> str:
        """sha256 (hex) over dtype, shape and data: equal iff the three are equal."""
        h = hashlib.sha256()
        h.update(b"TensorBlob\0")
        h.update(json.dumps([self.dtype, list(self.shape)]).encode())
        h.update(b"\0")
        h.update(self.data)
        return h.hexdigest()

    def values(self) -> list:
        """All elements, flat, as exact Python numbers (floats, ints or bools)."""
        return _decode(self.dtype, self.data, self.numel)

    def astype(self, dtype: str) -> TensorBlob:
        """Convert like ``tensor.to(dtype)`` (float rounding RNE, float->int truncates, ints wrap).

        Float8 targets are not supported without torch (``WeightError``)."""
        dtype = _dtype_name(dtype)
        if dtype == self.dtype:
            return self
        if dtype in ("float8_e4m3fn", "float8_e5m2"):
            raise WeightError(f"cannot convert {self.dtype} to {dtype} without torch")
        if self.dtype == "float64" and dtype == "float16":  # torch rounds through float32 (twice)
            return self.astype("float32").astype(dtype)
        fast = _cast_floats(self.data, self.dtype, dtype)
        return TensorBlob(dtype, self.shape, fast if fast is not None else _encode(dtype, self.values()))


def _as_blob(value: Any, name: str = "?") -> TensorBlob:
    """Coerce a TensorBlob, a ``(dtype, shape, bytes)`` triple or a torch tensor to a TensorBlob."""
    if isinstance(value, TensorBlob):
        return value
    if isinstance(value, (tuple, list)) and len(value) == 3:
        return TensorBlob(value[0], value[1], value[2])
    if hasattr(value, "detach") and hasattr(value, "dtype"):
        return TensorBlob.from_torch(value)
    raise WeightError(
        f"{name}: expected a TensorBlob, a (dtype, shape, bytes) triple or a torch tensor, "
        f"got {type(value).__name__}"
    )


def _as_blobs(blobs: Mapping[str, Any]) -> dict[str, TensorBlob]:
    if not isinstance(blobs, Mapping):
        raise WeightError(f"expected a mapping name -> tensor, got {type(blobs).__name__}")
    out = {}
    for name, value in blobs.items():
        if not isinstance(name, str) or not name:
            raise WeightError(f"parameter names must be non-empty strings, got {name!r}")
        out[name] = _as_blob(value, name)
    return out


# ----------------------------------------------------------------------------------------------------------
# digests and the store
# ----------------------------------------------------------------------------------------------------------


def weights_digest(blobs: Mapping[str, Any]) -> str:
    """sha256 (hex) over all (name, blob digest) pairs, independent of mapping order."""
    h = hashlib.sha256()
    h.update(b"weights\0")
    for name in sorted(blobs):
        blob = _as_blob(blobs[name], name)
        encoded = name.encode()
        h.update(struct.pack("<Q", len(encoded)))
        h.update(encoded)
        h.update(bytes.fromhex(blob.digest()))
    return h.hexdigest()


class WeightStore(Mapping):
    """Immutable name -> TensorBlob mapping: what one engine holds. Values may be given as TensorBlobs,
    ``(dtype, shape, bytes)`` triples or torch tensors."""

    __slots__ = ("_blobs", "_digest")

    def __init__(self, blobs: Mapping[str, Any] | None = None):
        self._blobs: dict[str, TensorBlob] = _as_blobs(blobs or {})
        self._digest: str | None = None

    @classmethod
    def tiny(cls, seed: int = 0) -> WeightStore:
        return cls(tiny_model(seed))

    def __getitem__(self, name: str) -> TensorBlob:
        return self._blobs[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._blobs)

    def __len__(self) -> int:
        return len(self._blobs)

    def __repr__(self) -> str:
        return f"WeightStore({len(self)} tensors, {self.nbytes} bytes, digest={self.digest()[:12]})"

    @property
    def nbytes(self) -> int:
        return sum(b.nbytes for b in self._blobs.values())

    def digest(self) -> str:
        if self._digest is None:
            self._digest = weights_digest(self._blobs)
        return self._digest

    def spec(self) -> dict[str, tuple[str, tuple[int, ...]]]:
        """name -> (dtype, shape)."""
        return {name: (b.dtype, b.shape) for name, b in self._blobs.items()}

    def updated(self, blobs: Mapping[str, Any], *, cast: bool = False) -> WeightStore:
        """A new store with ``blobs`` replacing the same-named parameters; names not given keep their values
        (SGLang's ``load_weights`` loads what it is given).

        All-or-nothing: every entry is checked before anything changes. An unknown name, a shape mismatch or
        (unless ``cast``) a dtype mismatch raises ``WeightError`` naming the parameter. Real SGLang copies
        with ``param.data.copy_(loaded)``, which casts silently: ``cast=True`` models that (the stored dtype
        wins, values are converted like ``tensor.to``)."""
        new = _as_blobs(blobs)
        merged = dict(self._blobs)
        for name, blob in new.items():
            old = self._blobs.get(name)
            if old is None:
                raise WeightError(
                    f"unknown parameter {name!r}: the model has no such weight "
                    f"(SGLang load_weights raises KeyError: {name!r})"
                )
            if blob.shape != old.shape:
                raise WeightError(
                    f"parameter {name!r}: Attempted to load weight (torch.Size({list(blob.shape)})) "
                    f"into parameter (torch.Size({list(old.shape)}))"
                )
            if blob.dtype != old.dtype:
                if not cast:
                    raise WeightError(
                        f"parameter {name!r}: dtype mismatch: got {blob.dtype}, the model holds {old.dtype}"
                    )
                try:
                    blob = blob.astype(old.dtype)
                except WeightError as e:
                    raise WeightError(f"parameter {name!r}: {e}") from None
            merged[name] = blob
        return WeightStore(merged)


# ----------------------------------------------------------------------------------------------------------
# tiny deterministic model
# ----------------------------------------------------------------------------------------------------------

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
    """A tiny deterministic Llama-shaped model (``TINY_SPEC``; float32 + bfloat16, 21 tensors, 17.3 KiB); no torch."""
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


# ----------------------------------------------------------------------------------------------------------
# safetensors (stdlib)
# ----------------------------------------------------------------------------------------------------------

_MAX_HEADER = 100_000_000  # the safetensors library refuses larger headers ("header too large")


def encode_safetensors(blobs: Mapping[str, Any], metadata: Mapping[str, str] | None = None, *,
                       keep_order: bool = False) -> bytes:
    """The safetensors serialisation of ``blobs``: byte-identical to ``safetensors.torch.save`` (tensors
    ordered by decreasing alignment then name, header padded with spaces to 8 bytes), or with ``keep_order``
    the data in mapping order (still valid safetensors; ``decode_safetensors`` returns data order)."""
    items = _as_blobs(blobs)
    order = list(items) if keep_order else sorted(items, key=lambda n: (-_itemsize(items[n].dtype), n))
    header: dict[str, Any] = {}
    if metadata:
        header["__metadata__"] = {str(k): str(v) for k, v in metadata.items()}
    offset = 0
    for name in order:
        b = items[name]
        header[name] = {"dtype": _DTYPES[b.dtype][0], "shape": list(b.shape),
                        "data_offsets": [offset, offset + b.nbytes]}
        offset += b.nbytes
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)
    return struct.pack("<Q", len(raw)) + raw + b"".join(items[n].data for n in order)


def _st_error(source: str, reason: str, detail: str = "") -> CheckpointError:
    extra = f"; {detail}" if detail else ""
    return CheckpointError(f"Error while deserializing header: {reason} ({source}{extra})", stage="load")


def _safetensors_layout(prefix: bytes | memoryview, size: int, source: str) -> tuple[int, list, dict]:
    """Validate a safetensors header like the ``safetensors`` library: (data start, entries sorted by offset as
    ``(begin, end, name, dtype, shape)``, ``__metadata__``). ``prefix`` holds at least the first 8 bytes and, when
    the length field allows it, the whole header; ``size`` is the total byte count."""
    if size < 8:
        raise _st_error(source, "header too small", f"file has {size} bytes")
    (n,) = struct.unpack("<Q", prefix[:8])
    if n > _MAX_HEADER:
        raise _st_error(source, "header too large", f"header length {n}")
    if 8 + n > size:
        raise _st_error(source, "invalid header length",
                        f"header claims {n} bytes but the file has only {size - 8} after the length; "
                        f"truncated or still being written?")
    try:
        header = json.loads(bytes(prefix[8:8 + n]).decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as e:
        raise _st_error(source, f"invalid JSON in header: {e}") from None
    if not isinstance(header, dict):
        raise _st_error(source, "invalid JSON in header: expected an object")
    metadata = header.pop("__metadata__", None) or {}
    if not isinstance(metadata, dict) or not all(isinstance(v, str) for v in metadata.values()):
        raise _st_error(source, "invalid JSON in header: __metadata__ must map strings to strings")
    entries = []
    for name, info in header.items():
        if not isinstance(info, dict) or not {"dtype", "shape", "data_offsets"} <= info.keys():
            raise _st_error(source, f"invalid JSON in header: bad entry for tensor `{name}`")
        code, shape, offsets = info["dtype"], info["shape"], info["data_offsets"]
        if code not in _ST_TO_DTYPE:
            raise _st_error(source, f"invalid JSON in header: unsupported dtype `{code}` for tensor `{name}`",
                            f"supported: {', '.join(_ST_TO_DTYPE)}")
        if (not isinstance(shape, list) or not all(isinstance(d, int) and d >= 0 for d in shape)
                or not isinstance(offsets, list) or len(offsets) != 2
                or not all(isinstance(o, int) and o >= 0 for o in offsets)):
            raise _st_error(source, f"invalid JSON in header: bad shape or data_offsets for tensor `{name}`")
        entries.append((offsets[0], offsets[1], name, _ST_TO_DTYPE[code], tuple(shape)))
    entries.sort(key=lambda e: (e[0], e[1]))
    expected_start = 0
    for begin, end, name, dtype, shape in entries:
        if begin != expected_start or end < begin:
            raise _st_error(source, f"invalid offset for tensor `{name}`")
        if end - begin != _numel(shape) * _itemsize(dtype):
            raise _st_error(source, f"invalid shape, data type, or offset for tensor `{name}`")
        expected_start = end
    available = size - 8 - n
    if expected_start != available:
        raise _st_error(source, "incomplete metadata, file not fully covered",
                        f"tensors need {expected_start} data bytes, the file has {available}"
                        + ("; truncated or still being written?" if available < expected_start else ""))
    return 8 + n, entries, dict(metadata)


def decode_safetensors(data: bytes | memoryview, source: str = "<buffer>") -> tuple[dict[str, TensorBlob], dict]:
    """Parse a safetensors buffer -> (name -> blob in data order, ``__metadata__``).

    Validates like the ``safetensors`` library and raises ``CheckpointError`` with its reasons: ``header too
    small``, ``invalid header length``, ``header too large``, ``invalid JSON in header: ...``, ``invalid
    offset for tensor `x` ``, ``invalid shape, data type, or offset for tensor `x` ``, ``incomplete
    metadata, file not fully covered`` (a half-written file). ``source`` names the file in messages."""
    data = memoryview(data)
    start, entries, metadata = _safetensors_layout(data, len(data), source)
    return {name: TensorBlob(dtype, shape, bytes(data[start + begin:start + end]))
            for begin, end, name, dtype, shape in entries}, metadata


def _looks_like_safetensors(data: bytes) -> bool:
    if len(data) < 10:
        return False
    (n,) = struct.unpack("<Q", data[:8])
    return 2 <= n <= len(data) - 8 and data[8:8 + n].lstrip(b" ")[:1] == b"{"


# ----------------------------------------------------------------------------------------------------------
# checkpoints
# ----------------------------------------------------------------------------------------------------------

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


# ----------------------------------------------------------------------------------------------------------
# tensor payloads (update_weights_from_tensor)
# ----------------------------------------------------------------------------------------------------------

PAYLOAD_FORMATS = ("safetensors", "torch", "pickle")
_SAFE_BUILTINS = frozenset({"list", "tuple", "dict", "set", "frozenset", "bytearray", "bytes", "int", "float",
                            "complex", "bool", "str", "slice", "range"})


def _named_tensors(blobs: Mapping[str, Any]) -> list:
    out = []
    for name, blob in _as_blobs(blobs).items():
        out.append((name, blob.to_torch()))
    return out


def _pickled(obj: Any, fmt: str) -> bytes:
    """``fmt="torch"``: ``MultiprocessingSerializer.serialize`` (a ForkingPickler: tensors as shared-memory
    handles); ``"pickle"``: tensors inline. The SGLang stand-ins below are written under SGLang's own names."""
    import torch  # lazy  # noqa: F401
    import torch.multiprocessing  # noqa: F401  (registers torch's ForkingPickler reductions)

    buf = io.BytesIO()
    if fmt == "torch" and not _has_standin(obj):
        from multiprocessing.reduction import ForkingPickler

        ForkingPickler(buf).dump(obj)
    else:
        _SGLangPickler(buf, shared=fmt == "torch").dump(obj)
    return buf.getvalue()


def encode_tensor_payload(blobs: Mapping[str, Any], fmt: str = "safetensors") -> str:
    """One ``serialized_named_tensors`` item (a base64 str) for ``/update_weights_from_tensor``.

    ``fmt``: ``"torch"`` (SGLang's ``MultiprocessingSerializer.serialize(list_of_(name, tensor),
    output_str=True)``: shared-memory handles, decode once, same host, sender alive), ``"pickle"``
    (tensors inline, any process), ``"safetensors"`` (fake-only, no torch needed)."""
    if fmt == "safetensors":
        raw = encode_safetensors(blobs, keep_order=True)
    elif fmt in ("torch", "pickle"):
        raw = _pickled(_named_tensors(blobs), fmt)
    else:
        raise ValueError(f"fmt must be one of {PAYLOAD_FORMATS}, got {fmt!r}")
    return base64.b64encode(raw).decode("ascii")


def encode_weight_sync_payload(blobs: Mapping[str, Any], tp_size: int = 1, fmt: str = "torch") -> list[str]:
    """``serialized_named_tensors`` as SGLang's ``weight_sync.utils.update_weights`` builds it for ``tp_size`` ranks:
    one item per rank, each ``[(name, LocalSerializedTensor(values=[payload of rank 0, ..., rank tp_size-1]))]``,
    every value a ``MultiprocessingSerializer`` payload of the tensor (``fmt="pickle"``: inline)."""
    if fmt not in ("torch", "pickle"):
        raise ValueError(f"fmt must be 'torch' or 'pickle', got {fmt!r}")
    if tp_size < 1:
        raise ValueError(f"tp_size must be >= 1, got {tp_size}")
    named = []
    for name, tensor in _named_tensors(blobs):
        wrapped = LocalSerializedTensor()
        wrapped.values = [_pickled(tensor, fmt) for _ in range(tp_size)]
        named.append((name, wrapped))
    item = base64.b64encode(_pickled(named, "pickle")).decode("ascii")
    return [item] * tp_size


def encode_flattened_bucket(blobs: Mapping[str, Any], fmt: str = "torch") -> str:
    """One ``serialized_named_tensors`` item for ``load_format="flattened_bucket"``: a ``MultiprocessingSerializer``
    payload of ``{"flattened_tensor": <uint8 tensor>, "metadata": [FlattenedTensorMetadata, ...]}``, as a
    ``FlattenedTensorBucket(named_tensors)`` lays the tensors out (``weight_sync/tensor_bucket.py``)."""
    import torch

    parts, metadata, offset = [], [], 0
    for name, tensor in _named_tensors(blobs):
        flat = tensor.flatten().view(torch.uint8)
        meta = FlattenedTensorMetadata()
        meta.name, meta.shape, meta.dtype = name, tensor.shape, tensor.dtype
        meta.start_idx, meta.end_idx, meta.numel = offset, offset + flat.numel(), flat.numel()
        metadata.append(meta)
        parts.append(flat)
        offset += flat.numel()
    if not parts:
        raise ValueError("Cannot create empty tensor bucket")
    bucket = {"flattened_tensor": torch.cat(parts), "metadata": metadata}
    return base64.b64encode(_pickled(bucket, fmt)).decode("ascii")


class LocalSerializedTensor:
    """Stand-in for SGLang's ``LocalSerializedTensor`` (``model_executor/model_runner[_components/weight_updater].py``),
    which its ``weight_sync.utils.update_weights`` helper sends instead of a tensor: ``values[tp_rank]`` is that TP
    rank's own ``MultiprocessingSerializer`` payload of the tensor. Unpickled without importing sglang."""

    values: list

    def __repr__(self) -> str:
        return f"LocalSerializedTensor({len(getattr(self, 'values', []))} ranks)"


class FlattenedTensorMetadata:
    """Stand-in for SGLang's ``weight_sync.tensor_bucket.FlattenedTensorMetadata`` (``load_format="flattened_bucket"``):
    where one tensor lies in the bucket's flat uint8 tensor (``start_idx:end_idx``), its ``name``, ``shape``, ``dtype``."""

    name: str
    shape: Any
    dtype: Any
    start_idx: int
    end_idx: int
    numel: int


# SafeUnpickler.ALLOWED_GLOBALS (utils/common.py, 0.5.23) admits these SGLang data containers in weight payloads.
_SGLANG_CLASSES = {
    ("sglang.srt.model_executor.model_runner_components.weight_updater", "LocalSerializedTensor"): LocalSerializedTensor,
    ("sglang.srt.model_executor.model_runner", "LocalSerializedTensor"): LocalSerializedTensor,
    ("sglang.srt.weight_sync.tensor_bucket", "FlattenedTensorMetadata"): FlattenedTensorMetadata,
}


_SGLANG_NAMES = {cls: path for path, cls in _SGLANG_CLASSES.items()
                 if path[0] != "sglang.srt.model_executor.model_runner"}  # the 0.5.23 paths


def _has_standin(obj: Any) -> bool:
    if isinstance(obj, (LocalSerializedTensor, FlattenedTensorMetadata)):
        return True
    if isinstance(obj, Mapping):
        return any(_has_standin(v) for v in obj.values())
    if isinstance(obj, (list, tuple)):
        return any(_has_standin(v) for v in obj)
    return False


class _SGLangPickler(pickle._Pickler):  # type: ignore[name-defined]
    """A pickler that writes the stand-in classes under SGLang's module paths (sglang need not be importable), with
    torch's shared-memory reductions when ``shared`` (what ForkingPickler adds)."""

    def __init__(self, file: Any, shared: bool) -> None:
        super().__init__(file, protocol=4)
        if shared:
            import copyreg
            from multiprocessing.reduction import ForkingPickler

            self.dispatch_table = {**copyreg.dispatch_table, **ForkingPickler._extra_reducers}

    def save_global(self, obj: Any, name: str | None = None) -> None:
        path = _SGLANG_NAMES.get(obj)
        if path is None:
            super().save_global(obj, name)
            return
        self.save(path[0])
        self.save(path[1])
        self.write(pickle.STACK_GLOBAL)
        self.memoize(obj)


class _PayloadUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        standin = _SGLANG_CLASSES.get((module, name))
        if standin is not None:
            return standin
        if (module == "torch" or module.startswith("torch.")
                or (module == "multiprocessing.resource_sharer" and name == "DupFd")
                or (module == "collections" and name == "OrderedDict")
                or (module == "copyreg" and name in ("__newobj__", "__newobj_ex__"))
                or (module == "builtins" and name in _SAFE_BUILTINS)):
            return super().find_class(module, name)
        raise pickle.UnpicklingError(f"blocked unpickle of {module}.{name}: not allowed in a weight payload")


def _unpickle(raw: bytes) -> Any:
    """``MultiprocessingSerializer.deserialize``: the object in a (torch) pickle, tensors rebuilt."""
    try:
        import torch  # noqa: F401  lazy
        import torch.multiprocessing  # noqa: F401  (rebuild functions for shared-memory handles)
    except ImportError:
        raise WeightError("this payload is a torch pickle; decoding it needs torch, which is not installed") from None
    try:
        return _PayloadUnpickler(io.BytesIO(raw)).load()
    except pickle.UnpicklingError as e:
        raise WeightError(f"undecodable tensor payload: {e}") from None
    except (EOFError, ConnectionError, OSError) as e:
        raise WeightError(
            f"tensor payload holds shared-memory handles that cannot be opened ({type(e).__name__}: {e}): a "
            f"MultiprocessingSerializer payload is decodable once, on the sender's host, while the sender "
            f"process lives (use fmt='pickle' for a self-contained payload)") from None
    except Exception as e:  # noqa: BLE001 - arbitrary bytes can fail unpickling in many ways
        name = type(e).__name__
        if name == "AuthenticationError":
            raise WeightError(
                "tensor payload holds shared-memory handles of another process family "
                "(multiprocessing authkey mismatch); use fmt='pickle' for a self-contained payload") from None
        raise WeightError(f"undecodable tensor payload ({name}: {e})") from None


def _unwrap(value: Any, tp_rank: int, where: str) -> TensorBlob:
    """``weight_updater._unwrap_tensor``: a tensor, or a ``LocalSerializedTensor`` whose ``values[tp_rank]`` is."""
    import torch

    if isinstance(value, LocalSerializedTensor):
        values = getattr(value, "values", None)
        if not isinstance(values, list) or not 0 <= tp_rank < len(values):
            count = len(values) if isinstance(values, list) else 0
            raise WeightError(f"{where}: LocalSerializedTensor has {count} rank payload(s), none for tp_rank {tp_rank}")
        value = _unpickle(_raw_payload(values[tp_rank]))
    if not isinstance(value, torch.Tensor):
        raise WeightError(f"{where} is not a (name: str, tensor) pair")
    return TensorBlob.from_torch(value)


def _named_blobs(obj: Any, tp_rank: int) -> dict[str, TensorBlob]:
    if isinstance(obj, Mapping):
        raise WeightError(
            "tensor payload is a dict; SGLang expects a list of (name, tensor) pairs "
            "(its load_weights iterates pairs; a flattened bucket needs load_format='flattened_bucket')")
    if not isinstance(obj, (list, tuple)):
        raise WeightError(f"tensor payload must be a list of (name, tensor) pairs, got {type(obj).__name__}")
    out: dict[str, TensorBlob] = {}
    for i, item in enumerate(obj):
        if not isinstance(item, (tuple, list)) or len(item) != 2 or not isinstance(item[0], str):
            raise WeightError(f"tensor payload item {i} is not a (name: str, tensor) pair")
        out[item[0]] = _unwrap(item[1], tp_rank, f"tensor payload item {i}")
    return out


def _bucket_blobs(obj: Any) -> dict[str, TensorBlob]:
    """``_update_weights_from_flattened_bucket``: ``{"flattened_tensor": uint8 tensor, "metadata": [...]}``, each
    tensor ``flat[start_idx:end_idx].view(dtype).reshape(shape)``."""
    import torch

    if not isinstance(obj, Mapping) or "flattened_tensor" not in obj or "metadata" not in obj:
        raise WeightError("load_format='flattened_bucket' expects a payload dict with 'flattened_tensor' and "
                          f"'metadata', got {type(obj).__name__}")
    flat = obj["flattened_tensor"]
    if not isinstance(flat, torch.Tensor):
        raise WeightError("flattened_tensor is not a tensor")
    out: dict[str, TensorBlob] = {}
    for i, meta in enumerate(obj["metadata"]):
        if not isinstance(meta, FlattenedTensorMetadata):
            raise WeightError(f"metadata item {i} is not a FlattenedTensorMetadata")
        try:
            tensor = flat[meta.start_idx:meta.end_idx].view(meta.dtype).reshape(meta.shape)
        except (RuntimeError, TypeError, AttributeError) as e:
            raise WeightError(f"flattened bucket entry {getattr(meta, 'name', i)!r}: {_first_line(e)}") from None
        out[meta.name] = TensorBlob.from_torch(tensor)
    return out


def _raw_payload(item: Any) -> bytes:
    """The bytes of one payload item: base64 text (strictly validated, like ``b64decode(data, validate=True)``), or
    raw bytes (base64 text given as bytes is accepted too)."""
    if isinstance(item, str):
        try:
            return base64.b64decode(item.encode("ascii"), validate=True)
        except (binascii.Error, ValueError, UnicodeEncodeError) as e:
            raise WeightError(f"serialized_named_tensors item is not valid base64: {e}") from None
    if isinstance(item, (bytes, bytearray, memoryview)):
        raw = bytes(item)
        if not (raw[:1] == b"\x80" or _looks_like_safetensors(raw)):
            try:
                raw = base64.b64decode(raw, validate=True)
            except (binascii.Error, ValueError):
                pass
        return raw
    raise WeightError(f"serialized_named_tensors item must be a str or bytes, got {type(item).__name__}")


#: ``load_format`` values of ``/update_weights_from_tensor`` the fake decodes (SGLang also takes custom loaders).
TENSOR_LOAD_FORMATS = (None, "direct", "flattened_bucket")


def decode_tensor_payload(item: str | bytes, *, tp_rank: int = 0,
                          load_format: str | None = None) -> dict[str, TensorBlob]:
    """Decode one ``serialized_named_tensors`` item (the one of ``tp_rank``) -> name -> blob (in payload order).

    The forms SGLang takes, decoded without importing sglang: a list of ``(name, tensor)`` pairs; pairs whose
    value is a ``LocalSerializedTensor`` (what SGLang's ``weight_sync`` helper sends: ``values[tp_rank]`` is this
    rank's tensor payload); with ``load_format="flattened_bucket"`` a ``{"flattened_tensor", "metadata"}`` dict.
    Plus the fake-only safetensors buffer. Raises ``WeightError`` for bad base64 or an undecodable payload."""
    if load_format not in TENSOR_LOAD_FORMATS:
        raise WeightError(f"Unknown load_format={load_format}")
    raw = _raw_payload(item)
    if _looks_like_safetensors(raw):
        if load_format == "flattened_bucket":
            raise WeightError("load_format='flattened_bucket' needs a pickled bucket dict, got a safetensors buffer")
        try:
            return decode_safetensors(raw, source="tensor payload")[0]
        except CheckpointError as e:
            raise WeightError(f"undecodable safetensors tensor payload: {e}") from None
    if raw[:1] != b"\x80":
        raise WeightError("undecodable tensor payload: neither a safetensors buffer nor a (torch) pickle")
    obj = _unpickle(raw)
    return _bucket_blobs(obj) if load_format == "flattened_bucket" else _named_blobs(obj, tp_rank)


# ----------------------------------------------------------------------------------------------------------
# distributed transport (init_weights_update_group / update_weights_from_distributed)
# ----------------------------------------------------------------------------------------------------------


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__


def _local_ip_towards(master: str) -> str | None:
    """The local address gloo should bind so that peers (which reach ``master``) can reach us."""
    if master in ("localhost", "::1") or master.startswith("127."):
        return "127.0.0.1"
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect((master, 9))  # UDP connect sends nothing; it picks the route
            return s.getsockname()[0]
    except OSError:
        return None


def distributed_metadata(named: Mapping[str, Any]) -> dict[str, list]:
    """The ``names``/``dtypes``/``shapes`` fields of ``/update_weights_from_distributed`` for ``named``."""
    blobs = _as_blobs(named)
    return {"names": list(blobs), "dtypes": [b.dtype for b in blobs.values()],
            "shapes": [list(b.shape) for b in blobs.values()]}


class DistributedGroup:
    """One rank of a weight-update group: a real gloo process group, outside torch's global registry.

    Rank 0 is the trainer (it hosts the TCPStore); engine ranks are ``rank_offset + tp_rank``. ``receive`` and
    ``send`` block; run them in threads (one per rank) when several ranks live in one process."""

    def __init__(self, *, pg: Any, store: Any, rank: int, world_size: int, group_name: str, backend: str,
                 master_address: str, master_port: int, timeout_s: float):
        self._pg = pg
        self._store = store
        self.rank = rank
        self.world_size = world_size
        self.group_name = group_name
        self.backend = backend  # as requested ("nccl" or "gloo"); the transport is always gloo
        self.master_address = master_address
        self.master_port = master_port
        self.timeout_s = timeout_s
        self._lock = threading.Lock()
        self._broken: str | None = None

    def __repr__(self) -> str:
        state = "destroyed" if self._pg is None else ("broken" if self._broken else "ready")
        return (f"DistributedGroup({self.group_name!r}, rank={self.rank}/{self.world_size}, "
                f"{self.master_address}:{self.master_port}, {state})")

    @property
    def closed(self) -> bool:
        return self._pg is None

    @classmethod
    def join(cls, master_address: str, master_port: int, rank: int, world_size: int, group_name: str,
             backend: str = "gloo", timeout_s: float = 60.0) -> DistributedGroup:
        """Join the group (blocking rendezvous; every rank must call it). Fails with ``WeightError`` within
        ``timeout_s`` when the other ranks do not all show up."""
        if not isinstance(world_size, int) or world_size < 1:
            raise WeightError(f"world_size must be a positive int, got {world_size!r}")
        if not isinstance(rank, int) or not 0 <= rank < world_size:
            raise WeightError(f"rank {rank!r} is outside [0, {world_size}) (rank = rank_offset + tp_rank)")
        if not isinstance(master_port, int) or not 0 < master_port < 65536:
            raise WeightError(f"master_port must be an int in (0, 65536), got {master_port!r}")
        if not group_name or not isinstance(group_name, str):
            raise WeightError(f"group_name must be a non-empty string, got {group_name!r}")
        # SGLang's engines default to backend="nccl". The fake runs on CPU, where NCCL does not exist, so
        # "nccl" is served by gloo (same rendezvous, same broadcast semantics). Anything else is refused.
        if str(backend).lower() not in ("nccl", "gloo"):
            raise WeightError(f"unsupported backend {backend!r}: the fake supports 'gloo' (and maps 'nccl' to gloo)")
        if timeout_s <= 0:
            raise WeightError(f"timeout_s must be positive, got {timeout_s}")
        try:
            import torch.distributed as dist  # lazy
        except ImportError:
            raise WeightError("the distributed weight transport needs torch, which is not installed") from None
        if not dist.is_available() or not dist.is_gloo_available():
            raise WeightError("this torch build has no torch.distributed gloo backend")

        lock = threading.Lock()
        state: dict[str, Any] = {}
        done = threading.Event()

        def connect() -> None:
            try:
                made = _make_gloo_group(master_address, master_port, rank, world_size, group_name, deadline)
            except BaseException as e:  # noqa: BLE001 - handed to the caller
                with lock:
                    state["error"] = e
            else:
                with lock:
                    if state.get("abandoned"):
                        _shutdown_pg(made[0])  # the caller gave up: leave nothing behind
                    else:
                        state["ok"] = made
            finally:
                done.set()

        # The rendezvous runs in its own thread so that the caller gets an answer within timeout_s even where
        # torch's own timeouts overshoot a little. Not a daemon: a thread still inside torch's C++ rendezvous
        # when the interpreter exits aborts the process; every phase is bounded by the deadline, so exit
        # waits at most about a second for it.
        deadline = time.monotonic() + timeout_s
        thread = threading.Thread(target=connect, name=f"weights-join-{group_name}-r{rank}")
        thread.start()
        done.wait(timeout_s)
        where = f"weight update group {group_name!r} at {master_address}:{master_port} as rank {rank} of {world_size}"
        with lock:
            if "ok" in state:
                pg, store = state["ok"]
                return cls(pg=pg, store=store, rank=rank, world_size=world_size, group_name=group_name,
                           backend=str(backend).lower(), master_address=master_address,
                           master_port=master_port, timeout_s=timeout_s)
            err = state.get("error")
            timed_out = err is None or isinstance(err, TimeoutError) or time.monotonic() >= deadline - 0.05 or (
                "timed out" in str(err).lower() or "timeout" in type(err).__name__.lower())
            if timed_out:
                state["abandoned"] = True
                cause = "" if err is None else f" ({type(err).__name__}: {_first_line(err)})"
                hint = ("the engines did not all join (check world_size and that every engine got "
                        "/init_weights_update_group)") if rank == 0 else (
                        "the trainer (rank 0) is not hosting the rendezvous there, or not every rank joined "
                        "(check master_address/master_port, rank_offset and world_size)")
                raise WeightError(f"Timed out after {timeout_s:g}s joining {where}: {hint}{cause}")
        raise WeightError(f"Failed to join {where}: {type(err).__name__}: {_first_line(err)}")

    def _check_usable(self) -> None:
        if self._pg is None:
            raise WeightError(f"weight update group {self.group_name!r} has been destroyed")
        if self._broken:
            raise WeightError(
                f"weight update group {self.group_name!r} is unusable after an earlier failure ({self._broken}); "
                f"destroy it and initialise a new one")

    def _broadcast(self, tensor: Any, name: str, timeout_s: float) -> None:
        import datetime

        import torch
        import torch.distributed as dist

        wire = tensor
        if str(tensor.dtype).startswith("torch.float8"):  # gloo has no float8: same bytes as uint8
            wire = tensor.view(torch.uint8)
        opts = dist.BroadcastOptions()
        opts.rootRank = 0
        opts.rootTensor = 0
        # the operation's own timeout, not only the wait's: an abandoned broadcast must not outlive it (a group
        # with one in flight cannot be torn down before it expires)
        opts.timeout = datetime.timedelta(seconds=timeout_s)
        try:
            work = self._pg.broadcast([wire], opts)
            work.wait(datetime.timedelta(seconds=timeout_s))
        except Exception as e:  # noqa: BLE001 - gloo raises RuntimeError / DistError subclasses
            self._broken = f"broadcast of {name!r} failed: {_first_line(e)}"
            raise WeightError(
                f"broadcast of {name!r} in weight update group {self.group_name!r} (rank {self.rank}) failed: "
                f"{_first_line(e)} (did every rank issue the same broadcasts in the same order?)") from None

    def receive(self, names: list[str], dtypes: list[str], shapes: list[list[int]],
                timeout_s: float | None = None) -> dict[str, TensorBlob]:
        """Receive one broadcast per tensor from rank 0, in order (what SGLang's model runner does for
        ``/update_weights_from_distributed``). Blocking; ``timeout_s`` per tensor (default: the join timeout).
        A failure or timeout leaves the group unusable (the other ranks are out of step)."""
        import torch  # lazy

        if not (len(names) == len(dtypes) == len(shapes)):
            raise WeightError(
                f"names, dtypes and shapes must have the same length, got {len(names)}, {len(dtypes)}, {len(shapes)}")
        specs = []
        for name, dtype, shape in zip(names, dtypes, shapes):
            try:
                dt = _dtype_name(dtype)
                shp = tuple(int(d) for d in shape)
            except (WeightError, TypeError, ValueError) as e:
                raise WeightError(f"parameter {name!r}: {e}") from None
            specs.append((name, dt, shp))
        timeout = self.timeout_s if timeout_s is None else timeout_s
        out: dict[str, TensorBlob] = {}
        with self._lock:
            self._check_usable()
            for name, dt, shp in specs:
                tensor = torch.empty(shp, dtype=getattr(torch, dt))
                self._broadcast(tensor, name, timeout)
                out[name] = TensorBlob.from_torch(tensor)
        return out

    def send(self, named: Mapping[str, Any], timeout_s: float | None = None) -> None:
        """Rank 0 only: broadcast every tensor, in mapping order. Blocking."""
        if self.rank != 0:
            raise WeightError(f"only rank 0 (the trainer) sends; this is rank {self.rank}")
        blobs = _as_blobs(named)
        timeout = self.timeout_s if timeout_s is None else timeout_s
        with self._lock:
            self._check_usable()
            for name, blob in blobs.items():
                self._broadcast(blob.to_torch(), name, timeout)

    def destroy(self) -> None:
        """Leave the group and release its resources. Idempotent."""
        with self._lock:
            pg, self._pg = self._pg, None
            self._store = None
        if pg is not None:
            # a broken group may still have a broadcast in flight: shutdown() would wait for it to time out
            _shutdown_pg(pg, abort=self._broken is not None)

    def __enter__(self) -> DistributedGroup:
        return self

    def __exit__(self, *exc: object) -> None:
        self.destroy()


def _wait_for_listener(host: str, port: int, deadline: float) -> None:
    """Block until something accepts TCP connections at host:port (the trainer's TCPStore), or the deadline.

    torch's TCPStore client retries well past its own timeout when nobody listens; probing first keeps the
    whole rendezvous inside the caller's deadline."""
    while True:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise TimeoutError(f"nothing accepted connections at {host}:{port}")
        try:
            with socket.create_connection((host, port), timeout=min(remaining, 1.0)):
                return
        except OSError:
            threading.Event().wait(min(0.05, max(0.0, deadline - time.monotonic())))


def _make_gloo_group(master_address: str, master_port: int, rank: int, world_size: int, group_name: str,
                     deadline: float) -> tuple[Any, Any]:
    """Build the group the way SGLang's ``init_custom_process_group`` + torch's ``_new_process_group_helper``
    do for gloo, minus the global registration: ``rendezvous("tcp://host:port")`` (rank 0 hosts a
    multi-tenant TCPStore), ``PrefixStore(group_name)``, ``PrefixStore(group_name + "/")``,
    ``PrefixStore("cpu/")``, ``ProcessGroupGloo`` and the sequence-number handshake. Every phase is bounded
    by ``deadline`` (``time.monotonic()``)."""
    import datetime

    import torch.distributed as dist
    from torch.distributed import PrefixStore, ProcessGroupGloo

    def left() -> datetime.timedelta:
        return datetime.timedelta(seconds=max(0.001, deadline - time.monotonic()))

    if rank != 0:
        _wait_for_listener(master_address, master_port, deadline)
    host = f"[{master_address}]" if ":" in master_address else master_address
    store, _, _ = next(dist.rendezvous(f"tcp://{host}:{master_port}", rank, world_size, timeout=left()))
    store.set_timeout(left())
    group_store = PrefixStore(group_name, store)
    backend_store = PrefixStore("cpu/", PrefixStore(f"{group_name}/", group_store))
    opts = ProcessGroupGloo._Options()
    opts._timeout = left()
    local_ip = _local_ip_towards(master_address)
    if local_ip is not None:
        opts._devices = [ProcessGroupGloo.create_device(hostname=local_ip)]
    else:
        opts._devices = [ProcessGroupGloo.create_default_device()]
    pg = ProcessGroupGloo(backend_store, rank, world_size, opts)
    pg._set_sequence_number_for_group()
    return pg, store


def _shutdown_pg(pg: Any, abort: bool = False) -> None:
    try:
        pg.abort() if abort else pg.shutdown()
    except Exception:  # noqa: BLE001 - best effort: a peer may already be gone
        pass


def trainer_group(master_address: str, master_port: int, world_size: int, group_name: str,
                  timeout_s: float = 60.0) -> DistributedGroup:
    """Rank 0 (the trainer) of a weight-update group: hosts the rendezvous, then ``.send(named)``."""
    return DistributedGroup.join(master_address, master_port, 0, world_size, group_name, "gloo", timeout_s)


# ----------------------------------------------------------------------------------------------------------
# LoRA adapters
# ----------------------------------------------------------------------------------------------------------


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


# ----------------------------------------------------------------------------------------------------------
# /get_weights_by_name
# ----------------------------------------------------------------------------------------------------------


def values_preview(blob: TensorBlob, truncate_size: int = 100) -> list | None:
    """What SGLang's ``get_weights_by_name`` returns: ``param.to(float32).numpy().tolist()[:truncate_size]``
    -- the first ``truncate_size`` entries along dim 0 (rows of a 2-D weight, nested lists for N-D), values
    rounded to float32 and returned as Python floats. A 0-d tensor gives ``None`` (SGLang's slice of a
    scalar fails and it returns None)."""
    blob = _as_blob(blob)
    if not blob.shape:
        return None
    rows = len(range(blob.shape[0])[: int(truncate_size)])  # python slice semantics, negatives included
    inner = blob.shape[1:]
    row_numel = _numel(inner)
    flat = [_to_f32(float(v)) for v in _decode(blob.dtype, blob.data, rows * row_numel)]

    def nest(values: list, shape: tuple[int, ...]) -> list:
        if len(shape) <= 1:
            return values
        step = _numel(shape[1:])
        return [nest(values[i * step:(i + 1) * step], shape[1:]) for i in range(shape[0])]

    return nest(flat, (rows,) + inner)
