"""How the trainer's tensors reach the engines: disk, tensor, distributed (gloo/NCCL broadcast) and LoRA.

A transport only moves weights; the updater owns the cycle around it (pause, flush, session, version,
continue). No transport stamps ``weight_version`` into its payloads: SGLang would flip the label on the first
bucket, before the whole update succeeded (rl-frameworks V2 note); the bump is the updater's separate
``/update_weight_version`` call.

The tensor transport sends what SGLang's ``MultiprocessingSerializer.deserialize`` reads, a pickle of
``(name, tensor)`` pairs (:func:`encode_pickle_b64`): anything else kills its scheduler. That and the distributed
transport need torch (imported where used); the disk transport and LoRA adapters loaded from disk need none.
"""

from __future__ import annotations

import asyncio
import base64
import importlib.util
import json
import logging
import os
import pickle
import shutil
import sys
import tempfile
import uuid
from datetime import timedelta
from pathlib import Path
from typing import Any, Callable, Mapping, Protocol, Sequence

from fakes.safetensors_format import encode_safetensors
from fakes.tensors import TensorBlob

from ..interface import LoraAdapter
from .releases import release_of
from .concurrency import gather_all, gather_or_cancel, run_in_daemon_thread, settle_all
from .protocols import WeightSyncClient

log = logging.getLogger(__name__)

TORCH_EXTRA = "pip install 'weightsync-conformance[torch]'"
"""What installs torch for the transports that need it (the distributed transport, pickled payloads)."""

Tensor = Any
"""A ``torch.Tensor``; without torch installed, a ``fakes.weights.TensorBlob`` (dtype name, shape, raw bytes), as
the suite's stand-in trainer then produces (the disk, tensor and LoRA transports take either)."""
NamedTensors = Sequence[tuple[str, Tensor]]
TensorEncoder = Callable[[NamedTensors], str]
"""Serializes named tensors into one ``serialized_named_tensors`` entry (a string for the JSON body)."""
CheckpointWriter = Callable[[Path, str, Mapping[str, Tensor], Mapping[str, Any]], Path]
"""``(root, name, tensors, config) -> final directory``: writes one checkpoint under ``root``."""


def is_torch_tensor(t: Any) -> bool:
    """Whether ``t`` is a ``torch.Tensor`` (never imports torch: nothing is one until torch was imported)."""
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(t, torch.Tensor)


def import_torch_distributed() -> Any:
    """``torch.distributed``, or ``ModuleNotFoundError`` naming the extra that installs it."""
    try:
        import torch.distributed as dist
    except ModuleNotFoundError as exc:
        raise ModuleNotFoundError(f"the distributed transport needs torch ({exc}): {TORCH_EXTRA}") from exc
    return dist


def host_copy(t: Tensor) -> Tensor:
    """A contiguous CPU copy that shares storage with nothing (safetensors refuses shared storage)."""
    return t.detach().to("cpu").contiguous().clone()


def safetensors_bytes(tensors: Mapping[str, Tensor]) -> bytes:
    """The safetensors serialization of ``tensors``: ``safetensors.torch.save`` for torch tensors, else the stdlib
    encoder (the same bytes) for tensors given as ``TensorBlob``."""
    if any(is_torch_tensor(t) for t in tensors.values()):
        try:
            from safetensors.torch import save
        except ModuleNotFoundError:  # torch without the [torch] extra: the stdlib encoder reads torch tensors too
            pass
        else:
            return save({name: host_copy(t) for name, t in tensors.items()})
    return encode_safetensors(tensors)


def _inline(t: Tensor) -> Tensor:
    """A torch tensor that pickles inline (a ``TensorBlob`` converted; needs torch)."""
    return t.to_torch() if isinstance(t, TensorBlob) else host_copy(t)


def encode_pickle_b64(named_tensors: NamedTensors) -> str:
    """Default :data:`TensorEncoder`: base64 of a plain pickle of ``[(name, tensor), ...]`` (tensors inline), what
    SGLang's ``MultiprocessingSerializer.deserialize`` reads (needs torch; on GPU, SGLang's own
    ``MultiprocessingSerializer.serialize`` sends CUDA IPC handles instead)."""
    if not torch_installed():
        raise ModuleNotFoundError(f"tensor payloads are torch pickles (what SGLang's MultiprocessingSerializer reads): "
                                  f"they need torch, which is not installed ({TORCH_EXTRA})")
    return base64.b64encode(pickle.dumps([(n, _inline(t)) for n, t in named_tensors], protocol=4)).decode()


