"""Tensor payloads of ``/update_weights_from_tensor`` (``serialized_named_tensors``, one item per TP rank) and
``/load_lora_adapter_from_tensors``.

Encodings: ``"torch"`` -- what SGLang's ``MultiprocessingSerializer.serialize(named_tensors, output_str=True)``
produces: a ``ForkingPickler`` pickle of ``(name, tensor)`` pairs whose CPU tensors are moved to shared memory
(handles served by the sender: decodable once, same host, sender alive); ``"pickle"`` -- the same list pickled with
tensors inline (real SGLang accepts it too). Also what SGLang's ``weight_sync`` helper sends
(``LocalSerializedTensor`` per TP rank) and ``load_format="flattened_bucket"``, decoded without importing sglang.
Pickles are read with an allow-list unpickler, as SGLang's ``SafeUnpickler`` does (not a security boundary: torch's
rebuild functions are allowed). Anything else -- a safetensors buffer included -- is what ``deserialize`` cannot
read: :class:`~.weight_errors.UndecodablePayload`, which kills SGLang's scheduler (``utils/common.py``
``MultiprocessingSerializer.deserialize``, 0.5.10–0.5.23), so it kills the fake."""

from __future__ import annotations

import base64
import binascii
import io
import pickle
from collections.abc import Mapping
from typing import Any

from .facts import SGLANG
from .safetensors_format import _looks_like_safetensors
from .tensors import TensorBlob, _as_blobs
from .weight_errors import UndecodablePayload, WeightError, first_line as _first_line


PAYLOAD_FORMATS = ("pickle", "torch")
_SAFE_BUILTINS = frozenset({"list", "tuple", "dict", "set", "frozenset", "bytearray", "bytes", "int", "float",
                            "complex", "bool", "str", "slice", "range"})


def _named_tensors(blobs: Mapping[str, Any]) -> list:
    out = []
    for name, blob in _as_blobs(blobs).items():
        out.append((name, blob.to_torch()))
    return out


def _pickled(obj: Any, fmt: str, local_module: str | None = None) -> bytes:
    """``fmt="torch"``: ``MultiprocessingSerializer.serialize`` (a ForkingPickler: tensors as shared-memory
    handles); ``"pickle"``: tensors inline. The SGLang stand-ins below are written under SGLang's own names
    (``LocalSerializedTensor`` under ``local_module``, the newest release's by default)."""
    import torch  # lazy  # noqa: F401
    import torch.multiprocessing  # noqa: F401  (registers torch's ForkingPickler reductions)

    buf = io.BytesIO()
    if fmt == "torch" and not _has_standin(obj):
        from multiprocessing.reduction import ForkingPickler

        ForkingPickler(buf).dump(obj)
    else:
        _SGLangPickler(buf, shared=fmt == "torch", local_module=local_module or _local_module(None)).dump(obj)
    return buf.getvalue()


def encode_lora_tensor_payload(blobs: Mapping[str, Any], fmt: str = "pickle") -> str:
    """One ``/load_lora_adapter_from_tensors`` payload: a ``{name: tensor}`` dict pickled as ``fmt`` (``"torch"``
    or ``"pickle"``, as :func:`encode_tensor_payload`)."""
    if fmt not in ("torch", "pickle"):
        raise ValueError(f"fmt must be 'torch' or 'pickle', got {fmt!r}")
    return base64.b64encode(_pickled(dict(_named_tensors(blobs)), fmt)).decode("ascii")


def encode_tensor_payload(blobs: Mapping[str, Any], fmt: str = "pickle") -> str:
    """One ``serialized_named_tensors`` item (a base64 str) for ``/update_weights_from_tensor`` (needs torch).

    ``fmt``: ``"pickle"`` (tensors inline, any process), ``"torch"`` (SGLang's
    ``MultiprocessingSerializer.serialize(list_of_(name, tensor), output_str=True)``: shared-memory handles, decode
    once, same host, sender alive)."""
    if fmt not in PAYLOAD_FORMATS:
        raise ValueError(f"fmt must be one of {PAYLOAD_FORMATS}, got {fmt!r}")
    return base64.b64encode(_pickled(_named_tensors(blobs), fmt)).decode("ascii")


