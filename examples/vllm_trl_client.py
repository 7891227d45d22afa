"""Adapter example (vLLM): a blocking client in the style of TRL's ``VLLMClient`` mapped onto the suite's roles.

TRL's async GRPO and OpenRLHF drive a vLLM server through a small blocking HTTP client: pause with a mode, reload
the weights from the checkpoint the trainer wrote, relabel, resume. :class:`VLLMClient` below is such a client, on
vLLM 0.32's RL routes (``VLLM_SERVER_DEV_MODE=1``, ``--enable-scale-out``); :class:`ThreadedVllmClient` runs it in
threads behind the reference client protocols, so the reference updater and manager run over it (disk updates). The
manager speaks the suite's vocabulary: vLLM's dialect (``conformance.dialect.VllmDialect``) translates ``/generate``.

    pytest -m cpu --conformance-engine vllm --conformance-integration examples.vllm_trl_client:integration
"""

from __future__ import annotations

import asyncio
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping

import requests

from conformance.dialect import VllmDialect
from conformance.interface import BuildEnv, Capabilities, Roles
from conformance.reference import DiskTransport, ReferenceManager, ReferenceUpdater

PAUSE_MODES = {"retract": {"mode": "wait"}, "in_place": {"mode": "keep", "clear_cache": "false"}}
"""The cycle's pause → vLLM's. Never ``/pause`` without a mode: its default, ``abort``, ends every request. ``keep``
freezes the requests on their KV only with ``clear_cache=false``: by default vLLM clears its caches at the pause,
which preempts them (recomputed on resume: the suite's ``retract``)."""


class VLLMClient:
    """A blocking vLLM client in TRL's style (one per server URL)."""

    def __init__(self, base_url: str, timeout: float = 60.0, generate_timeout: float = 300.0) -> None:
        self.base_url = base_url.rstrip("/")
        self.timeout, self.generate_timeout = timeout, generate_timeout
        self.loaded: str | None = None
        """The checkpoint the server serves, once a reload succeeded (restored when a later one fails)."""

    def _post(self, endpoint: str, payload: Any = None, timeout: float | None = None, **params: str) -> Any:
        resp = requests.post(self.base_url + endpoint, json=payload, params=params or None,
                             timeout=timeout or self.timeout)
        body = resp.json() if "json" in resp.headers.get("content-type", "") else resp.text
        if resp.status_code != 200 or (isinstance(body, dict) and body.get("success") is False):
            raise RuntimeError(f"vLLM {self.base_url} {endpoint}: {resp.status_code} {body}")
        return body

    def generate(self, body: Mapping[str, Any]) -> dict:
        """``/inference/v1/generate``: token ids in, token ids out (each choice with its version spans)."""
        return self._post("/inference/v1/generate", dict(body), timeout=self.generate_timeout)

    def pause(self, query: dict[str, str]) -> None:
        self._post("/pause", **query)

    def resume(self) -> None:
        self._post("/resume")

    def reset_prefix_cache(self, deadline_s: float = 30.0) -> None:
        """Retried while vLLM refuses (``success: false``: requests still hold blocks)."""
        end = time.monotonic() + deadline_s
        while not requests.post(self.base_url + "/reset_prefix_cache", timeout=self.timeout).json().get("success"):
            if time.monotonic() > end:
                raise RuntimeError(f"vLLM {self.base_url} /reset_prefix_cache: still busy after {deadline_s:.0f}s")
            time.sleep(0.2)

    def reload_weights(self, path: str) -> None:
        """``reload_weights`` from ``path``. A failed reload leaves vLLM without weights (the next forward pass ends
        the engine), so the last checkpoint that loaded is loaded again before the error is raised."""
        try:
            self._post("/collective_rpc", {"method": "reload_weights", "kwargs": {"weights_path": path}})
        except RuntimeError:
            served = self.loaded or requests.get(self.base_url + "/v1/models", timeout=self.timeout).json()["data"][0]["root"]
            self._post("/collective_rpc", {"method": "reload_weights", "kwargs": {"weights_path": served}})
            raise
        self.loaded = path

    def update_weight_version(self, version: str) -> None:
        self._post("/update_weight_version", {"new_version": version})

    def weight_version(self) -> str:
        resp = requests.get(self.base_url + "/weight_info", timeout=self.timeout)
        resp.raise_for_status()
        return resp.json()["weight_version"]


class ThreadedVllmClient:
    """The reference client protocols over :class:`VLLMClient`, each call in a thread: ``/generate`` calls in a pool
    of their own (a request parked by a pause must not take the thread a resume needs)."""

    def __init__(self, client: VLLMClient, max_generations: int = 64) -> None:
        self.client, self.url = client, client.base_url
        self.dialect = VllmDialect()
        self._generations = ThreadPoolExecutor(max_generations, thread_name_prefix="generate")
        self._control = ThreadPoolExecutor(4, thread_name_prefix="control")

    async def _run(self, fn: Callable[..., Any], *args: Any, pool: ThreadPoolExecutor | None = None) -> Any:
        return await asyncio.get_running_loop().run_in_executor(pool or self._control, fn, *args)

    async def generate(self, payload: Mapping[str, Any]) -> Any:
        body = self.dialect.outgoing("/generate", dict(payload))[1]
        answer = await self._run(self.client.generate, body, pool=self._generations)
        return self.dialect.answered("/generate", dict(payload), answer)

    async def pause(self, mode: str) -> None:
        await self._run(self.client.pause, PAUSE_MODES[mode])

    async def resume(self) -> None:
        await self._run(self.client.resume)

    async def flush_cache(self) -> None:
        await self._run(self.client.reset_prefix_cache)

    async def update_weight_version(self, version: str) -> None:
        await self._run(self.client.update_weight_version, version)

    async def get_weight_version(self) -> str:
        return await self._run(self.client.weight_version)

    async def update_weights_from_disk(self, path: str | Path) -> None:  # what DiskTransport calls
        await self._run(self.client.reload_weights, str(path))

    def close(self) -> None:
        for pool in (self._generations, self._control):
            pool.shutdown(wait=False, cancel_futures=True)


@dataclass(frozen=True)
class TrlStyleIntegration:
    """Disk updates only (vLLM 0.32 moves tensors only through CUDA IPC and NCCL); no LoRA."""

    name: str = "vllm-trl-client-example"
    capabilities: Capabilities = field(default_factory=lambda: Capabilities(transports=frozenset({"disk"}),
                                                                            lora=False))

    async def build(self, env: BuildEnv) -> Roles:
        engines = [ThreadedVllmClient(VLLMClient(url)) for url in env.engine_urls]
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


integration = TrlStyleIntegration()
