"""Torch dtypes without torch: names and aliases, item sizes, exact element decoding and encoding (floats rounded
like torch: round to nearest even, inf on overflow), and vectorised float casts (torch, else numpy, when installed)."""

from __future__ import annotations

import functools
import math
import struct
import warnings
from typing import Any

from .weight_errors import WeightError


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
            with warnings.catch_warnings():  # read-only source: .to() copies, nothing writes to it
                warnings.simplefilter("ignore", UserWarning)
                source = torch.frombuffer(data, dtype=getattr(torch, src))
            return source.to(getattr(torch, dst)).view(torch.uint8).numpy().tobytes()
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