def encode_pickle_dict_b64(named_tensors: NamedTensors) -> str:
    """:func:`encode_pickle_b64` as a ``{name: tensor}`` dict: the form ``/load_lora_adapter_from_tensors`` reads
    (SGLang's ``tp_worker.load_lora_adapter_from_tensors`` takes the payload as the adapter's tensor dict)."""
    return base64.b64encode(pickle.dumps({n: _inline(t) for n, t in named_tensors}, protocol=4)).decode()


LORA_FORMS: dict[TensorEncoder, TensorEncoder] = {encode_pickle_b64: encode_pickle_dict_b64}
"""A weight-update encoder → the one that writes the same tensors as an adapter payload (any other encoder is used
as it is)."""


def torch_installed() -> bool:
    """Whether torch can be imported here (never imports it)."""
    return importlib.util.find_spec("torch") is not None


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_checkpoint_atomic(root: Path, name: str, tensors: Mapping[str, Tensor],
                            config: Mapping[str, Any], *, weights_file: str = "model.safetensors",
                            config_file: str = "config.json") -> Path:
    """Default :data:`CheckpointWriter` (F3; minimind wrote its checkpoints in place): write into a temp dir
    beside the target, fsync, then
    ``os.rename`` it to ``root / name``, so a reader sees either no checkpoint or a complete one. (A PEFT adapter
    is the same with ``adapter_model.safetensors`` and ``adapter_config.json``.)"""
    root.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{name}.", suffix=".tmp", dir=root))
    try:
        (staging / weights_file).write_bytes(safetensors_bytes(tensors))
        (staging / config_file).write_text(json.dumps(dict(config)))
        for path in (staging / weights_file, staging / config_file, staging):
            _fsync(path)
        final = root / name
        if final.exists():  # left by a failed attempt at this version: move it aside, never overwrite in place
            aside = Path(tempfile.mkdtemp(prefix=f".{name}.", suffix=".old", dir=root))
            os.rename(final, aside / name)
            shutil.rmtree(aside)
        os.rename(staging, final)
        _fsync(root)
        return final
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise


class WeightTransport(Protocol):
    """Moves full model weights into every engine."""

    needs_session: bool
    """Whether the transfer must run inside ``begin_weight_update`` / ``end_weight_update`` (0.5.23)."""

    async def prepare(self, engines: Sequence[WeightSyncClient], weights: Mapping[str, Tensor],
                      version: int) -> None:
        """Work done before the engines are paused, while they still generate (connect a group, write a
        checkpoint, encode a payload)."""

    async def transfer(self, engines: Sequence[WeightSyncClient], weights: Mapping[str, Tensor],
                       version: int) -> None:
        """Push ``weights`` into every engine; raises unless every engine confirmed."""

    async def close(self, engines: Sequence[WeightSyncClient]) -> None:
        """Release what the transport holds (groups, files)."""


class _Staging:
    """Keeps what :meth:`prepare` built for one version, so the transfer inside the pause only sends it."""

    _staged: tuple[int, Any] | None = None

    async def _build(self, weights: Mapping[str, Tensor], version: int) -> Any:
        raise NotImplementedError

    async def prepare(self, engines: Sequence[WeightSyncClient], weights: Mapping[str, Tensor],
                      version: int) -> None:
        self._staged = (version, await self._build(weights, version))

    async def _staged_for(self, weights: Mapping[str, Tensor], version: int) -> Any:
        if self._staged is None or self._staged[0] != version:
            self._staged = (version, await self._build(weights, version))
        return self._staged[1]


class DiskTransport(_Staging):
    """Checkpoints ``root / f"v{version}"``, written atomically before the pause; an older one is deleted
    only after every engine acknowledged a newer one (F3)."""

    needs_session = False

    def __init__(self, root: Path, writer: CheckpointWriter = write_checkpoint_atomic,
                 config: Mapping[str, Any] | None = None) -> None:
        self.root, self.writer, self.config = Path(root), writer, dict(config or {})

    async def _build(self, weights: Mapping[str, Tensor], version: int) -> Path:
        return await asyncio.to_thread(self.writer, self.root, f"v{version}", weights, self.config)

    async def transfer(self, engines: Sequence[WeightSyncClient], weights: Mapping[str, Tensor],
                       version: int) -> None:
        path = await self._staged_for(weights, version)
        await gather_all(*(engine.update_weights_from_disk(path) for engine in engines))
        self._staged = None
        await asyncio.to_thread(self._remove_older_than, version)

    def _remove_older_than(self, version: int) -> None:
        for path in self.root.glob("v*"):
            if path.name[1:].isdigit() and int(path.name[1:]) < version:
                shutil.rmtree(path, ignore_errors=True)

    async def close(self, engines: Sequence[WeightSyncClient]) -> None:
        self._staged = None
        for staging in self.root.glob(".*.tmp"):
            shutil.rmtree(staging, ignore_errors=True)


