"""An async httpx vLLM integration with its own update cycle and rollout manager (engines stamped with versions).

vLLM 0.32 on CPU moves weights only from disk (``/collective_rpc`` ``reload_weights``). The cycle, per update:

    write checkpoint (tmp dir + rename) → /pause?mode=keep&clear_cache=false|wait → [/reset_prefix_cache, wait only]
    → reload_weights on every engine → /update_weight_version on every engine → /resume → publish

A failed reload leaves vLLM without weights, and a reload that succeeded on one engine while another failed leaves it
serving weights nobody published, so on any failure every engine reloads the last published checkpoint (the served
model's directory before the first update), then resumes; nothing is stamped or published.

    python -m conformance --engine vllm --integration examples.vllm_designs.async_httpx:integration
"""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Awaitable, Callable, Mapping, Sequence

import httpx

from conformance.interface import (KEEPALIVE_EXPIRY_S, Batch, BuildEnv, Capabilities, Group, LoraAdapter, Prompt,
                                   Roles, Sample, Turn)

VLLM_PAUSE = {"in_place": {"mode": "keep", "clear_cache": "false"}, "retract": {"mode": "wait"}}
"""The suite's pause mode → vLLM's. Never a bare /pause: its default, abort, ends every request in flight; and keep
holds the requests on their KV only with clear_cache=false (by default the pause clears the caches, preempting them)."""


class VllmError(RuntimeError):
    pass


# -- checkpoints ---------------------------------------------------------------------------------------------------

