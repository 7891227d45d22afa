"""vLLM's native weight transfer (``--weight-transfer-config``) with a gloo engine, as vLLM 0.32.0 runs it.

The routes (``/init_weight_transfer_engine``, ``/start_weight_update``, ``/update_weights``, ``/finish_weight_update``,
``/shutdown_weight_transfer_engine``: ``vllm/entrypoints/rl/online/api_router.py``) call the worker through
``collective_rpc``; the worker (``v1/worker/gpu_worker.py``, which vLLM's ``CPUWorker`` inherits) keeps the session
rules, the engine (built by ``WeightTransferEngineFactory.create_engine`` from the config's ``backend``) moves the
tensors:

- every call raises ``Weight transfer not configured`` without a config (shutdown is then a no-op: 200);
- ``start`` while a session is active raises; ``update`` and ``finish`` without one raise; ``shutdown`` during one
  raises; an ``update`` that raises ends the session (``_weight_update_active = False``);
- ``finish`` runs the worker's finish, then, only when that succeeded, publishes ``weight_version``
  (``AsyncLLM.finish_weight_update``: ``update_weight_version`` after the ``collective_rpc``).

A worker error is the route's 500 ``Call to collective_rpc method failed: Worker failed with error '...'``.

vLLM 0.32.0 registers no CPU engine (nccl, ipc, sparse_nccl, sharded_rdt, nccl_m2n, modelexpress); the factory
takes engines registered at runtime, and ``gloo`` is the one this project registers on real vLLM
(``gpu/vllm_gloo.py``, installed as a vLLM general plugin) and serves here: the NCCL engine's protocol on a gloo
group. Its ``init_info`` is NCCL's TCP rendezvous (``master_address``, ``master_port``, ``rank_offset``,
``world_size``; and ``group_name``, default :data:`GROUP_NAME`) and its ``update_info`` NCCL's unpacked one
(``names``, ``dtype_names``, ``shapes``: one broadcast
per tensor from rank 0, in order). The group is :class:`fakes.distributed.DistributedGroup` (a real gloo group,
``torch.distributed``'s ``tcp://`` rendezvous on the trainer's store, under the group's name), so a trainer
joins it with :func:`fakes.distributed.trainer_group` and sends with ``.send``. Like NCCL's engine it loads through
vLLM's layerwise reload: ``start`` resets the layers (``initialize_layerwise_reload``), each received tensor is
loaded, ``finish`` finalizes. An update that fails therefore leaves the model without weights (as a failed reload
does, measured on 0.32.0) until a later session finishes.
"""

from __future__ import annotations

import asyncio
import json
import threading
from dataclasses import dataclass, field
from typing import Any, Callable

from ..asgi import Reply
from ..distributed import DistributedGroup
from .errors import answer, worker_failed

BACKEND = "gloo"
"""The backend name the gloo engine is registered under (``--weight-transfer-config '{"backend": "gloo"}'``)."""
GROUP_NAME = "vllm_weight_transfer"
"""The gloo group's name (the store prefix both sides use) when ``init_info`` names none."""
ENGINE_CLASS = "GlooWeightTransferEngine"
"""The engine's class name (in ``parse_init_info``'s and ``parse_update_info``'s errors)."""
BUILTIN_BACKENDS = ("nccl", "ipc", "sparse_nccl", "sharded_rdt", "nccl_m2n", "modelexpress")
"""The engines vLLM 0.32.0's factory registers itself (``distributed/weight_transfer/factory.py``)."""
JOIN_TIMEOUT_S = 60.0
"""How long ``init`` waits for the trainer's rendezvous (and each broadcast for its peer)."""


@dataclass
class GlooWeightTransferInitInfo:
    """The worker's ``init_info`` (NCCL's TCP rendezvous fields)."""

    master_address: str
    master_port: int
    rank_offset: int
    world_size: int
    group_name: str = GROUP_NAME


@dataclass
class GlooWeightTransferUpdateInfo:
    """One ``update_info`` (NCCL's ``NCCLWeightTransferUpdateInfo``, unpacked)."""

    names: list[str]
    dtype_names: list[str]
    shapes: list[list[int]]

    def __post_init__(self) -> None:
        num_params = len(self.names)
        if len(self.dtype_names) != num_params:
            raise ValueError(f"`dtype_names` should be of the same size as `names`: "
                             f"got {len(self.dtype_names)} and {len(self.names)}")
        if len(self.shapes) != num_params:
            raise ValueError(f"`shapes` should be of the same size as `names`: "
                             f"got {len(self.shapes)} and {len(self.names)}")


def _parsed(cls: type, what: str, raw: dict[str, Any]) -> Any:
    """``WeightTransferEngine.parse_init_info`` / ``parse_update_info``: a ``TypeError`` of the dataclass becomes
    ``ValueError("Invalid <what> for <engine>: ...")``; ``__post_init__``'s own errors pass through."""
    try:
        return cls(**raw)
    except TypeError as e:
        raise ValueError(f"Invalid {what} for {ENGINE_CLASS}: {e}") from e