class TensorTransport(_Staging):
    """The tensors in the request body, encoded before the pause: one ``serialized_named_tensors`` entry per
    engine (TP size 1)."""

    needs_session = True

    def __init__(self, encoder: TensorEncoder = encode_pickle_b64) -> None:
        self.encoder = encoder

    async def _build(self, weights: Mapping[str, Tensor], version: int) -> list[str]:
        return [await asyncio.to_thread(self.encoder, list(weights.items()))]

    async def transfer(self, engines: Sequence[WeightSyncClient], weights: Mapping[str, Tensor],
                       version: int) -> None:
        payload = await self._staged_for(weights, version)
        await gather_all(*(engine.update_weights_from_tensor(payload) for engine in engines))
        self._staged = None

    async def close(self, engines: Sequence[WeightSyncClient]) -> None:
        self._staged = None


class DistributedTransport:
    """A ``torch.distributed`` broadcast from the trainer (rank 0) to engine ``i`` (rank ``1 + i``).

    The trainer hosts the rendezvous (a ``TCPStore`` server on a free port) and builds its rank of the group
    without touching torch's default process group, with the store prefixes SGLang's
    ``init_custom_process_group`` gives the engines' ranks (see :meth:`_new_group`). The group is created once
    per trainer cell, before the first pause, concurrently with every engine's ``/init_weights_update_group``
    (each side blocks until all ranks joined); the name is unique per cell. After a failed transfer the group
    is stale (ranks out of step) and is rebuilt on the next cycle. Needs torch (:data:`TORCH_EXTRA`).
    """

    needs_session = True

    def __init__(self, backend: str = "gloo", master_address: str = "127.0.0.1", timeout_s: float = 120.0,
                 group_prefix: str = "weight_update_group") -> None:
        if backend != "gloo":
            raise ValueError(f"DistributedTransport: backend {backend!r} is not implemented (gloo only on CPU)")
        self.backend, self.master_address, self.timeout = backend, master_address, timedelta(seconds=timeout_s)
        self.group_prefix = group_prefix
        self.group_name: str | None = None
        self._group: Any = None
        self._store: Any = None
        self._stale_name: str | None = None

    def _new_group(self, store: Any, name: str, world_size: int) -> Any:
        """Rank 0 of the gloo group, keyed like SGLang's ranks: ``PrefixStore(name)``, then the ``f"{name}/"``
        and ``"cpu/"`` prefixes torch's ``_new_process_group_helper`` adds, then the sequence-number handshake."""
        dist = import_torch_distributed()
        keyed = dist.PrefixStore("cpu/", dist.PrefixStore(f"{name}/", dist.PrefixStore(name, store)))
        options = dist.ProcessGroupGloo._Options()
        options._timeout = self.timeout
        options._devices = [dist.ProcessGroupGloo.create_device(hostname=self.master_address)]
        group = dist.ProcessGroupGloo(keyed, 0, world_size, options)
        group._set_sequence_number_for_group()
        return group

    async def prepare(self, engines: Sequence[WeightSyncClient],
                      weights: Mapping[str, Tensor] | None = None, version: int | None = None) -> None:
        """Connect the group (once per cell, and again after a failed transfer)."""
        if self._group is not None:
            return
        dist = import_torch_distributed()
        if self._stale_name is not None:  # best effort: the engines may have dropped it already
            await settle_all(e.destroy_weights_update_group(self._stale_name) for e in engines)
            self._stale_name = None
        name = f"{self.group_prefix}_{uuid.uuid4().hex[:8]}"
        store = dist.TCPStore(self.master_address, 0, None, True, self.timeout, wait_for_workers=False)
        world_size = 1 + len(engines)
        group, *_ = await gather_or_cancel(
            run_in_daemon_thread(self._new_group, store, name, world_size),
            *(engine.init_weights_update_group(self.master_address, store.port, 1 + i, world_size, name,
                                               self.backend) for i, engine in enumerate(engines)))
        self._store, self._group, self.group_name = store, group, name

    def _broadcast(self, group: Any, tensors: list[Tensor]) -> None:
        """One broadcast from rank 0 per tensor, in the order of the names sent to the engines."""
        dist = import_torch_distributed()
        import torch

        float8 = (torch.float8_e4m3fn, torch.float8_e5m2)
        for tensor in tensors:
            wire = tensor.view(torch.uint8) if tensor.dtype in float8 else tensor  # gloo has no float8
            group.broadcast([wire], dist.BroadcastOptions()).wait(self.timeout)

    async def transfer(self, engines: Sequence[WeightSyncClient], weights: Mapping[str, Tensor],
                       version: int) -> None:
        await self.prepare(engines)
        names = list(weights)
        tensors = [weights[n].detach().to("cpu").contiguous() for n in names]
        dtypes = [str(t.dtype).removeprefix("torch.") for t in tensors]
        shapes = [list(t.shape) for t in tensors]
        broadcast = run_in_daemon_thread(self._broadcast, self._group, tensors)
        broadcast.add_done_callback(lambda f: f.cancelled() or f.exception())  # retrieved even when abandoned
        try:  # each engine answers once it received every tensor, or once its collective timed out
            await gather_all(*(self._receive(engine, names, dtypes, shapes, version) for engine in engines))
            await broadcast
        except BaseException:  # the ranks are out of step: rebuild the group next cycle
            self._stale_name, self._group, self._store = self.group_name, None, None
            raise

    async def _receive(self, engine: WeightSyncClient, names: Sequence[str], dtypes: Sequence[str],
                       shapes: Sequence[Sequence[int]], version: int) -> None:
        """One engine's side of the broadcast: it answers once it received every named tensor."""
        await engine.update_weights_from_distributed(names, dtypes, shapes, self.group_name)

    async def close(self, engines: Sequence[WeightSyncClient]) -> None:
        name = self.group_name if self._group is not None else self._stale_name
        if name is not None:
            for error in await settle_all(e.destroy_weights_update_group(name) for e in engines):
                log.warning("destroying process group %s: %s", name, error)
        if self._group is not None:
            try:
                self._group.shutdown()
            except Exception as exc:  # a peer may be gone already
                log.warning("shutting down process group %s: %s", name, exc)
        self._group = self._store = self._stale_name = None


