"""An async HTTP client for one SGLang engine: every endpoint an async-RL weight sync touches.

Every call has a finite timeout, and every engine answer is validated: a non-200 status, an unreadable body or
``"success": false`` raises :class:`EngineError` naming the engine, the endpoint, the status and the body (P5).
Field names and defaults follow SGLang's ``python/sglang/srt/managers/io_struct.py`` (0.5.23); where SGLang's default
hurts, the client sends the safe value explicitly (``abort_all_requests: false``, ``flush_cache: false``).
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import httpx

from .releases import Release


class EngineError(RuntimeError):
    """An engine refused a call or could not be reached."""

    def __init__(self, url: str, endpoint: str, status: int | None, body: Any) -> None:
        self.url, self.endpoint, self.status, self.body = url, endpoint, status, body
        shown = str(body)
        shown = shown if len(shown) <= 500 else shown[:500] + "..."
        super().__init__(f"engine {url} {endpoint}: status {status}: {shown}")


class HttpEngineClient:
    """The reference client for one SGLang server (target: 0.5.23; every protocol of
    :mod:`conformance.reference.protocols`).

    ``timeout_s`` bounds every control call; ``generate_timeout_s`` bounds ``/generate`` (requests park while
    the engine is paused, so it is longer); ``flush_deadline_s`` bounds the flush retries.
    """

    def __init__(self, url: str, http: httpx.AsyncClient, timeout_s: float = 60.0, *,
                 generate_timeout_s: float = 300.0, flush_deadline_s: float = 10.0) -> None:
        self.url = url.rstrip("/")
        self.http = http
        self.timeout_s = timeout_s
        self.generate_timeout_s = generate_timeout_s
        self.flush_deadline_s = flush_deadline_s
        self.has_sessions: bool | None = None
        """Whether the engine has ``/begin_weight_update`` (0.5.23+); None until the first try."""
        self._release: Release | None = None
        self.weight_loads_sent = 0
        """How many calls that load full weights this client sent (:attr:`WEIGHT_LOADS`): after a failed cycle, an
        engine sent one may hold part of the weights (the updater keeps it out of service)."""

    WEIGHT_LOADS = frozenset({"/update_weights_from_disk", "/update_weights_from_tensor",
                              "/update_weights_from_distributed"})
    """The endpoints that load full weights into the engine."""

    # -- plumbing ---------------------------------------------------------------------------------------

    def request_body(self, endpoint: str, payload: Any) -> Any:
        """Override point: the JSON body sent to ``endpoint`` (default: the one each method builds, with SGLang's
        field names and every harmful default overridden explicitly)."""
        return payload

    async def _request(self, method: str, endpoint: str, payload: Any = None,
                       timeout_s: float | None = None) -> httpx.Response:
        if endpoint in self.WEIGHT_LOADS:
            self.weight_loads_sent += 1
        try:
            return await self.http.request(method, self.url + endpoint, json=self.request_body(endpoint, payload),
                                           timeout=timeout_s or self.timeout_s)
        except httpx.HTTPError as exc:
            raise EngineError(self.url, endpoint, None, f"{type(exc).__name__}: {exc}") from exc

    def check_response(self, endpoint: str, response: httpx.Response) -> Any:
        """The decoded JSON body of a successful answer; raises :class:`EngineError` otherwise."""
        try:
            body = response.json()
        except ValueError:
            body = response.text
        if response.status_code != 200:
            raise EngineError(self.url, endpoint, response.status_code, body)
        if isinstance(body, dict) and body.get("success") is False:
            raise EngineError(self.url, endpoint, response.status_code, body)
        return body

    async def _call(self, endpoint: str, payload: Any = None, *, method: str = "POST",
                    timeout_s: float | None = None) -> Any:
        return self.check_response(endpoint, await self._request(method, endpoint, payload, timeout_s))

    # -- generation and pause -----------------------------------------------------------------------------

    async def generate(self, payload: Mapping[str, Any]) -> Any:
        """POST ``/generate`` (native payload); the decoded response."""
        return await self._call("/generate", dict(payload), timeout_s=self.generate_timeout_s)

    async def pause(self, mode: str) -> None:
        """``/pause_generation`` in ``mode``; SGLang's default mode is ``abort``, so it is always sent."""
        await self._call("/pause_generation", {"mode": mode})

    async def resume(self) -> None:
        """``/continue_generation``. Idempotent on the engine."""
        await self._call("/continue_generation", {})

    async def flush_cache(self) -> None:
        """``/flush_cache``, retried with backoff while the engine answers 400 (busy), up to the deadline (C2)."""
        await self.retry_while_busy("/flush_cache", lambda response: response.status_code == 400)

    async def retry_while_busy(self, endpoint: str, busy: Callable[[httpx.Response], bool]) -> None:
        """POST ``endpoint``, again with backoff while the answer is ``busy``, until :attr:`flush_deadline_s`; the
        last answer is checked (:meth:`check_response`)."""
        deadline, delay = time.monotonic() + self.flush_deadline_s, 0.05
        while True:
            response = await self._request("POST", endpoint)
            if not busy(response) or time.monotonic() + delay > deadline:
                self.check_response(endpoint, response)
                return
            await asyncio.sleep(delay)
            delay = min(2 * delay, 1.0)

    # -- what the engine is -------------------------------------------------------------------------------

    async def server_info(self) -> Mapping[str, Any]:
        """``/get_server_info``: the server's arguments and its SGLang ``version``."""
        body = await self._call("/get_server_info", method="GET")
        if not isinstance(body, dict):
            raise EngineError(self.url, "/get_server_info", 200, body)
        return body

    async def release(self) -> Release:
        """The engine's SGLang release (asked once)."""
        if self._release is None:
            self._release = Release.from_server_info(await self.server_info())
        return self._release

    # -- versions --------------------------------------------------------------------------------------

    def version_payload(self, version: str) -> dict[str, Any]:
        # SGLang defaults abort_all_requests to True: a bare bump aborts every in-flight request (miles #2589, I1).
        return {"new_version": version, "abort_all_requests": False}

    async def update_weight_version(self, version: str) -> None:
        """Relabel the engine's weights without aborting anything."""
        body = await self._call("/update_weight_version", self.version_payload(version))
        if isinstance(body, dict) and body.get("new_version", version) != version:
            raise EngineError(self.url, "/update_weight_version", 200, body)

    async def get_weight_version(self) -> str:
        """The label from ``/model_info`` (0.5.6+), else ``/get_model_info``."""
        response = await self._request("GET", "/model_info")
        endpoint = "/model_info"
        if response.status_code == 404:
            endpoint = "/get_model_info"
            response = await self._request("GET", endpoint)
        body = self.check_response(endpoint, response)
        if not isinstance(body, dict) or not isinstance(body.get("weight_version"), str):
            raise EngineError(self.url, endpoint, response.status_code, body)
        return body["weight_version"]

    # -- weight transports ---------------------------------------------------------------------------------

    @staticmethod
    def _stamped(payload: dict[str, Any], weight_version: str | None) -> dict[str, Any]:
        if weight_version is not None:
            payload["weight_version"] = weight_version
        return payload

    async def update_weights_from_disk(self, path: str | Path, weight_version: str | None = None,
                                       flush_cache: bool = False) -> None:
        """Load a checkpoint directory the engine can read."""
        payload = {"model_path": str(path), "flush_cache": flush_cache, "abort_all_requests": False}
        await self._call("/update_weights_from_disk", self._stamped(payload, weight_version))

    async def init_weights_update_group(self, master_address: str, master_port: int, rank_offset: int,
                                        world_size: int, group_name: str, backend: str) -> None:
        """Join the trainer's process group (blocks on the engine until every rank joined)."""
        await self._call("/init_weights_update_group", {
            "master_address": master_address, "master_port": master_port, "rank_offset": rank_offset,
            "world_size": world_size, "group_name": group_name, "backend": backend})

    async def update_weights_from_distributed(self, names: Sequence[str], dtypes: Sequence[str],
                                              shapes: Sequence[Sequence[int]], group_name: str,
                                              weight_version: str | None = None, flush_cache: bool = False) -> None:
        """Receive the named tensors by broadcast from rank 0 of ``group_name``; returns after the broadcast."""
        payload = {"names": list(names), "dtypes": list(dtypes), "shapes": [list(s) for s in shapes],
                   "group_name": group_name, "flush_cache": flush_cache, "abort_all_requests": False}
        await self._call("/update_weights_from_distributed", self._stamped(payload, weight_version))

    async def update_weights_from_tensor(self, serialized_named_tensors: Sequence[str],
                                         weight_version: str | None = None, flush_cache: bool = False) -> None:
        """Load tensors sent in the request body (one serialized payload per TP rank)."""
        payload = {"serialized_named_tensors": list(serialized_named_tensors), "flush_cache": flush_cache,
                   "abort_all_requests": False}
        await self._call("/update_weights_from_tensor", self._stamped(payload, weight_version))

    async def destroy_weights_update_group(self, group_name: str) -> None:
        await self._call("/destroy_weights_update_group", {"group_name": group_name})

    async def _session_call(self, endpoint: str) -> bool:
        if self.has_sessions is False:
            return False
        response = await self._request("POST", endpoint, {})
        if response.status_code == 404 and self.has_sessions is None:
            self.has_sessions = False  # pre-0.5.23: no session endpoints
            return False
        self.check_response(endpoint, response)
        self.has_sessions = True
        return True

    async def begin_weight_update(self) -> bool:
        """Open a weight-update session (0.5.23+); False when the engine has none."""
        return await self._session_call("/begin_weight_update")

    async def end_weight_update(self) -> bool:
        """Close the weight-update session; False when the engine has none."""
        return await self._session_call("/end_weight_update")

    # -- LoRA ----------------------------------------------------------------------------------------------

    async def load_lora_adapter_from_tensors(self, lora_name: str, config_dict: Mapping[str, Any],
                                             serialized_named_tensors: Sequence[str]) -> None:
        """Load an adapter from tensors in the body (the tensor field is named per release, see
        :attr:`Release.lora_tensor_field`)."""
        field = (await self.release()).lora_tensor_field
        if field is None:
            raise EngineError(self.url, "/load_lora_adapter_from_tensors", None,
                              "this SGLang release has no /load_lora_adapter_from_tensors (load from disk)")
        tensors: Any = list(serialized_named_tensors)
        if field == "serialized_tensors":  # one string before 0.5.23 (no per-TP-rank list)
            tensors = tensors[0]
        await self._call("/load_lora_adapter_from_tensors", {
            "lora_name": lora_name, "config_dict": dict(config_dict), field: tensors})

    async def load_lora_adapter(self, lora_name: str, lora_path: str | Path) -> None:
        await self._call("/load_lora_adapter", {"lora_name": lora_name, "lora_path": str(lora_path)})

    async def unload_lora_adapter(self, lora_name: str) -> None:
        """Unload an adapter; SGLang waits for the in-flight requests that use it."""
        await self._call("/unload_lora_adapter", {"lora_name": lora_name})
