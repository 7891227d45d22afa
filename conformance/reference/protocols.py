"""What the reference integration calls on one engine, split by the step that calls it, so a framework that runs
the reference cycle over its own client implements only what its cycle calls. ``HttpEngineClient``
(``conformance.reference.client``) is every one of them (:class:`WeightSyncClient`).

* the manager: :class:`GenerateClient` (``url``, ``generate``);
* the updater: :class:`PauseClient` only where it pauses (a release whose pause takes a mode),
  :class:`VersionClient` only where it stamps with a version bump, :class:`FlushClient` only where it flushes,
  :class:`SessionClient` on releases with weight-update sessions (0.5.23);
* one transport each: :class:`DiskClient`, :class:`TensorClient`, :class:`DistributedClient`, :class:`LoraClient`.

Each method raises on an engine-reported failure (non-200 or ``success: false``: P5). Field names and defaults are
SGLang's (``python/sglang/srt/managers/io_struct.py``, 0.5.23). A client may also offer ``server_info()``
(``/get_server_info``) or ``release()``: the reference adapts to the engine's release (``releases.release_of``);
without either it takes the newest behaviour. A client may count the full-weight loads it sent
(``weight_loads_sent``): after a failed load the reference keeps out of service only the engines sent one (without
it, every engine of the cycle).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping, Protocol, Sequence, runtime_checkable


@runtime_checkable
class GenerateClient(Protocol):
    """What the reference manager calls: the engine's URL and ``/generate``."""

    url: str

    async def generate(self, payload: Mapping[str, Any]) -> Any:
        """POST ``/generate`` with a native SGLang payload; returns the decoded JSON response."""


@runtime_checkable
class PauseClient(Protocol):
    """Called by a cycle that pauses."""

    async def pause(self, mode: str) -> None:
        """Pause generation in ``mode`` (``abort`` / ``retract`` / ``in_place``)."""

    async def resume(self) -> None:
        """Continue generation."""


@runtime_checkable
class VersionClient(Protocol):
    """Called by a cycle that stamps its version with a bump (``/update_weight_version``)."""

    async def update_weight_version(self, version: str) -> None:
        """Relabel the engine's weights. Must never abort in-flight requests (I1)."""


@runtime_checkable
class FlushClient(Protocol):
    """Called by a cycle that flushes the prefix cache (retract pauses)."""

    async def flush_cache(self) -> None:
        """Flush the prefix cache; raises when the engine refuses."""


@runtime_checkable
class SessionClient(Protocol):
    """Weight-update sessions around distributed and tensor updates (0.5.23)."""

    async def begin_weight_update(self) -> bool:
        """``/begin_weight_update``; False when the engine has no sessions."""

    async def end_weight_update(self) -> bool:
        """``/end_weight_update``; False when the engine has no sessions."""


@runtime_checkable
class DiskClient(Protocol):
    async def update_weights_from_disk(self, path: str | Path, weight_version: str | None = None,
                                       flush_cache: bool = False) -> None:
        """``/update_weights_from_disk``: load a checkpoint directory the engine can read."""


@runtime_checkable
class TensorClient(Protocol):
    async def update_weights_from_tensor(self, serialized_named_tensors: Sequence[str],
                                         weight_version: str | None = None, flush_cache: bool = False) -> None:
        """``/update_weights_from_tensor``: tensors in the body, one serialized payload per TP rank."""


@runtime_checkable
class DistributedClient(Protocol):
    async def init_weights_update_group(self, master_address: str, master_port: int, rank_offset: int,
                                        world_size: int, group_name: str, backend: str) -> None:
        """``/init_weights_update_group``: join the trainer's process group (returns once every rank joined)."""

    async def update_weights_from_distributed(self, names: Sequence[str], dtypes: Sequence[str],
                                              shapes: Sequence[Sequence[int]], group_name: str,
                                              weight_version: str | None = None, flush_cache: bool = False) -> None:
        """``/update_weights_from_distributed``: receive the named tensors by broadcast from rank 0."""

    async def destroy_weights_update_group(self, group_name: str) -> None:
        """``/destroy_weights_update_group``."""


@runtime_checkable
class LoraClient(Protocol):
    async def load_lora_adapter_from_tensors(self, lora_name: str, config_dict: Mapping[str, Any],
                                             serialized_named_tensors: Sequence[str]) -> None:
        """``/load_lora_adapter_from_tensors``: an adapter sent in the body."""

    async def load_lora_adapter(self, lora_name: str, lora_path: str | Path) -> None:
        """``/load_lora_adapter``: an adapter the engine reads from disk."""

    async def unload_lora_adapter(self, lora_name: str) -> None:
        """``/unload_lora_adapter`` (SGLang waits for the requests that use it)."""


@runtime_checkable
class WeightSyncClient(GenerateClient, PauseClient, VersionClient, FlushClient, SessionClient, DiskClient,
                       TensorClient, DistributedClient, LoraClient, Protocol):
    """Everything the reference integration may call on one engine (what ``HttpEngineClient`` is)."""