class LoraTransport:
    """``/load_lora_adapter_from_tensors`` under a versioned name ``f"{name}-v{version}"``: requests in flight
    keep the adapter they named, so nothing unloads an adapter a paused request still uses (P7). On a release
    without that route (≤0.5.4), or without torch (a payload is a torch pickle), the adapter is written,
    atomically, as a PEFT directory under ``root`` and loaded with ``/load_lora_adapter``."""

    def __init__(self, encoder: TensorEncoder = encode_pickle_b64, root: Path | None = None) -> None:
        self.encoder = encoder
        self.root = root

    @staticmethod
    def versioned_name(adapter: LoraAdapter, version: int) -> str:
        return f"{adapter.name}-v{version}"

    async def load(self, engines: Sequence[WeightSyncClient], adapter: LoraAdapter, version: int) -> str:
        """Load the adapter on every engine; its versioned name. On failure nothing stays loaded."""
        if not adapter.tensors:
            raise ValueError(f"LoRA adapter {adapter.name!r} has no tensors (P5)")
        name = self.versioned_name(adapter, version)
        tensors = torch_installed()  # SGLang reads adapter payloads as torch pickles, whatever the encoder
        from_disk = [not tensors or (await release_of(e)).lora_tensor_field is None for e in engines]
        payload = None if all(from_disk) else [LORA_FORMS.get(self.encoder, self.encoder)(list(adapter.tensors.items()))]
        path: Path | None = None
        if any(from_disk):
            if self.root is None:
                raise ValueError("LoraTransport needs a root directory for engines that load adapters from disk")
            path = await asyncio.to_thread(write_checkpoint_atomic, self.root, name, adapter.tensors, adapter.config,
                                           weights_file="adapter_model.safetensors", config_file="adapter_config.json")

        async def load_one(engine: WeightSyncClient, disk: bool) -> None:
            if disk:
                await engine.load_lora_adapter(name, path)
            else:
                await engine.load_lora_adapter_from_tensors(name, adapter.config, payload)

        try:
            await gather_all(*(load_one(engine, disk) for engine, disk in zip(engines, from_disk)))
        except BaseException:
            await settle_all(engine.unload_lora_adapter(name) for engine in engines)
            raise
        return name

    async def unload(self, engines: Sequence[WeightSyncClient], name: str) -> None:
        errors = await settle_all(engine.unload_lora_adapter(name) for engine in engines)
        if self.root is not None:
            shutil.rmtree(self.root / name, ignore_errors=True)
        if errors:
            raise errors[0]