def write_dir_atomic(root: Path, name: str, files: Mapping[str, bytes]) -> Path:
    """Write ``files`` into a fresh temp dir under ``root``, fsync, rename to ``root/name`` (must not exist)."""
    root.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{name}.", suffix=".tmp", dir=root))
    try:
        for fname, data in files.items():
            with open(staging / fname, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
        os.rename(staging, root / name)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    fd = os.open(root, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    return root / name


def safetensors_bytes(tensors: Mapping[str, Any]) -> bytes:
    from safetensors.torch import save
    return save({n: t.detach().to("cpu").contiguous().clone() for n, t in tensors.items()})


_attempts = itertools.count()


def write_checkpoint(root: Path, version: int, weights: Mapping[str, Any]) -> Path:
    """A full checkpoint under a name never used before (a retried version gets a new directory)."""
    return write_dir_atomic(root, f"v{version}.{next(_attempts)}",
                            {"model.safetensors": safetensors_bytes(weights), "config.json": b"{}"})


def write_adapter(root: Path, version: int, adapter: LoraAdapter) -> Path:
    return write_dir_atomic(root, f"{adapter.name}-v{version}.{next(_attempts)}",
                            {"adapter_model.safetensors": safetensors_bytes(adapter.tensors),
                             "adapter_config.json": json.dumps(dict(adapter.config)).encode()})


# -- the engine client -----------------------------------------------------------------------------------------------

class AsyncVllm:
    """One vLLM server (``VLLM_SERVER_DEV_MODE=1``, ``--enable-scale-out``, runtime LoRA)."""

    def __init__(self, url: str, http: httpx.AsyncClient) -> None:
        self.url, self.http = url.rstrip("/"), http
        self.served: str | None = None
        """The last published checkpoint (None: the directory it was started on, read from /v1/models)."""

    async def call(self, path: str, body: Any = None, *, timeout: float = 60.0, **params: str) -> Any:
        resp = await self.http.post(self.url + path, json=body, params=params or None, timeout=timeout)
        data = resp.json() if "json" in resp.headers.get("content-type", "") else resp.text
        if resp.status_code != 200 or (isinstance(data, dict) and data.get("success") is False):
            raise VllmError(f"vLLM {self.url} {path}: {resp.status_code} {str(data)[:300]}")
        return data

    async def generate(self, token_ids: list[int], max_tokens: int, request_id: str, model: str | None = None,
                       on_sent: Callable[[], None] = lambda: None) -> dict:
        body: dict[str, Any] = {"token_ids": token_ids, "request_id": request_id,
                                "sampling_params": {"max_tokens": max_tokens}}
        if model is not None:
            body["model"] = model
        on_sent()
        return await self.call("/inference/v1/generate", body, timeout=300.0)

    async def pause(self, mode: str) -> None:
        await self.call("/pause", **VLLM_PAUSE[mode])

    async def resume(self) -> None:
        await self.call("/resume")

    async def reset_prefix_cache(self, deadline_s: float = 30.0) -> None:
        """vLLM answers ``success: false`` while running requests hold blocks: retry."""
        end = asyncio.get_running_loop().time() + deadline_s
        while True:
            resp = await self.http.post(self.url + "/reset_prefix_cache", timeout=60.0)
            if resp.status_code == 200 and resp.json().get("success") is not False:
                return
            if asyncio.get_running_loop().time() > end:
                raise VllmError(f"vLLM {self.url} /reset_prefix_cache: {resp.status_code} {resp.text[:200]}")
            await asyncio.sleep(0.1)

    async def base_model_dir(self) -> str:
        resp = await self.http.get(self.url + "/v1/models", timeout=60.0)
        resp.raise_for_status()
        return str(resp.json()["data"][0]["root"])

    async def reload(self, path: str) -> None:
        await self.call("/collective_rpc", {"method": "reload_weights", "kwargs": {"weights_path": path}})

    async def restore(self) -> None:
        """Reload the last published checkpoint: a failed reload left this engine with no weights, one that
        succeeded with weights nobody published (the cycle failed elsewhere)."""
        await self.reload(self.served or await self.base_model_dir())

    async def stamp(self, version: int) -> None:
        await self.call("/update_weight_version", {"new_version": str(version)})


async def on_all(engines: Sequence[Any], fn: Callable[[Any], Awaitable[Any]]) -> None:
    """Run ``fn`` on every engine, wait for all, raise the first error."""
    results = await asyncio.gather(*(fn(e) for e in engines), return_exceptions=True)
    for r in results:
        if isinstance(r, BaseException):
            raise r


# -- the rollout manager ---------------------------------------------------------------------------------------------

def numeric(label: Any) -> int | None:
    return int(label) if isinstance(label, str) and label.isdigit() else None


class RolloutManager:
    """Fully-async producer (``max_in_flight_groups`` groups, samples round-robin over engines, a bounded buffer) and a
    consumer applying the staleness bound at hand-out. Aborted groups are resubmitted from their pristine prompt.

    ``stamps_engines``: a turn's versions are the engine's span labels; else the version published when the call was
    sent (``Turn.policy_version``), and no call is sent while an update cycle holds the engines."""

    def __init__(self, engines: Sequence[Any], env: BuildEnv, *, stamps_engines: bool = True) -> None:
        self.engines, self.cfg, self.prompts = list(engines), env.rollout, env.prompts
        self.stamps_engines = stamps_engines
        self.version: int | None = None
        self.adapter: str | None = None
        self._rr = itertools.count()
        self._retry: list[Prompt] = []
        self._buffer: asyncio.Queue[tuple[Prompt, list[Sample]]] | None = None
        self._producer: asyncio.Task[None] | None = None
        self._open = asyncio.Event()
        self._open.set()
        self._ids = itertools.count()
        self._dropped = 0
        self._dispatching = 0
        """Calls past the gate whose send has not started yet."""

    # versions
    @property
    def weight_version(self) -> int | None:
        return self.version

    def set_weight_version(self, version: int) -> None:
        if self.version is not None and version < self.version:
            raise RuntimeError(f"published version went backwards: {self.version} -> {version}")
        self.version = version

    async def hold(self) -> None:
        """An update cycle starts: with client-side versions, no call goes out until it published, and the calls that
        passed the gate already are on their way (their send started) before the cycle pauses an engine: a call
        reaching a paused engine would run under weights newer than the version it records."""
        if not self.stamps_engines:
            self._open.clear()
            while self._dispatching:
                await asyncio.sleep(0.001)

    def release(self) -> None:
        self._open.set()

    # producer
    async def start(self) -> None:
        if self._producer is None:
            self._buffer = asyncio.Queue(self.cfg.buffer_capacity)
            self._producer = asyncio.create_task(self._produce())

    async def _produce(self) -> None:
        running: set[asyncio.Task[None]] = set()
        try:
            while True:
                while len(running) < self.cfg.max_in_flight_groups:
                    prompt = self._retry.pop(0) if self._retry else self.prompts()
                    running.add(asyncio.create_task(self._group(prompt)))
                done, running = await asyncio.wait(running, return_when=asyncio.FIRST_COMPLETED)
                for t in done:
                    t.result()
        finally:
            for t in running:
                t.cancel()
            await asyncio.gather(*running, return_exceptions=True)

    async def _group(self, prompt: Prompt) -> None:
        samples = list(await asyncio.gather(*(self._sample(prompt, i) for i in range(self.cfg.group_size))))
        if any(s.aborted for s in samples):
            self._dropped += 1
            self._retry.append(prompt)
            return
        assert self._buffer is not None
        await self._buffer.put((prompt, samples))

    async def _sample(self, prompt: Prompt, i: int) -> Sample:
        engine = self.engines[next(self._rr) % len(self.engines)]
        sample = Sample(index=prompt.index * self.cfg.group_size + i, turns=[])
        ids = list(prompt.text.encode("utf-8"))  # the served model's tokenizer: bytes
        for t in range(self.cfg.turns):
            await self._open.wait()
            rid = f"p{prompt.index}.s{i}.t{t}.{next(self._ids)}"
            sent_under, model = self.version, self.adapter
            self._dispatching += 1
            sent = [False]

            def on_sent() -> None:
                if not sent[0]:
                    sent[0] = True
                    self._dispatching -= 1
            try:
                out = await engine.generate(ids, self.cfg.max_new_tokens, rid, model, on_sent)
            finally:
                on_sent()
            choice = out["choices"][0]
            spans = choice.get("weight_versions") or []
            tokens = list(choice.get("token_ids") or [])
            turn = Turn(rid=rid, weight_version=spans[-1]["version"] if spans else None,
                        finish_reason=str(choice.get("finish_reason")),
                        completion_tokens=int((out.get("usage") or {}).get("completion_tokens", len(tokens))),
                        weight_versions=[str(s["version"]) for s in spans] or None,
                        policy_version=None if self.stamps_engines else sent_under)
            sample.turns.append(turn)
            if turn.finish_reason == "abort":
                sample.aborted = True
                break
            ids += tokens
        return sample

    # consumer
    def _versions(self, turn: Turn) -> list[int]:
        if not self.stamps_engines:
            return [] if turn.policy_version is None else [turn.policy_version]
        found = (numeric(v) for v in [turn.weight_version, *(turn.weight_versions or [])])
        return [v for v in found if v is not None]

    def _oldest(self, samples: list[Sample]) -> int | None:
        vs = [v for s in samples for t in s.turns for v in self._versions(t)]
        return min(vs) if vs else None

    async def _pop(self) -> tuple[Prompt, list[Sample]]:
        assert self._buffer is not None and self._producer is not None
        get = asyncio.ensure_future(self._buffer.get())
        try:
            await asyncio.wait({get, self._producer}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            if not get.done():
                get.cancel()
        if get.done() and not get.cancelled():
            return get.result()
        self._producer.result()  # the producer's own error
        raise RuntimeError("rollout producer stopped")

    async def next_batch(self) -> Batch:
        if self._producer is None:
            raise RuntimeError("next_batch() before start()")
        picked: list[tuple[Prompt, list[Sample], int | None]] = []
        stale = 0
        while True:
            while len(picked) < self.cfg.batch_size:
                prompt, samples = await self._pop()
                picked.append((prompt, samples, self._oldest(samples)))
            current, kept = self.version, []
            for prompt, samples, oldest in picked:
                staleness = None if current is None or oldest is None else current - oldest
                if staleness is not None and staleness < 0:
                    raise RuntimeError(f"negative staleness {staleness}: group at {oldest}, current {current}")
                bound = self.cfg.max_staleness
                if bound is not None and staleness is not None and staleness > bound:
                    stale += 1
                    self._retry.append(prompt)
                else:
                    kept.append((prompt, samples, oldest))
            picked = kept
            if len(picked) == self.cfg.batch_size:
                break
        groups = sorted((Group(p.index, s, o, None if current is None or o is None else current - o)
                         for p, s, o in picked), key=lambda g: g.prompt_index)
        metrics = {"aborted_groups_dropped": float(self._dropped), "stale_groups_filtered": float(stale)}
        self._dropped = 0
        measured = [g.staleness for g in groups if g.staleness is not None]
        if measured:
            metrics["staleness_mean"] = sum(measured) / len(measured)
            metrics["staleness_max"] = float(max(measured))
        return Batch(groups=groups, weight_version=current, metrics=metrics)

    async def stop(self) -> None:
        if self._producer is not None:
            self._producer.cancel()
            await asyncio.gather(self._producer, return_exceptions=True)


# -- the updater -----------------------------------------------------------------------------------------------------

class DiskUpdater:
    """One trainer cell over every engine (disk reloads only)."""

    def __init__(self, engines: Sequence[AsyncVllm], manager: RolloutManager, env: BuildEnv) -> None:
        self.engines, self.manager, self.env = list(engines), manager, env
        self._version = manager.weight_version or 0  # a failover cell continues the published version

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
            await on_all(self.engines, lambda e: e.pause(self.env.pause_mode))
            try:
                if self.env.pause_mode == "retract":  # drained: the prefix cache holds KV of the old weights
                    await on_all(self.engines, lambda e: e.reset_prefix_cache())
                try:
                    await on_all(self.engines, lambda e: e.reload(path))
                except BaseException:
                    await asyncio.gather(*(e.restore() for e in self.engines), return_exceptions=True)
                    raise
                await on_all(self.engines, lambda e: e.stamp(new))
                for e in self.engines:
                    e.served = path
            finally:
                await on_all(self.engines, lambda e: e.resume())
            self._version = new
            self.manager.set_weight_version(new)
        finally:
            self.manager.release()
        return new


@dataclass(frozen=True)
class AsyncHttpxIntegration:
    name: str = "vllm-design-async-httpx"
    capabilities: Capabilities = field(default_factory=lambda: Capabilities(
        transports=frozenset({"disk"}), lora=False, pause_modes=frozenset({"retract", "in_place"}),
        absent_because={"tensor": "vLLM 0.32 moves tensors only over CUDA IPC/NCCL",
                        "distributed": "vLLM 0.32 moves tensors only over CUDA IPC/NCCL"}))

    async def build(self, env: BuildEnv) -> Roles:
        http = httpx.AsyncClient(limits=httpx.Limits(max_connections=None, keepalive_expiry=KEEPALIVE_EXPIRY_S))
        engines = [AsyncVllm(url, http) for url in env.engine_urls]
        manager = RolloutManager(engines, env)

        async def close() -> None:
            await manager.stop()
            await http.aclose()

        return Roles(manager=manager, new_updater=lambda: DiskUpdater(engines, manager, env), close=close,
                     engines=list(engines))


integration = AsyncHttpxIntegration()
