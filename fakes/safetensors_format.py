"""The safetensors format with the stdlib: ``u64 little-endian N`` + ``N`` bytes of UTF-8 JSON header (``{name:
{"dtype": "BF16", "shape": [..], "data_offsets": [begin, end]}, "__metadata__": {str: str}}``, offsets relative to
the byte buffer that follows the header, padded with spaces to 8 bytes) + the raw data. Reading validates it the way
the ``safetensors`` library does and raises ``CheckpointError`` with the same reasons (``"Error while deserializing
header: incomplete metadata, file not fully covered"`` ...)."""

from __future__ import annotations

import json
import struct
from collections.abc import Mapping
from typing import Any

from .dtypes import _DTYPES, _ST_TO_DTYPE, _itemsize, _numel
from .tensors import TensorBlob, _as_blobs
from .weight_errors import CheckpointError


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