def parse_config(raw: str | None) -> str | None:
    """The backend of ``--weight-transfer-config`` (JSON ``{"backend": ...}``; vLLM's default backend is ``nccl``),
    or None without one. The fake serves only :data:`BACKEND`: another registered backend is refused here (vLLM
    would build it and fail at its first CUDA call); an unknown one as vLLM's factory refuses it at start-up."""
    if raw is None:
        return None
    config = json.loads(raw) if isinstance(raw, str) else dict(raw)
    backend = config.get("backend", "nccl")
    if backend == BACKEND:
        return backend
    if backend in BUILTIN_BACKENDS:
        raise ValueError(f"weight transfer backend {backend!r} needs CUDA; the fake vLLM serves {BACKEND!r}")
    raise ValueError(f"Invalid weight transfer backend: {backend}. Available engines: "
                     f"{[*BUILTIN_BACKENDS, BACKEND]}")


@dataclass
class WeightTransfer:
    """The worker's weight-transfer state: the engine's group and whether a session is active.

    ``load`` merges received tensors into the engine's weights (raises on a name or shape the model refuses);
    ``lose_weights`` / ``restore_weights`` are the layerwise reload's effect on them; ``publish`` sets the version
    label."""

    backend: str | None
    load: Callable[[dict[str, Any]], None]
    lose_weights: Callable[[str], None]
    restore_weights: Callable[[], None]
    publish: Callable[[str], None]
    timeout_s: float = JOIN_TIMEOUT_S
    group: DistributedGroup | None = None
    active: bool = False
    failed: str | None = None
    """A failed update's error while no finish ran since: the layer it failed in keeps the tensors it buffered
    (``reload/layerwise.py``, 0.32.0: ``initialize_layerwise_reload`` skips a layer that can still load), so every
    later update fails with it again, once its tensors arrived, until a session is finished."""
    lock: threading.Lock = field(default_factory=threading.Lock)

    async def call(self, path: str, body: Any) -> Reply:
        """The route's answer (the body already validated as FastAPI does)."""
        if path == "/shutdown_weight_transfer_engine":
            return await self._rpc(self._shutdown, "Weight transfer shut down")
        if self.backend is None:
            return answer("weight_transfer_not_configured")
        if path == "/init_weight_transfer_engine":
            return await self._rpc(lambda: self._init(body["init_info"]), "Weight transfer initialized")
        if path == "/start_weight_update":
            return await self._rpc(self._start, "Weight update started")
        if path == "/start_draft_weight_update":
            return await self._rpc(self._start_draft, "Draft weight update started")
        if path == "/update_weights":
            return await self._rpc(lambda: self._update(body["update_info"]), "Weights updated")
        version = body.get("weight_version") if isinstance(body, dict) else None
        reply = await self._rpc(self._finish, "Weight update finished")
        if reply.status == 200 and version is not None:
            self.publish(version)
        return reply

    async def _rpc(self, step: Callable[[], None], message: str) -> Reply:
        """One ``collective_rpc``: serial in the engine core (a lock), run off the event loop (it may block in
        gloo); its exception is the 500."""
        def serial() -> None:
            with self.lock:
                step()
        try:
            await asyncio.to_thread(serial)
        except Exception as e:  # noqa: BLE001 - EngineCore answers any worker exception
            return worker_failed("collective_rpc", str(e))
        return Reply(200, {"message": message})

    def _check(self) -> None:
        if self.backend is None:
            raise RuntimeError("Weight transfer not configured. Please set weight_transfer_config to enable "
                               "weight transfer.")

    def _init(self, raw: dict[str, Any]) -> None:
        self._check()
        info = _parsed(GlooWeightTransferInitInfo, "init_info", raw)
        group = DistributedGroup.join(info.master_address, info.master_port, info.rank_offset, info.world_size,
                                      info.group_name, "gloo", self.timeout_s)
        old, self.group = self.group, group
        if old is not None:
            old.destroy()

    def _shutdown(self) -> None:
        if self.active:
            raise RuntimeError("Cannot release a trainer connection during a weight update")
        if self.group is not None:
            self.group.destroy()
            self.group = None

    def _start(self) -> None:
        self._check()
        if self.active:
            raise RuntimeError("start_weight_update called while a weight update is already active. Call "
                               "finish_weight_update first.")
        self.active = True

    def _start_draft(self) -> None:
        self._check()
        raise RuntimeError("Draft model weight update requested, but no draft model is configured.")

    def _update(self, raw: dict[str, Any] | list[dict[str, Any]]) -> None:
        self._check()
        if not self.active:
            raise RuntimeError("start_weight_update must be called before update_weights.")
        try:
            local = raw[0] if isinstance(raw, list) else raw  # update_info[dp_index * world_size + rank]
            info = _parsed(GlooWeightTransferUpdateInfo, "update_info", local)
            if self.group is None:
                raise RuntimeError("Gloo weight transfer not initialized. Call init_transfer_engine() first.")
            received = self.group.receive(info.names, info.dtype_names, info.shapes, self.timeout_s)
            if self.failed is not None:
                raise RuntimeError(self.failed)
            self.load(received)
        except BaseException as e:
            self.active = False  # the worker ends the session; the layers stay reset
            self.failed = self.failed or str(e)
            self.lose_weights(f"update_weights: {e}")
            raise

    def _finish(self) -> None:
        self._check()
        if not self.active:
            raise RuntimeError("finish_weight_update called without a matching start_weight_update.")
        self.active, self.failed = False, None
        self.restore_weights()

    def close(self) -> None:
        if self.group is not None:
            self.group.destroy()
            self.group = None
