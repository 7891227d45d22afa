"""The reference integration: builds the roles over a set of engine URLs (``conformance.reference:integration``).

Every piece is a class attribute or a small method, so a variant (a mutant, an adopter's experiment) is a
subclass that overrides one of them.
"""

from __future__ import annotations

import functools
import ssl

from dataclasses import dataclass, field
from typing import Any, Mapping

import httpx

from ..interface import ALL_TRANSPORTS, KEEPALIVE_EXPIRY_S, BuildEnv, Capabilities, Roles
from .client import HttpEngineClient
from .manager import ReferenceManager
from .transports import (CheckpointWriter, DiskTransport, DistributedTransport, LoraTransport, TensorEncoder,
                         TORCH_EXTRA, TensorTransport, WeightTransport, encode_pickle_b64, torch_installed,
                         write_checkpoint_atomic)
from .updater import ReferenceUpdater


@functools.cache
def _ssl_context() -> ssl.SSLContext:
    """One default SSL context per process: building one per client costs more than many requests."""
    return ssl.create_default_context()


def default_capabilities(**overrides: object) -> Capabilities:
    """What the reference supports here (with ``overrides``): every transport, less ``distributed`` and ``tensor``
    where torch is not installed (SGLang reads tensor payloads as torch pickles; their scenarios are then skipped,
    the transports undeclared; :data:`.transports.TORCH_EXTRA`). LoRA adapters then load from disk."""
    overrides = {"engine_recovery": True, **overrides}
    if torch_installed():
        return Capabilities(**overrides)  # type: ignore[arg-type]
    absent = {"distributed": f"it needs torch, which is not installed ({TORCH_EXTRA})",
              "tensor": f"SGLang reads tensor payloads as torch pickles: it needs torch, which is not installed "
                        f"({TORCH_EXTRA})"}
    return Capabilities(**{"transports": ALL_TRANSPORTS - set(absent), "absent_because": absent,
                           **overrides})  # type: ignore[arg-type]


@dataclass(frozen=True, eq=False)
class ReferenceIntegration:
    """The reference :class:`~conformance.interface.Integration`.

    ``disk_writer`` writes checkpoints for the disk transport; ``tensor_encoder`` serializes tensors for the
    tensor and LoRA transports (tensors pickled inline by default, what SGLang's ``MultiprocessingSerializer``
    reads on CPU and GPU); ``backend`` is the distributed transport's ``torch.distributed``
    backend.
    """

    name: str = "reference"
    capabilities: Capabilities = field(default_factory=default_capabilities)
    client_cls: type[HttpEngineClient] = HttpEngineClient
    updater_cls: type[ReferenceUpdater] = ReferenceUpdater
    manager_cls: type[ReferenceManager] = ReferenceManager
    lora_cls: type[LoraTransport] = LoraTransport
    disk_cls: type[DiskTransport] = DiskTransport
    disk_writer: CheckpointWriter = write_checkpoint_atomic
    tensor_encoder: TensorEncoder = encode_pickle_b64
    backend: str = "gloo"
    timeout_s: float = 60.0
    """Bound on every control call and on every collective."""
    generate_timeout_s: float = 300.0
    flush_deadline_s: float = 3.0
    """Budget for ``/flush_cache`` back-off while the engine answers 400. SGLang 0.5.23 flushes at once after a
    retract pause; a refusal that outlasts a few seconds is a real failure (raise it for slow engines)."""
    checkpoint_config: dict[str, Any] = field(default_factory=dict)
    """Written as ``config.json`` beside each disk checkpoint (a real run writes the model's HF config)."""
    http_mounts: Mapping[str, httpx.AsyncBaseTransport] | None = None
    """Custom httpx transports by URL prefix (e.g. ``httpx.ASGITransport`` to reach engines in process)."""

    async def build(self, env: BuildEnv) -> Roles:
        http = self.make_http_client(env)
        engines = [self.client_cls(url, http, self.timeout_s, generate_timeout_s=self.generate_timeout_s,
                                   flush_deadline_s=self.flush_deadline_s) for url in env.engine_urls]
        manager = self.manager_cls(engines, env, stamps_engines=self.capabilities.stamps_engines)
        cells: list[ReferenceUpdater] = []

        def new_updater() -> ReferenceUpdater:
            cell = self.updater_cls(engines, manager, transports=self.make_transports(env),
                                    lora=self.lora_cls(self.tensor_encoder, env.workdir / "adapters"),
                                    pause_mode=env.pause_mode,
                                    start_version=self.start_version(manager))
            cells.append(cell)
            return cell

        async def close() -> None:
            try:
                await manager.stop()
                for cell in cells:
                    await cell.close()
            finally:
                await http.aclose()

        return Roles(engines=list(engines), manager=manager, new_updater=new_updater, close=close)

    # -- override points ---------------------------------------------------------------------------------

    def make_http_client(self, env: BuildEnv) -> httpx.AsyncClient:
        """One pooled client for every engine (no pool limit: in-flight generations must never queue here; idle
        connections dropped before the engine closes them, :data:`~conformance.interface.KEEPALIVE_EXPIRY_S`)."""
        return httpx.AsyncClient(timeout=self.timeout_s, mounts=self.http_mounts, verify=_ssl_context(),
                                 limits=httpx.Limits(max_connections=None, max_keepalive_connections=64,
                                                     keepalive_expiry=KEEPALIVE_EXPIRY_S))

    def make_transports(self, env: BuildEnv) -> dict[str, WeightTransport]:
        """A fresh set per trainer cell (a failover cell builds its own process group)."""
        return {"disk": self.disk_cls(env.workdir / "checkpoints", self.disk_writer, self.checkpoint_config),
                "tensor": TensorTransport(self.tensor_encoder),
                "distributed": DistributedTransport(self.backend, timeout_s=self.timeout_s)}

    def start_version(self, manager: ReferenceManager) -> int:
        """A new cell continues the published version (F1/V4), never restarts at 0."""
        return manager.weight_version or 0
