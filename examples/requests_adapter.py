"""Adapter example: a synchronous ``requests`` engine wrapper mapped onto the suite's roles.

Most frameworks (miles, slime, minimind) drive SGLang through a small blocking wrapper like
:class:`SGLangEngine` below. To run the conformance suite against it, wrap each blocking method with
a thread (:class:`ThreadedEngineClient`), then build the roles. This example reuses the
reference updater (disk transport only) and the reference rollout manager; only the engine wrapper is "yours".

    pytest -m cpu --conformance-integration examples.requests_adapter:integration
"""

from __future__ import annotations

import asyncio
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping

import requests

from conformance.interface import BuildEnv, Capabilities, Roles
from conformance.reference import DiskTransport, ReferenceManager, ReferenceUpdater


class SGLangEngine:
    """A blocking SGLang wrapper in the style of the frameworks' own (one instance per engine URL)."""

    def __init__(self, base_url: str, timeout: float = 60.0, generate_timeout: float = 300.0) -> None:
        self.base_url = base_url.rstrip("/")
        self.timeout, self.generate_timeout = timeout, generate_timeout

    def _post(self, endpoint: str, payload: Any, timeout: float | None = None) -> Any:
        resp = requests.post(self.base_url + endpoint, json=payload, timeout=timeout or self.timeout)
        body = resp.json() if "json" in resp.headers.get("content-type", "") else resp.text
        if resp.status_code != 200 or (isinstance(body, dict) and body.get("success") is False):
            raise RuntimeError(f"engine {self.base_url} {endpoint}: {resp.status_code} {body}")
        return body

    def generate(self, payload: Mapping[str, Any]) -> dict:
        return self._post("/generate", dict(payload), timeout=self.generate_timeout)

    def pause_generation(self, mode: str = "retract") -> None:
        self._post("/pause_generation", {"mode": mode})

    def continue_generation(self) -> None:
        self._post("/continue_generation", {})

    def flush_cache(self, deadline_s: float = 30.0) -> None:
        """Retries while the engine answers 400 (requests still queued), with a sleep between tries."""
        end = time.monotonic() + deadline_s
        while True:
            resp = requests.post(self.base_url + "/flush_cache", timeout=self.timeout)
            if resp.status_code == 200:
                return
            if resp.status_code != 400 or time.monotonic() > end:
                raise RuntimeError(f"engine {self.base_url} /flush_cache: {resp.status_code} {resp.text}")
            time.sleep(0.2)

    def update_weights_from_disk(self, model_path: str) -> None:
        self._post("/update_weights_from_disk", {"model_path": model_path, "flush_cache": False})

    def update_weight_version(self, version: str) -> None:
        # SGLang defaults abort_all_requests to True: never leave it out.
        self._post("/update_weight_version", {"new_version": version, "abort_all_requests": False})

    def get_weight_version(self) -> str:
        resp = requests.get(self.base_url + "/model_info", timeout=self.timeout)
        resp.raise_for_status()
        return resp.json()["weight_version"]


class ThreadedEngineClient:
    """The reference client protocols (:mod:`conformance.reference.protocols`) over a blocking wrapper: each call in a thread.

    Two pools, not ``asyncio.to_thread``'s shared default one: a ``/generate`` call blocks for as long as the
    engine is paused, so parked generations could take every default thread and ``continue_generation``
    would never run (a deadlock). Control calls get threads of their own.
    """

    def __init__(self, engine: SGLangEngine, max_generations: int = 64) -> None:
        self.engine = engine
        self.url = engine.base_url
        self._generations = ThreadPoolExecutor(max_generations, thread_name_prefix="generate")
        self._control = ThreadPoolExecutor(4, thread_name_prefix="control")

    async def _run(self, fn: Callable[..., Any], *args: Any, pool: ThreadPoolExecutor | None = None) -> Any:
        return await asyncio.get_running_loop().run_in_executor(pool or self._control, fn, *args)

    async def generate(self, payload: Mapping[str, Any]) -> Any:
        return await self._run(self.engine.generate, payload, pool=self._generations)

    async def pause(self, mode: str) -> None:
        await self._run(self.engine.pause_generation, mode)

    async def resume(self) -> None:
        await self._run(self.engine.continue_generation)

    async def flush_cache(self) -> None:
        await self._run(self.engine.flush_cache)

    async def update_weight_version(self, version: str) -> None:
        await self._run(self.engine.update_weight_version, version)

    async def get_weight_version(self) -> str:
        return await self._run(self.engine.get_weight_version)

    async def update_weights_from_disk(self, path: str | Path) -> None:  # what DiskTransport calls
        await self._run(self.engine.update_weights_from_disk, str(path))

    def close(self) -> None:
        for pool in (self._generations, self._control):
            pool.shutdown(wait=False, cancel_futures=True)


@dataclass(frozen=True)
class RequestsIntegration:
    """Disk updates only: the wrapper has no tensor, distributed or LoRA methods."""

    name: str = "requests-example"
    capabilities: Capabilities = field(default_factory=lambda: Capabilities(transports=frozenset({"disk"}),
                                                                            lora=False))

    async def build(self, env: BuildEnv) -> Roles:
        engines = [ThreadedEngineClient(SGLangEngine(url)) for url in env.engine_urls]
        manager = ReferenceManager(engines, env)

        def new_updater() -> ReferenceUpdater:
            disk = DiskTransport(env.workdir / "checkpoints")
            return ReferenceUpdater(engines, manager, transports={"disk": disk},  # type: ignore[arg-type]
                                    pause_mode=env.pause_mode, start_version=manager.weight_version or 0)

        async def close() -> None:
            await manager.stop()
            for engine in engines:
                engine.close()

        return Roles(engines=list(engines), manager=manager, new_updater=new_updater, close=close)


integration = RequestsIntegration()
