"""Adapter example: an async ``httpx`` engine wrapper and a hand-written updater mapped onto the roles.

An async client (AReaL, SkyRL, prime-rl style) maps directly, no threads needed. The updater is written out
(disk and tensor transports) to show the cycle an updater must get right; the manager is the reference one.

    pytest -m cpu --conformance-integration examples.httpx_adapter:integration
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

import httpx

from conformance.interface import KEEPALIVE_EXPIRY_S, BuildEnv, Capabilities, LoraAdapter, Roles
from conformance.reference import ReferenceManager, encode_pickle_b64, write_checkpoint_atomic


class AsyncSGLangClient:
    """An async SGLang wrapper (one per engine URL) sharing one ``httpx.AsyncClient``."""

    def __init__(self, url: str, http: httpx.AsyncClient) -> None:
        self.url, self.http = url.rstrip("/"), http

    async def _post(self, endpoint: str, payload: Any = None, *, timeout: float = 60.0) -> httpx.Response:
        resp = await self.http.post(self.url + endpoint, json=payload, timeout=timeout)
        body = resp.json() if "json" in resp.headers.get("content-type", "") else None
        if resp.status_code != 200 or (isinstance(body, dict) and body.get("success") is False):
            raise RuntimeError(f"engine {self.url} {endpoint}: {resp.status_code} {resp.text[:300]}")
        return resp

    async def generate(self, payload: Mapping[str, Any]) -> Any:
        return (await self._post("/generate", dict(payload), timeout=300.0)).json()

    async def pause(self, mode: str) -> None:
        await self._post("/pause_generation", {"mode": mode})

    async def resume(self) -> None:
        await self._post("/continue_generation", {})

    async def flush_cache(self, deadline_s: float = 30.0) -> None:
        end = time.monotonic() + deadline_s
        while (resp := await self.http.post(self.url + "/flush_cache", timeout=60.0)).status_code == 400:
            if time.monotonic() > end:
                break
            await asyncio.sleep(0.2)  # requests still queued: back off, then retry
        if resp.status_code != 200:
            raise RuntimeError(f"engine {self.url} /flush_cache: {resp.status_code} {resp.text[:300]}")

    async def update_weight_version(self, version: str) -> None:
        await self._post("/update_weight_version", {"new_version": version, "abort_all_requests": False})

    async def get_weight_version(self) -> str:
        resp = await self.http.get(self.url + "/model_info", timeout=60.0)
        resp.raise_for_status()
        return resp.json()["weight_version"]

    async def session(self, endpoint: str) -> bool:
        """``/begin_weight_update`` or ``/end_weight_update``; False on engines without sessions (< 0.5.23)."""
        resp = await self.http.post(self.url + endpoint, json={}, timeout=60.0)
        if resp.status_code == 404:
            return False
        if resp.status_code != 200 or resp.json().get("success") is False:
            raise RuntimeError(f"engine {self.url} {endpoint}: {resp.status_code} {resp.text[:300]}")
        return True

    async def load_weights(self, transport: str, payload: Any) -> None:
        endpoint = {"disk": "/update_weights_from_disk", "tensor": "/update_weights_from_tensor"}[transport]
        await self._post(endpoint, {**payload, "flush_cache": False})


class HttpxUpdater:
    """One trainer cell: pause → flush (retract only) → [session] → load → version → [end] → continue."""

    def __init__(self, engines: list[AsyncSGLangClient], manager: ReferenceManager, env: BuildEnv) -> None:
        self.engines, self.manager, self.env = engines, manager, env
        self._version = manager.weight_version or 0  # a failover cell continues the published version

    @property
    def version(self) -> int:
        return self._version

    async def _all(self, method: str, *args: Any, engines: list[AsyncSGLangClient] | None = None,
                   strict: bool = True) -> list[Any]:
        """Call ``method`` on every engine and wait for all; raise the first error unless ``strict=False``."""
        targets = self.engines if engines is None else engines
        results = await asyncio.gather(*(getattr(e, method)(*args) for e in targets), return_exceptions=True)
        errors = [r for r in results if isinstance(r, BaseException)]
        if errors and strict:
            raise errors[0]
        return results

    def _payload(self, transport: str, weights: Mapping[str, Any], new: int) -> dict[str, Any]:
        if transport == "disk":
            root = Path(self.env.workdir) / "checkpoints"  # old checkpoints are kept: never deleted under a reader
            return {"model_path": str(write_checkpoint_atomic(root, f"v{new}", weights, {}))}
        return {"serialized_named_tensors": [encode_pickle_b64(list(weights.items()))]}

    async def update(self, weights: Mapping[str, Any] | None = None, *, transport: str = "disk",
                     lora: LoraAdapter | None = None) -> int:
        if lora is not None or weights is None or transport not in ("disk", "tensor"):
            raise ValueError(f"this updater pushes full weights over disk or tensor, not {transport!r}/LoRA")
        new = self._version + 1
        payload = await asyncio.to_thread(self._payload, transport, weights, new)
        sessions: list[AsyncSGLangClient] = []
        loading = False
        try:
            await self._all("pause", self.env.pause_mode)
            if self.env.pause_mode != "in_place":  # in_place keeps its KV: never flush it
                await self._all("flush_cache")
            if transport == "tensor":
                opened = await self._all("session", "/begin_weight_update")
                sessions = [e for e, ok in zip(self.engines, opened) if ok]
            loading = True
            await self._all("load_weights", transport, payload)
            await self._all("update_weight_version", str(new))  # only after every engine loaded
        except BaseException:  # close sessions, resume unless weights were sent, then re-raise the original error
            await self._all("session", "/end_weight_update", engines=sessions, strict=False)
            if not loading:  # an engine sent weights may hold part of them: paused until a load succeeds (P8)
                await self._all("resume", strict=False)
            raise
        await self._all("session", "/end_weight_update", engines=sessions)
        await self._all("resume")
        self._version = new
        self.manager.set_weight_version(new)
        return new


@dataclass(frozen=True)
class HttpxIntegration:
    name: str = "httpx-example"
    capabilities: Capabilities = field(default_factory=lambda: Capabilities(
        transports=frozenset({"disk", "tensor"}), lora=False))

    async def build(self, env: BuildEnv) -> Roles:
        # idle connections dropped before SGLang's uvicorn closes them (5 s): KEEPALIVE_EXPIRY_S
        http = httpx.AsyncClient(limits=httpx.Limits(max_connections=None, keepalive_expiry=KEEPALIVE_EXPIRY_S))
        engines = [AsyncSGLangClient(url, http) for url in env.engine_urls]
        manager = ReferenceManager(engines, env)

        async def close() -> None:
            await manager.stop()
            await http.aclose()

        return Roles(engines=list(engines), manager=manager,
                     new_updater=lambda: HttpxUpdater(engines, manager, env), close=close)


integration = HttpxIntegration()