def encode_weight_sync_payload(blobs: Mapping[str, Any], tp_size: int = 1, fmt: str = "torch",
                               release: str | None = None) -> list[str]:
    """``serialized_named_tensors`` as SGLang's ``weight_sync.utils.update_weights`` builds it for ``tp_size`` ranks:
    one item per rank, each ``[(name, LocalSerializedTensor(values=[payload of rank 0, ..., rank tp_size-1]))]``,
    every value a ``MultiprocessingSerializer`` payload of the tensor (``fmt="pickle"``: inline). The class is
    pickled under its module in SGLang ``release`` (the newest by default): an engine of a release where it lives
    elsewhere cannot read it, and dies (fact ``local_serialized_tensor_module``)."""
    if fmt not in ("torch", "pickle"):
        raise ValueError(f"fmt must be 'torch' or 'pickle', got {fmt!r}")
    if tp_size < 1:
        raise ValueError(f"tp_size must be >= 1, got {tp_size}")
    named = []
    for name, tensor in _named_tensors(blobs):
        wrapped = LocalSerializedTensor()
        wrapped.values = [_pickled(tensor, fmt) for _ in range(tp_size)]
        named.append((name, wrapped))
    item = base64.b64encode(_pickled(named, "pickle", _local_module(release))).decode("ascii")
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
    where one tensor lies in the bucket's flat uint8 tensor (``start_idx:end_idx``), its ``name``, ``shape`` and
    ``dtype``."""

    name: str
    shape: Any
    dtype: Any
    start_idx: int
    end_idx: int
    numel: int


_BUCKET_METADATA = ("sglang.srt.weight_sync.tensor_bucket", "FlattenedTensorMetadata")
"""Where SGLang's ``FlattenedTensorMetadata`` lives (every release with ``flattened_bucket``)."""


def _local_module(release: str | None) -> str:
    """The module ``LocalSerializedTensor`` lives in, in SGLang ``release`` (the newest by default)."""
    return SGLANG.fact("local_serialized_tensor_module", release or SGLANG.default_release)


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

    def __init__(self, file: Any, shared: bool, local_module: str) -> None:
        super().__init__(file, protocol=4)
        self._names = {LocalSerializedTensor: (local_module, "LocalSerializedTensor"),
                       FlattenedTensorMetadata: _BUCKET_METADATA}
        if shared:
            import copyreg
            from multiprocessing.reduction import ForkingPickler

            self.dispatch_table = {**copyreg.dispatch_table, **ForkingPickler._extra_reducers}

    def save_global(self, obj: Any, name: str | None = None) -> None:
        path = self._names.get(obj)
        if path is None:
            super().save_global(obj, name)
            return
        self.save(path[0])
        self.save(path[1])
        self.write(pickle.STACK_GLOBAL)
        self.memoize(obj)


class _PayloadUnpickler(pickle.Unpickler):
    """SGLang's ``SafeUnpickler`` of one release: its data containers where they live (``LocalSerializedTensor`` in
    ``local_module``: any other path fails in SGLang, be it blocked or no longer there), torch's rebuilds."""

    def __init__(self, file: Any, local_module: str) -> None:
        super().__init__(file)
        self._standins = {(local_module, "LocalSerializedTensor"): LocalSerializedTensor,
                          _BUCKET_METADATA: FlattenedTensorMetadata}

    def find_class(self, module: str, name: str) -> Any:
        standin = self._standins.get((module, name))
        if standin is not None:
            return standin
        if (module == "torch" or module.startswith("torch.")
                or (module == "multiprocessing.resource_sharer" and name == "DupFd")
                or (module == "collections" and name == "OrderedDict")
                or (module == "copyreg" and name in ("__newobj__", "__newobj_ex__"))
                or (module == "builtins" and name in _SAFE_BUILTINS)):
            return super().find_class(module, name)
        raise pickle.UnpicklingError(f"blocked unpickle of {module}.{name}: not allowed in a weight payload")


def _unpickle(raw: bytes, local_module: str) -> Any:
    """``MultiprocessingSerializer.deserialize``: the object in a (torch) pickle, tensors rebuilt."""
    try:
        import torch  # noqa: F401  lazy
        import torch.multiprocessing  # noqa: F401  (rebuild functions for shared-memory handles)
    except ImportError:
        raise UndecodablePayload("this payload is a torch pickle; decoding it needs torch, which is not "
                                 "installed") from None
    try:
        return _PayloadUnpickler(io.BytesIO(raw), local_module).load()
    except pickle.UnpicklingError as e:
        raise UndecodablePayload(f"undecodable tensor payload: {e}") from None
    except (EOFError, ConnectionError, OSError) as e:
        raise UndecodablePayload(
            f"tensor payload holds shared-memory handles that cannot be opened ({type(e).__name__}: {e}): a "
            f"MultiprocessingSerializer payload is decodable once, on the sender's host, while the sender "
            f"process lives (use fmt='pickle' for a self-contained payload)") from None
    except Exception as e:  # noqa: BLE001 - arbitrary bytes can fail unpickling in many ways
        name = type(e).__name__
        if name == "AuthenticationError":
            raise UndecodablePayload(
                "tensor payload holds shared-memory handles of another process family "
                "(multiprocessing authkey mismatch); use fmt='pickle' for a self-contained payload") from None
        raise UndecodablePayload(f"undecodable tensor payload ({name}: {e})") from None


