"""Adapter example (vLLM): a framework that holds an ``AsyncLLM`` in process, mapped onto the suite's roles.

SkyRL, NeMo-RL and verl's async paths keep vLLM's ``AsyncLLM`` (``vllm/v1/engine/async_llm.py``, 0.32.0) in their
own process and call its methods: ``pause_generation(mode=...)``, ``collective_rpc("reload_weights", kwargs=...)``,
``update_weight_version``, ``resume_generation``, ``generate`` (an async generator). The suite's engines are servers,
so :class:`AsyncLLMShim` gives those same methods over the server's routes: code written against ``AsyncLLM`` runs
unchanged against it. :class:`AsyncLLMClient` is the glue a framework writes once, here mapped onto the reference
client protocols, so the reference updater and manager drive it (disk updates).

    pytest -m cpu --conformance-engine vllm --conformance-integration examples.vllm_async_engine:integration
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, AsyncIterator, Mapping

import httpx

from conformance.dialect import VllmDialect
from conformance.interface import KEEPALIVE_EXPIRY_S, BuildEnv, Capabilities, Roles
from conformance.reference import DiskTransport, ReferenceManager, ReferenceUpdater


class AsyncLLMShim:
    """``AsyncLLM``'s weight-sync methods, with its names and defaults, over one vLLM server's HTTP routes."""

    def __init__(self, url: str, http: httpx.AsyncClient) -> None:
        self.url, self.http = url.rstrip("/"), http

    async def _post(self, path: str, body: Any = None, timeout: float = 60.0, **params: str) -> Any:
        resp = await self.http.post(self.url + path, json=body, params=params or None, timeout=timeout)
        if resp.status_code != 200:
            raise RuntimeError(f"vLLM {self.url} {path}: {resp.status_code} {resp.text[:300]}")
        return resp.json() if resp.content else None

    async def generate(self, prompt: Mapping[str, Any], sampling_params: Mapping[str, Any],
                       request_id: str) -> AsyncIterator[dict]:
        """One final output (not streamed): ``prompt`` is ``{"prompt_token_ids": [...]}``."""
        body = {"token_ids": list(prompt["prompt_token_ids"]), "sampling_params": dict(sampling_params),
                "request_id": request_id}
        yield await self._post("/inference/v1/generate", body, timeout=300.0)

    async def pause_generation(self, *, mode: str = "abort", clear_cache: bool = True) -> None:
        """``AsyncLLM``'s default mode, ``abort``, ends every request in flight: pass one. ``clear_cache`` (true by
        default) preempts what runs and resets the prefix cache, in every mode."""
        await self._post("/pause", mode=mode, clear_cache=str(clear_cache).lower())

    async def resume_generation(self) -> None:
        await self._post("/resume")

    async def reset_prefix_cache(self) -> bool:
        return bool((await self._post("/reset_prefix_cache")).get("success"))

    async def collective_rpc(self, method: str, kwargs: dict | None = None) -> Any:
        return await self._post("/collective_rpc", {"method": method, "kwargs": kwargs or {}})

    async def update_weight_version(self, new_version: str) -> None:
        await self._post("/update_weight_version", {"new_version": new_version})

    async def get_weight_version(self) -> str:
        return (await self._get("/weight_info"))["weight_version"]

    async def model_path(self) -> str:
        """The checkpoint the engine was started on (in process: the model path the framework launched it with)."""
        return (await self._get("/v1/models"))["data"][0]["root"]

    async def _get(self, path: str) -> Any:
        resp = await self.http.get(self.url + path, timeout=60.0)
        resp.raise_for_status()
        return resp.json()


class AsyncLLMClient:
    """The reference client protocols over an ``AsyncLLM``-style engine: the framework's own glue."""

    PAUSE_MODES = {"retract": "wait", "in_place": "keep"}
    """The cycle's pause → vLLM's mode; ``in_place`` keeps the caches (``clear_cache=False``), or ``keep`` preempts."""

    def __init__(self, engine: AsyncLLMShim) -> None:
        self.engine, self.url = engine, engine.url
        self.dialect = VllmDialect()
        self.loaded: str | None = None

    async def generate(self, payload: Mapping[str, Any]) -> Any:
        body = self.dialect.outgoing("/generate", dict(payload))[1]
        final = None
        async for final in self.engine.generate({"prompt_token_ids": body["token_ids"]}, body["sampling_params"],
                                                body.get("request_id", "")):
            pass
        return self.dialect.answered("/generate", dict(payload), final)

    async def pause(self, mode: str) -> None:
        await self.engine.pause_generation(mode=self.PAUSE_MODES[mode], clear_cache=mode != "in_place")

    async def resume(self) -> None:
        await self.engine.resume_generation()

    async def flush_cache(self) -> None:
        if not await self.engine.reset_prefix_cache():
            raise RuntimeError(f"vLLM {self.url}: the prefix cache could not be reset (requests still hold blocks)")

    async def update_weight_version(self, version: str) -> None:
        await self.engine.update_weight_version(version)

    async def get_weight_version(self) -> str:
        return await self.engine.get_weight_version()

    async def update_weights_from_disk(self, path: str | Path) -> None:
        """A failed reload leaves vLLM without weights: the last checkpoint that loaded goes back in first."""
        try:
            await self.engine.collective_rpc("reload_weights", {"weights_path": str(path)})
        except RuntimeError:
            served = self.loaded or await self.engine.model_path()
            await self.engine.collective_rpc("reload_weights", {"weights_path": served})
            raise
        self.loaded = str(path)


@dataclass(frozen=True)
class AsyncLLMIntegration:
    """Disk updates only; no LoRA."""

    name: str = "vllm-async-engine-example"
    capabilities: Capabilities = field(default_factory=lambda: Capabilities(transports=frozenset({"disk"}),
                                                                            lora=False))
    client_cls: type[AsyncLLMClient] = AsyncLLMClient
    """The glue (a test swaps in a variant)."""

    async def build(self, env: BuildEnv) -> Roles:
        http = httpx.AsyncClient(limits=httpx.Limits(max_connections=None, keepalive_expiry=KEEPALIVE_EXPIRY_S))
        engines = [self.client_cls(AsyncLLMShim(url, http)) for url in env.engine_urls]
        manager = ReferenceManager(engines, env)

        def new_updater() -> ReferenceUpdater:
            disk = DiskTransport(env.workdir / "checkpoints")
            return ReferenceUpdater(engines, manager, transports={"disk": disk},  # type: ignore[arg-type]
                                    pause_mode=env.pause_mode, start_version=manager.weight_version or 0)

        async def close() -> None:
            await manager.stop()
            await http.aclose()

        return Roles(engines=list(engines), manager=manager, new_updater=new_updater, close=close)


integration = AsyncLLMIntegration()
