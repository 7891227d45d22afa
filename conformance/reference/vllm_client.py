"""The reference client for one vLLM server (0.32.0, ``VLLM_SERVER_DEV_MODE=1``, ``--enable-scale-out``): the same
protocols as :class:`~conformance.reference.client.HttpEngineClient`, spoken in vLLM's routes, so the reference
updater and manager run on vLLM unchanged (``conformance.reference:vllm``).

The cycle maps onto vLLM's RL surface (``vllm/entrypoints/rl/online/api_router.py``, the dev routes):

* pause ``in_place`` → ``/pause?mode=keep&clear_cache=false`` (the default mode, ``abort``, ends every request in
  flight, and a pause that clears the caches preempts what runs), then every request salted apart from the KV the
  cache holds (:meth:`VllmEngineClient.generate`); ``retract`` → ``mode=wait`` (answers once the running requests
  finished, the prefix cache cleared), continue → ``/resume``;
* the label → ``/update_weight_version`` (never aborts; the token-in/token-out answers carry its spans);
* a disk update → ``/collective_rpc`` ``reload_weights`` with ``kwargs.weights_path`` (read in place between two
  engine steps; vLLM keeps the prefix cache, so a flush is a ``/reset_prefix_cache``, refused while requests run).
  A reload that fails leaves vLLM without weights (its layers on the meta device; the next forward pass kills the
  engine), so the client loads the last checkpoint that loaded again before it reports the failure: the cycle then
  resumes an engine that still serves its old weights (measured on 0.32.0, ``gpu/fidelity/vllm.py``);
* LoRA → ``/v1/load_lora_adapter`` from a PEFT directory (vLLM loads adapters from disk only);
* ``/generate`` → ``/inference/v1/generate`` (token ids; ``model`` names the adapter), its answer read back as
  SGLang's ``meta_info`` by the vLLM dialect (:mod:`conformance.dialect`).

* a distributed update → vLLM's native weight transfer (``--weight-transfer-config '{"backend": "gloo"}'``: the gloo
  engine this project registers through vLLM's factory, :mod:`fakes.vllm.weight_transfer`): the group →
  ``/init_weight_transfer_engine`` (``init_info``: the rendezvous and the group's name), the session →
  ``/start_weight_update`` … ``/finish_weight_update``, the broadcast's receiving side → ``/update_weights``
  (``update_info``: ``names``, ``dtype_names``, ``shapes``), the group's end → ``/shutdown_weight_transfer_engine``.
  The label is the cycle's relabel inside the session (the finish carries none). An update that fails ends vLLM's
  session with the layers reset (no weights): the client opens a session again, so that the cycle's closing finish
  gives the layers their tensors back.

Tensor updates do not exist on vLLM 0.32 on CPU (its tensor-moving engines are CUDA IPC and NCCL).
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any, Mapping, Sequence

from ..dialect import VllmDialect
from .client import EngineError, HttpEngineClient
from .releases import Release

NO_TENSORS = ("vLLM 0.32 moves tensors only through its weight-transfer engines (CUDA IPC, NCCL; "
              "/init_weight_transfer_engine), none of which runs on CPU: use the disk transport")
NO_GLOO = ("vLLM's native weight transfer on CPU needs torch here and engines started with "
           "--weight-transfer-config '{\"backend\": \"gloo\"}'")


class VllmRelease(Release):
    """What the reference cycle does on vLLM: it pauses with a mode, it can reset the prefix cache once the engine is
    drained, and it loads adapters from disk."""

    @property
    def pause_modes(self) -> bool:
        return True

    @property
    def flush_while_retracted(self) -> bool:
        return True

    @property
    def lora_tensor_field(self) -> str | None:
        return None


class VllmEngineClient(HttpEngineClient):
    """The reference client for one vLLM server (see the module docstring)."""

    _dialect = VllmDialect()
    WEIGHT_LOADS = frozenset({"/collective_rpc", "/update_weights"})  # reload_weights; the native transfer
    loaded: str | None = None
    """The checkpoint the engine serves, once a reload of this client's succeeded."""
    kept_pauses = 0
    """How many pauses kept the engine's caches (``in_place``): its requests' ``cache_salt`` since the last."""
    _keeping: asyncio.Event | None = None
    """Set once the last ``in_place`` pause was answered: requests wait for it, so none salted for the new weights
    can be scheduled on the old ones."""

    async def generate(self, payload: Mapping[str, Any]) -> Any:
        """``/inference/v1/generate`` for an SGLang ``/generate`` payload; the answer as SGLang's output. After an
        ``in_place`` pause the prefix cache still holds the KV of the weights before (a reset is refused while the
        frozen requests hold blocks), so every request sent once the engine paused is salted apart from it
        (``cache_salt``, as prime-rl and SkyRL salt per version): the engine queues it until it continues on the new
        weights. A request made while the pause is on its way waits for its answer."""
        if self._keeping is not None:
            await asyncio.wait_for(self._keeping.wait(), self.generate_timeout_s)
        path, body = self._dialect.outgoing("/generate", dict(payload))
        if self.kept_pauses:
            body["cache_salt"] = f"pause-{self.kept_pauses}"
        answer = await self._call(path, body, timeout_s=self.generate_timeout_s)
        return self._dialect.answered("/generate", dict(payload), answer)

    async def pause(self, mode: str) -> None:
        """``/pause`` with the mode always sent (vLLM's default aborts every request in flight); ``in_place`` keeps
        the caches (``keep&clear_cache=false``), and salts what is sent once it is answered apart from them."""
        path = self._dialect.outgoing("/pause_generation", {"mode": mode})[0]
        if mode != "in_place":
            return await self._call(path)
        self._keeping = keeping = asyncio.Event()
        try:
            await self._call(path)
        finally:
            self.kept_pauses += 1
            keeping.set()

    async def resume(self) -> None:
        await self._call(self._dialect.outgoing("/continue_generation")[0])

    async def flush_cache(self) -> None:
        """``/reset_prefix_cache``, retried while vLLM refuses (``success: false``: requests hold blocks)."""
        await self.retry_while_busy("/reset_prefix_cache", lambda response: response.status_code == 200
                                    and response.json().get("success") is False)

    async def server_info(self) -> Mapping[str, Any]:
        """``/version``: vLLM's release."""
        body = await self._call("/version", method="GET")
        return body if isinstance(body, dict) else {"version": body}

    async def release(self) -> Release:
        return VllmRelease(())

    def version_payload(self, version: str) -> dict[str, Any]:
        return {"new_version": version}

    async def get_weight_version(self) -> str:
        body = await self._call("/weight_info", method="GET")
        if not isinstance(body, dict) or not isinstance(body.get("weight_version"), str):
            raise EngineError(self.url, "/weight_info", 200, body)
        return body["weight_version"]

    async def update_weights_from_disk(self, path: str | Path, weight_version: str | None = None,
                                       flush_cache: bool = False) -> None:
        """``reload_weights`` from ``path`` (the label is the cycle's next call: a reload takes none); on failure, the
        weights it served are loaded again before the error is raised (:meth:`restore`)."""
        try:
            await self._reload(str(path))
        except EngineError as exc:
            await self.restore(exc)
            raise
        self.loaded = str(path)
        if flush_cache:
            await self.flush_cache()

    async def _reload(self, path: str) -> None:
        await self._call("/collective_rpc", {"method": "reload_weights", "kwargs": {"weights_path": path}})

    async def restore(self, failure: EngineError) -> None:
        """Load the last checkpoint that loaded (at first, the served model's directory: ``/v1/models`` ``root``)
        again; a restore that fails too becomes a note on ``failure``."""
        try:
            if self.loaded is None:
                models = await self._call("/v1/models", method="GET")
                self.loaded = str(models["data"][0]["root"])
            await self._reload(self.loaded)
        except (EngineError, KeyError, IndexError, TypeError) as exc:
            failure.add_note(f"restoring the weights it served also failed: the engine has none ({exc})")

    async def update_weights_from_tensor(self, serialized_named_tensors: Sequence[str],
                                         weight_version: str | None = None, flush_cache: bool = False) -> None:
        raise EngineError(self.url, "/update_weights", None, NO_TENSORS)

    async def init_weights_update_group(self, master_address: str, master_port: int, rank_offset: int,
                                        world_size: int, group_name: str, backend: str) -> None:
        """``/init_weight_transfer_engine``: the engine joins the trainer's gloo group (it answers once every rank
        joined)."""
        if backend != "gloo":
            raise EngineError(self.url, "/init_weight_transfer_engine", None,
                              f"backend {backend!r}: vLLM's weight transfer on CPU is its gloo engine")
        await self._call("/init_weight_transfer_engine", {"init_info": {
            "master_address": master_address, "master_port": master_port, "rank_offset": rank_offset,
            "world_size": world_size, "group_name": group_name}})

    async def update_weights_from_distributed(self, names: Sequence[str], dtypes: Sequence[str],
                                              shapes: Sequence[Sequence[int]], group_name: str,
                                              weight_version: str | None = None, flush_cache: bool = False) -> None:
        """``/update_weights``: receive the broadcast (answered once every tensor arrived). On failure a session is
        opened again (vLLM ended it, the layers reset): the cycle's finish then restores them."""
        try:
            await self._call("/update_weights", {"update_info": {
                "names": list(names), "dtype_names": list(dtypes), "shapes": [list(s) for s in shapes]}})
        except EngineError as exc:
            try:
                await self._call("/start_weight_update")
            except EngineError as again:  # still active: the refusal never reached the worker
                exc.add_note(f"reopening the weight-update session: {again}")
            raise
        if flush_cache:
            await self.flush_cache()

    async def destroy_weights_update_group(self, group_name: str) -> None:
        await self._call("/shutdown_weight_transfer_engine")

    async def begin_weight_update(self) -> bool:
        """``/start_weight_update`` (the distributed transport's session; a disk reload needs none)."""
        await self._call("/start_weight_update")
        return True

    async def end_weight_update(self) -> bool:
        """``/finish_weight_update`` (no version: the cycle relabelled inside the session)."""
        await self._call("/finish_weight_update")
        return True

    async def load_lora_adapter_from_tensors(self, lora_name: str, config_dict: Mapping[str, Any],
                                             serialized_named_tensors: Sequence[str]) -> None:
        raise EngineError(self.url, "/v1/load_lora_adapter", None, "vLLM loads adapters from disk only")

    async def load_lora_adapter(self, lora_name: str, lora_path: str | Path) -> None:
        await self._call("/v1/load_lora_adapter", {"lora_name": lora_name, "lora_path": str(lora_path)})

    async def unload_lora_adapter(self, lora_name: str) -> None:
        await self._call("/v1/unload_lora_adapter", {"lora_name": lora_name})


class VllmSleepingClient(VllmEngineClient):
    """For designs that free the engines' memory for each update (colocated trainers): every pause is a ``/sleep``
    (level 1, in the cycle's mode), a load wakes the weights first (``/wake_up?tags=weights``: an update into
    sleeping memory crashes vLLM's engine core on GPUs, vllm#57853), and the continue wakes the rest (``/wake_up``:
    vLLM resumes scheduling only once nothing sleeps, ``EngineCore.wake_up``, 0.32.0)."""

    async def pause(self, mode: str) -> None:
        query = self._dialect.outgoing("/pause_generation", {"mode": mode})[0].partition("?")[2]
        await self._call(f"/sleep?level=1&{query}")

    async def resume(self) -> None:
        await self._call("/wake_up")

    async def wake_weights(self) -> None:
        """Wake the weights (while the KV cache sleeps the engine stays paused; weights awake already: a no-op)."""
        await self._call("/wake_up?tags=weights")

    async def _reload(self, path: str) -> None:
        await self.wake_weights()
        await super()._reload(path)

    async def begin_weight_update(self) -> bool:
        await self.wake_weights()
        return await super().begin_weight_update()