def _unwrap(value: Any, tp_rank: int, where: str, local_module: str) -> TensorBlob:
    """``weight_updater._unwrap_tensor``: a tensor, or a ``LocalSerializedTensor`` whose ``values[tp_rank]`` is."""
    import torch

    if isinstance(value, LocalSerializedTensor):
        values = getattr(value, "values", None)
        if not isinstance(values, list) or not 0 <= tp_rank < len(values):
            count = len(values) if isinstance(values, list) else 0
            raise WeightError(f"{where}: LocalSerializedTensor has {count} rank payload(s), none for tp_rank {tp_rank}")
        value = _deserialize(values[tp_rank], local_module)
    if not isinstance(value, torch.Tensor):
        raise WeightError(f"{where} is not a (name: str, tensor) pair")
    return TensorBlob.from_torch(value)


def _named_blobs(obj: Any, tp_rank: int, local_module: str) -> dict[str, TensorBlob]:
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
        out[item[0]] = _unwrap(item[1], tp_rank, f"tensor payload item {i}", local_module)
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
        if not _looks_like_pickle(raw):  # utils/common.py normalize_serialized_named_tensor_payload (0.5.23)
            try:
                raw = base64.b64decode(raw, validate=True)
            except (binascii.Error, ValueError):
                pass
        return raw
    raise WeightError(f"serialized_named_tensors item must be a str or bytes, got {type(item).__name__}")


def _looks_like_pickle(raw: bytes) -> bool:
    """A pickle's header: PROTO and a protocol this Python reads (``_looks_like_pickle_payload``, 0.5.23)."""
    return len(raw) >= 2 and raw[0] == 0x80 and raw[1] <= pickle.HIGHEST_PROTOCOL


def _deserialize(item: str | bytes, local_module: str) -> Any:
    """``MultiprocessingSerializer.deserialize`` of one payload item: :class:`UndecodablePayload` for anything but
    a pickle it reads (a safetensors buffer is named as such: a trainer's likeliest mistake)."""
    raw = _raw_payload(item)
    if not _looks_like_pickle(raw):
        what = "a safetensors buffer" if _looks_like_safetensors(raw) else "not a pickle"
        raise UndecodablePayload(
            f"UnpicklingError: the tensor payload is {what}: SGLang reads it with MultiprocessingSerializer."
            f"deserialize (a pickle: MultiprocessingSerializer.serialize, or pickle.dumps of (name, tensor) pairs "
            f"with tensors inline) and its scheduler dies on anything else")
    return _unpickle(raw, local_module)


#: ``load_format`` values of ``/update_weights_from_tensor`` the fake decodes (SGLang also takes custom loaders).
TENSOR_LOAD_FORMATS = (None, "direct", "flattened_bucket")


def decode_lora_tensor_payload(item: str | bytes, *, tp_rank: int = 0, release: str | None = None
                               ) -> dict[str, TensorBlob]:
    """Decode one ``/load_lora_adapter_from_tensors`` payload: a pickled ``{name: tensor}`` dict
    (``tp_worker.load_lora_adapter_from_tensors`` reads ``tensors = data`` and the adapter iterates
    ``tensors.items()``); a pickled list fails there as it does in SGLang, with ``AttributeError`` (answered), a
    payload it cannot deserialize with :class:`UndecodablePayload` (the scheduler dies), as SGLang ``release``
    reads it (the newest by default)."""
    local_module = _local_module(release)
    obj = _deserialize(item, local_module)
    if not isinstance(obj, Mapping):
        raise AttributeError(f"'{type(obj).__name__}' object has no attribute 'items'")
    return _named_blobs(list(obj.items()), tp_rank, local_module)


def decode_tensor_payload(item: str | bytes, *, tp_rank: int = 0, load_format: str | None = None,
                          release: str | None = None) -> dict[str, TensorBlob]:
    """Decode one ``serialized_named_tensors`` item (the one of ``tp_rank``) -> name -> blob (in payload order).

    The forms SGLang takes, decoded without importing sglang: a list of ``(name, tensor)`` pairs; pairs whose
    value is a ``LocalSerializedTensor`` (what SGLang's ``weight_sync`` helper sends: ``values[tp_rank]`` is this
    rank's tensor payload); with ``load_format="flattened_bucket"`` a ``{"flattened_tensor", "metadata"}`` dict.
    Raises ``WeightError`` for bad base64 or a payload of the wrong form, :class:`UndecodablePayload` for one
    ``deserialize`` cannot read, as SGLang ``release`` reads it (the newest by default)."""
    if load_format not in TENSOR_LOAD_FORMATS:
        raise WeightError(f"Unknown load_format={load_format}")
    local_module = _local_module(release)
    obj = _deserialize(item, local_module)
    return _bucket_blobs(obj) if load_format == "flattened_bucket" else _named_blobs(obj, tp_rank, local_module)
