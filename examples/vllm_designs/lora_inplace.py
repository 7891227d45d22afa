"""One LoRA adapter name refreshed in place on vLLM (``/v1/load_lora_adapter`` with ``load_inplace=True``).

Per update: write the PEFT directory (tmp dir + rename, a new directory per attempt) → ``/pause?mode=wait`` (the
requests in flight finish under the adapter they started with: an in-place load must not change an adapter under a
running request) → load in place on every engine → ``/reset_prefix_cache`` (vLLM would reuse KV computed with the old
adapter under the same name, #42125) → ``/update_weight_version`` → ``/resume`` → publish (requests name the adapter
from then on). When any engine fails to load, every engine goes back to the adapter it served (the previous
directory, loaded in place again; before the first update, the name is unloaded where it was loaded), then resumes.

    python -m conformance --engine vllm --integration examples.vllm_designs.lora_inplace:integration
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

import httpx

from conformance.interface import KEEPALIVE_EXPIRY_S, BuildEnv, Capabilities, LoraAdapter, Roles

from .async_httpx import AsyncVllm, RolloutManager, VllmError, on_all, write_adapter


class LoraVllm(AsyncVllm):
    async def load_adapter(self, name: str, path: str) -> None:
        await self.call("/v1/load_lora_adapter", {"lora_name": name, "lora_path": path, "load_inplace": True})

    async def unload_adapter(self, name: str) -> None:
        try:
            await self.call("/v1/unload_lora_adapter", {"lora_name": name})
        except VllmError as exc:
            if " 404 " not in str(exc):  # never loaded here: nothing to undo
                raise


class LoraInPlaceUpdater:
    def __init__(self, engines: Sequence[LoraVllm], manager: RolloutManager, env: BuildEnv,
                 shared: dict[str, Any]) -> None:
        self.engines, self.manager, self.env, self.shared = list(engines), manager, env, shared
        self._version = manager.weight_version or 0

    @property
    def version(self) -> int:
        return self._version

    async def update(self, weights: Mapping[str, Any] | None = None, *, transport: str = "disk",
                     lora: LoraAdapter | None = None) -> int:
        if lora is None:
            raise ValueError("this updater refreshes a LoRA adapter only")
        new = self._version + 1
        path = str(await asyncio.to_thread(write_adapter, self.env.workdir / "adapters", new, lora))
        previous = self.shared.get(lora.name)  # the directory every engine serves under this name
        await on_all(self.engines, lambda e: e.pause("retract"))  # vLLM's wait: the running requests finish first
        try:
            try:
                await on_all(self.engines, lambda e: e.load_adapter(lora.name, path))
            except BaseException:
                await asyncio.gather(*(e.load_adapter(lora.name, previous) if previous else
                                       e.unload_adapter(lora.name) for e in self.engines), return_exceptions=True)
                raise
            await on_all(self.engines, lambda e: e.reset_prefix_cache())
            await on_all(self.engines, lambda e: e.stamp(new))
        finally:
            await on_all(self.engines, lambda e: e.resume())
        self.shared[lora.name] = path
        self._version = new
        self.manager.set_weight_version(new)
        self.manager.adapter = lora.name
        return new


@dataclass(frozen=True)
class LoraInPlaceIntegration:
    name: str = "vllm-design-lora-inplace"
    capabilities: Capabilities = field(default_factory=lambda: Capabilities(
        transports=frozenset(), lora=True, pause_modes=frozenset({"retract"}),
        absent_because={t: "this design refreshes a LoRA adapter only" for t in ("disk", "tensor", "distributed")}))

    async def build(self, env: BuildEnv) -> Roles:
        http = httpx.AsyncClient(limits=httpx.Limits(max_connections=None, keepalive_expiry=KEEPALIVE_EXPIRY_S))
        engines = [LoraVllm(url, http) for url in env.engine_urls]
        manager = RolloutManager(engines, env)
        shared: dict[str, Any] = {}

        async def close() -> None:
            await manager.stop()
            await http.aclose()

        return Roles(manager=manager, new_updater=lambda: LoraInPlaceUpdater(engines, manager, env, shared),
                     close=close, engines=list(engines))


integration = LoraInPlaceIntegration()
