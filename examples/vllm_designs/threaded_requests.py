"""A blocking ``requests`` vLLM client run in threads, with versions kept on the client side (TRL/OpenRLHF style).

Every call is a plain blocking ``requests`` call; the async roles run them with ``asyncio.to_thread`` (control calls)
or in a pool of their own (``/inference/v1/generate``: a request frozen by a pause must not hold the thread a
``/resume`` needs). A turn's version is the one published when its call was sent (``Turn.policy_version``,
``stamps_engines=False``); no call goes out while a cycle holds the engines, so a call queued at vLLM's pause never
runs under weights newer than the version it records. The engines are still labelled (``/update_weight_version``)
so their own label agrees (V1). Pauses are a bare ``keep`` only (TRL's async GRPO): vLLM clears its caches at such
a pause, preempting the requests in flight (recomputed on resume) and resetting the prefix cache, which is the suite's
``retract`` (``pause_modes={"retract"}``); no reset of its own.

    python -m conformance --engine vllm --integration examples.vllm_designs.threaded_requests:integration
"""

from __future__ import annotations

import asyncio
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence

import requests

from conformance.interface import BuildEnv, Capabilities, LoraAdapter, Roles

from .async_httpx import RolloutManager, write_checkpoint


class BlockingVllm:
    """A blocking client of one vLLM server."""

    def __init__(self, url: str, timeout: float = 60.0) -> None:
        self.url, self.timeout = url.rstrip("/"), timeout
        self.served: str | None = None
        """The last published checkpoint (None: the directory it was started on, read from /v1/models)."""

    def post(self, path: str, body: Any = None, timeout: float | None = None, **params: str) -> Any:
        resp = requests.post(self.url + path, json=body, params=params or None, timeout=timeout or self.timeout)
        data = resp.json() if "json" in resp.headers.get("content-type", "") else resp.text
        if resp.status_code != 200 or (isinstance(data, dict) and data.get("success") is False):
            raise RuntimeError(f"vLLM {self.url} {path}: {resp.status_code} {str(data)[:300]}")
        return data

    def generate(self, token_ids: list[int], max_tokens: int, request_id: str, model: str | None = None) -> dict:
        body: dict[str, Any] = {"token_ids": token_ids, "request_id": request_id,
                                "sampling_params": {"max_tokens": max_tokens}}
        if model is not None:
            body["model"] = model
        return self.post("/inference/v1/generate", body, timeout=300.0)

    def pause_keep(self) -> None:
        self.post("/pause", mode="keep")

    def resume(self) -> None:
        self.post("/resume")

    def reload(self, path: str) -> None:
        self.post("/collective_rpc", {"method": "reload_weights", "kwargs": {"weights_path": path}})

    def restore(self) -> None:
        """Load the last published checkpoint: a failed reload left vLLM with no weights, one that succeeded with
        weights nobody published (the cycle failed on another engine)."""
        if self.served is None:
            resp = requests.get(self.url + "/v1/models", timeout=self.timeout)
            resp.raise_for_status()
            self.served = str(resp.json()["data"][0]["root"])
        self.reload(self.served)

    def stamp(self, version: int) -> None:
        self.post("/update_weight_version", {"new_version": str(version)})


class Threaded:
    """The manager's view of a :class:`BlockingVllm`: ``generate`` awaited in a dedicated thread pool."""

    def __init__(self, client: BlockingVllm, pool: ThreadPoolExecutor) -> None:
        self.client, self.pool = client, pool

    async def generate(self, token_ids: list[int], max_tokens: int, request_id: str, model: str | None = None,
                       on_sent: Callable[[], None] = lambda: None) -> dict:
        loop = asyncio.get_running_loop()

        def send() -> dict:
            loop.call_soon_threadsafe(on_sent)  # the thread runs: the request goes out now
            return self.client.generate(token_ids, max_tokens, request_id, model)
        return await loop.run_in_executor(self.pool, send)


def on_all(clients: Sequence[BlockingVllm], method: str, *args: Any) -> None:
    """Blocking: ``method`` on every engine in parallel threads; raise the first error once all answered."""
    with ThreadPoolExecutor(len(clients)) as pool:
        futures = [pool.submit(getattr(c, method), *args) for c in clients]
    errors = [f.exception() for f in futures if f.exception() is not None]
    if errors:
        raise errors[0]  # type: ignore[misc]


class ThreadedUpdater:
    """pause(keep) → reload → label → resume → publish, each step a blocking call in a thread."""

    def __init__(self, clients: Sequence[BlockingVllm], manager: RolloutManager, env: BuildEnv,
                 shared: dict[str, Any]) -> None:
        self.clients, self.manager, self.env = list(clients), manager, env
        self.shared = shared
        """State every trainer cell of one build shares (failover cells continue it)."""
        self._version = manager.weight_version or 0

    @property
    def version(self) -> int:
        return self._version

    async def update(self, weights: Mapping[str, Any] | None = None, *, transport: str = "disk",
                     lora: LoraAdapter | None = None) -> int:
        if lora is not None or weights is None or transport != "disk":
            raise ValueError(f"this updater reloads full weights from disk, not {transport!r}/LoRA")
        new = self._version + 1
        path = str(await asyncio.to_thread(write_checkpoint, self.env.checkpoint_dir, new, weights))
        await self.manager.hold()
        try:
            await asyncio.to_thread(self._cycle, path, new)
            self._version = new
            self.manager.set_weight_version(new)
            await self.after_publish(path)
        finally:
            self.manager.release()
        return new

    def _cycle(self, path: str, new: int) -> None:
        on_all(self.clients, "pause_keep")
        try:
            try:
                on_all(self.clients, "reload", path)
            except BaseException:
                for c in self.clients:
                    try:
                        c.restore()
                    except Exception:  # noqa: BLE001 - the original error is what the caller needs
                        pass
                raise
            on_all(self.clients, "stamp", new)
            for c in self.clients:
                c.served = path
        finally:
            on_all(self.clients, "resume")

    async def after_publish(self, path: str) -> None:
        """Work after the new version is published (nothing here)."""


@dataclass(frozen=True)
class ThreadedRequestsIntegration:
    name: str = "vllm-design-threaded-requests"
    updater_cls: type = ThreadedUpdater
    capabilities: Capabilities = field(default_factory=lambda: Capabilities(
        transports=frozenset({"disk"}), lora=False, pause_modes=frozenset({"retract"}), stamps_engines=False,
        absent_because={"tensor": "vLLM 0.32 moves tensors only over CUDA IPC/NCCL",
                        "distributed": "vLLM 0.32 moves tensors only over CUDA IPC/NCCL"}))

    async def build(self, env: BuildEnv) -> Roles:
        clients = [BlockingVllm(url) for url in env.engine_urls]
        pool = ThreadPoolExecutor(64, thread_name_prefix="vllm-generate")
        manager = RolloutManager([Threaded(c, pool) for c in clients], env, stamps_engines=False)

        async def close() -> None:
            await manager.stop()
            pool.shutdown(wait=False, cancel_futures=True)

        shared: dict[str, Any] = {}
        return Roles(manager=manager, new_updater=lambda: self.updater_cls(clients, manager, env, shared), close=close,
                     engines=list(clients))


integration = ThreadedRequestsIntegration()
