"""``TensorBlob`` (one tensor as dtype name, shape and raw little-endian bytes), ``WeightStore`` (what one engine
holds: an immutable name -> blob mapping with an order-independent ``digest()`` and an in-order ``updated()`` that says how far a failed load got),
``weights_digest`` and ``values_preview`` (what ``/get_weights_by_name`` answers)."""

from __future__ import annotations

import hashlib
import json
import struct
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from .dtypes import _cast_floats, _decode, _dtype_name, _encode, _itemsize, _numel, _to_f32
from .weight_errors import WeightError


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

        In order, as SGLang's ``load_weights`` copies them: an unknown name, a shape mismatch or (unless ``cast``) a
        dtype mismatch raises ``WeightError`` naming the parameter, its ``partial`` the store with the parameters
        before it loaded (``default_weight_loader`` asserts each shape as it goes; the distributed update then answers
        "The full weights of the ModelRunner are partially updated", ``model_runner_components/weight_updater.py``,
        0.5.23). Real SGLang copies with ``param.data.copy_(loaded)``, which casts silently: ``cast=True`` models that
        (the stored dtype wins, values are converted like ``tensor.to``)."""
        new = _as_blobs(blobs)
        merged = dict(self._blobs)
        for done, (name, blob) in enumerate(new.items()):
            old = self._blobs.get(name)
            problem = None
            if old is None:
                problem = (f"unknown parameter {name!r}: the model has no such weight "
                           f"(SGLang load_weights raises KeyError: {name!r})")
            elif blob.shape != old.shape:  # default_weight_loader's assert, which does not name the parameter
                problem = (f"Attempted to load weight (torch.Size({list(blob.shape)})) "
                           f"into parameter (torch.Size({list(old.shape)}))")
            elif blob.dtype != old.dtype:
                if not cast:
                    problem = f"parameter {name!r}: dtype mismatch: got {blob.dtype}, the model holds {old.dtype}"
                else:
                    try:
                        blob = blob.astype(old.dtype)
                    except WeightError as e:
                        problem = f"parameter {name!r}: {e}"
            if problem is not None:
                raise WeightError(problem, partial=WeightStore(merged) if done else None)
            merged[name] = blob
        return WeightStore(merged)


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
