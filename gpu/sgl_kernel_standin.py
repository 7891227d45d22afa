"""A STAND-IN for SGLang's CPU kernel package ``sgl_kernel``, written for weightsync-conformance (not SGLang's code).

``python -m gpu.sglang_cpu install`` copies this file into a real-SGLang-on-CPU virtual environment as
``sgl_kernel/__init__.py``, because the registry has no CPU build of the kernel package (``sglang-kernel`` and
``sgl-kernel`` are CUDA-only wheels) and SGLang's CPU engine imports it at start-up. It is never installed where a
real kernel package is.

It implements, in plain torch, only the two KV-pool bookkeeping helpers a plain Llama calls on the CPU path:

* :func:`assign_req_to_token_pool_cpu` (SGLang ``python/sglang/srt/mem_cache/allocation.py``);
* :func:`copy_all_layer_kv_cache_cpu` (SGLang ``python/sglang/srt/kernels/ops/kvcache/cache_move.py``, 0.5.23).

Every other name (and every ``sgl_kernel.*`` submodule, e.g. ``sgl_kernel.kvcacheio``) is importable, so SGLang's
modules load, but raises :class:`StandInNotImplemented` when called. With no ``torch.ops.sgl_kernel.*`` op
registered, SGLang's CPU path uses native torch for layernorm, activation, rotary and the KV store.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
import types
from typing import Any

import torch

IS_WEIGHTSYNC_STANDIN = True
"""How the installer recognises this module (it refuses to overwrite anything else named ``sgl_kernel``)."""


class StandInNotImplemented(NotImplementedError):
    """A kernel the stand-in does not provide was called: the run needs SGLang's real CPU kernel package."""


def assign_req_to_token_pool_cpu(req_pool_indices: torch.Tensor, req_to_token: torch.Tensor,
                                 start_offset: torch.Tensor, end_offset: torch.Tensor,
                                 out_cache_loc: torch.Tensor, pool_len: int) -> None:
    """For each request ``r`` with ``[s, e)``, write the next ``e - s`` entries of ``out_cache_loc`` into
    ``req_to_token[r, s:e]`` (the requests' slices follow each other in ``out_cache_loc``)."""
    del pool_len  # the row width of req_to_token; torch checks the bounds itself
    position = 0
    for row, start, end in zip(req_pool_indices.tolist(), start_offset.tolist(), end_offset.tolist()):
        length = end - start
        req_to_token[row, start:end] = out_cache_loc[position:position + length].to(req_to_token.dtype)
        position += length


def copy_all_layer_kv_cache_cpu(data_ptrs: torch.Tensor, strides: torch.Tensor, tgt_loc: torch.Tensor,
                                src_loc: torch.Tensor) -> None:
    """For each layer buffer (base address ``data_ptrs[i]``, row stride ``strides[i]`` bytes), copy row ``src_loc[j]``
    to row ``tgt_loc[j]`` for every ``j``, reading all source rows before writing any."""
    if tgt_loc.numel() == 0:
        return
    rows = int(max(int(tgt_loc.max()), int(src_loc.max()))) + 1
    src, tgt = src_loc.long(), tgt_loc.long()
    for pointer, stride in zip(data_ptrs.tolist(), strides.tolist()):
        buffer = _byte_rows(int(pointer), rows, int(stride))
        buffer[tgt] = buffer[src].clone()


def _byte_rows(pointer: int, rows: int, stride: int) -> torch.Tensor:
    """A ``(rows, stride)`` uint8 view of the memory at ``pointer`` (a KV buffer held alive by its owner)."""
    import ctypes

    array = (ctypes.c_uint8 * (rows * stride)).from_address(pointer)
    return torch.frombuffer(array, dtype=torch.uint8).view(rows, stride)


class _Missing:
    """A kernel the stand-in does not implement: importable, attribute chains allowed, calling raises."""

    def __init__(self, name: str) -> None:
        self._name = name

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        raise StandInNotImplemented(
            f"{self._name} is not implemented by weightsync-conformance's sgl_kernel stand-in (it provides only "
            "assign_req_to_token_pool_cpu and copy_all_layer_kv_cache_cpu); this run needs SGLang's real kernel")

    def __getattr__(self, attr: str) -> Any:
        if attr.startswith("__"):
            raise AttributeError(attr)
        return _Missing(f"{self._name}.{attr}")

    def __repr__(self) -> str:
        return f"<sgl_kernel stand-in: {self._name} (raises when called)>"


def _missing_attr(module_name: str):
    def __getattr__(attr: str) -> Any:
        if attr.startswith("__"):
            raise AttributeError(attr)
        return _Missing(f"{module_name}.{attr}")
    return __getattr__


def __getattr__(attr: str) -> Any:  # noqa: N807 — module-level fallback (PEP 562)
    if attr.startswith("__"):
        raise AttributeError(attr)
    return _Missing(f"sgl_kernel.{attr}")


class _SubmoduleFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Answers ``import sgl_kernel.X[.Y]`` with a module whose every name raises when called."""

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> importlib.machinery.ModuleSpec | None:
        if not fullname.startswith(__name__ + "."):
            return None
        return importlib.machinery.ModuleSpec(fullname, self, is_package=True)

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        module = types.ModuleType(spec.name, f"sgl_kernel stand-in submodule {spec.name} (every name raises)")
        module.__path__ = []
        module.__getattr__ = _missing_attr(spec.name)  # type: ignore[method-assign]
        return module

    def exec_module(self, module: types.ModuleType) -> None:
        return None


if __name__ != "gpu.sgl_kernel_standin" and not any(isinstance(f, _SubmoduleFinder) for f in sys.meta_path):
    __path__: list[str] = []  # a package, so ``sgl_kernel.X`` submodules resolve through the finder
    sys.meta_path.append(_SubmoduleFinder())
