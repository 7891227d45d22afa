"""`FakeRouter`: the sglang router / sgl-model-gateway in front of fake engines (``sgl-model-gateway``), as an ASGI app.

Two flavours:

* `flavor="0.3.2"` (default) — what the real `sglang-router==0.3.2` (PyPI, `python -m
  sglang_router.launch_router`) was measured to do in front of two HTTP workers (tests/fakes/test_real_router.py
  re-measures it whenever the package is installed):
    - `/generate` (POST only): `Content-Type: application/json` required (415 text/plain otherwise); a JSON
      syntax error is 400 text/plain, a type error 422 text/plain "Failed to deserialize the JSON body into the
      target type: ..."; the body is re-serialised from a typed struct: unknown fields (and unknown
      `sampling_params` keys) are dropped, `null`s are dropped, `text`/`rid`/`lora_path` must be strings (no
      batch lists), values are typed strictly (no "true" for a bool, no 1.0 for an int), `model` (null) and
      eight boolean defaults are added; both or neither of `text`/`input_ids` are passed through unchanged.
      One worker is picked by the policy; its status, content-type and body (SSE included) pass through;
      429/500/502/503/504 and connection errors are retried on the next worker (5 attempts in all).
    - `/get_model_info` → the first healthy worker's `/get_model_info` passed through; `/model_info` → 404.
    - `/get_server_info` → 200 text/plain `{"router_manager":true,"routers_count":1,"workers_count":N}`;
      `/server_info` → 404.
    - `/health`, `/liveness` → 200 text/plain "OK"; `/health_generate` → 200 text/plain "At least one router
      has healthy workers" (not proxied); `/readiness` → `{"status":"ready","healthy_workers","total_workers"}`.
    - `GET /workers` → `{"workers":[{id,url,model_id,priority,cost,worker_type,is_healthy,load,connection_mode,
      disable_health_check}],"total","stats":{prefill_count,decode_count,regular_count}}`; `/list_workers` 404.
    - `POST /flush_cache` → fan-out: 200 `{"status":"success",...}`, 206 `{"status":"partial_success",...,
      "successful":[urls],"failed":[{"worker","error"}]}`; GET → 405.
    - Every weight-sync endpoint (`/update_weights_*`, `/update_weight_version`, `/pause_generation`,
      `/continue_generation`, `/abort_request`, `/init_weights_update_group`, `/destroy_weights_update_group`,
      `/begin_weight_update`, `/end_weight_update`, LoRA loads, `/get_weight_version`) and any other unknown
      path → 404 with an empty body. A known path with the wrong method → 405, empty body.
* `flavor="spec"` — a reading of the sgl-model-gateway source: `/model_info` and `/get_model_info` →
  the first healthy worker's `/model_info`; `/server_info`, `/get_server_info` → its `/server_info`;
  `/health_generate` → proxied; `/generate` also refuses a body with both or neither of `text`/`input_ids`
  (400); `/flush_cache` answers `{"successful","failed","total_workers","http_workers","message"}`.

Not modelled: the circuit breaker, retry backoff, cache-aware routing (`cache_aware`/`power_of_two` fall back
to round robin), periodic health checks (health is set by `set_worker_health` or learned from connection
errors), the exact `line/column` in serde error messages (omitted), worker discovery calls at start-up.

Fault injection as data: `faults=FaultPlan(...)` applies `latency`, `error`, `hang` and `crash` to router
paths, `flush_fail` to `/flush_cache` (every worker reported failed).
"""

from __future__ import annotations

import asyncio
import json
import random
import uuid
from collections.abc import Sequence
from typing import Any

from .asgi import lifespan, read_body
from .faults import FaultPlan

ROUTER_FLAVORS = ("0.3.2", "spec")
RETRY_STATUSES = frozenset({429, 500, 502, 503, 504})
MAX_ATTEMPTS = 5

# Weight-sync endpoints: never routed (404), read in the sgl-model-gateway source and measured on 0.3.2.
WEIGHT_SYNC_PATHS = (
    "/update_weights_from_disk",
    "/update_weights_from_tensor",
    "/update_weights_from_distributed",
    "/update_weights_from_ipc",
    "/update_weight_version",
    "/pause_generation",
    "/continue_generation",
    "/abort_request",
    "/init_weights_update_group",
    "/destroy_weights_update_group",
    "/begin_weight_update",
    "/end_weight_update",
    "/load_lora_adapter",
    "/unload_lora_adapter",
    "/load_lora_adapter_from_tensors",
    "/get_weight_version",
    "/weight_version",
)

# The router's typed `GenerateRequest`, in serialisation order (measured on 0.3.2): field -> (kind, default).
# kind: "str" "bool" "i32" "u32" "list[u32]" "list[str]" "map" "any" "sampling"; default: a value added when the
# field is absent, `_ABSENT` when an absent/null field is left out.
_ABSENT = object()
GENERATE_FIELDS: dict[str, tuple[str, Any]] = {
    "text": ("str", _ABSENT),
    "model": ("str", None),  # always serialised, null unless given
    "input_ids": ("input_ids", _ABSENT),
    "input_embeds": ("any", _ABSENT),
    "image_data": ("any", _ABSENT),
    "video_data": ("any", _ABSENT),
    "audio_data": ("any", _ABSENT),
    "sampling_params": ("sampling", _ABSENT),
    "return_logprob": ("bool", _ABSENT),
    "logprob_start_len": ("i32", _ABSENT),
    "top_logprobs_num": ("i32", _ABSENT),
    "token_ids_logprob": ("list[u32]", _ABSENT),
    "return_text_in_logprobs": ("bool!", False),
    "stream": ("bool!", False),
    "log_metrics": ("bool!", True),
    "return_hidden_states": ("bool!", False),
    "modalities": ("list[str]", _ABSENT),
    "session_params": ("map", _ABSENT),
    "lora_path": ("str", _ABSENT),
    "lora_id": ("str", _ABSENT),
    "custom_logit_processor": ("str", _ABSENT),
    "bootstrap_host": ("str", _ABSENT),
    "bootstrap_port": ("i32", _ABSENT),
    "bootstrap_room": ("i32", _ABSENT),
    "bootstrap_pair_key": ("str", _ABSENT),
    "data_parallel_rank": ("i32", _ABSENT),
    "background": ("bool!", False),
    "conversation_id": ("str", _ABSENT),
    "priority": ("i32", _ABSENT),
    "extra_key": ("str", _ABSENT),
    "no_logs": ("bool!", False),
    "custom_labels": ("map", _ABSENT),
    "return_bytes": ("bool!", False),
    "return_entropy": ("bool!", False),
    "rid": ("str", _ABSENT),
}
# `sampling_params` keys the router keeps (others are dropped), measured on 0.3.2; integer widths where not
# measured are a guess (max_new_tokens is u32: -1 is refused; top_k is i32: -1 passes).
SAMPLING_FIELDS: dict[str, str] = {
    "max_new_tokens": "u32",
    "stop": "str|list[str]",
    "stop_token_ids": "list[u32]",
    "temperature": "f32",
    "top_p": "f32",
    "top_k": "i32",
    "min_p": "f32",
    "frequency_penalty": "f32",
    "presence_penalty": "f32",
    "repetition_penalty": "f32",
    "min_new_tokens": "u32",
    "n": "u32",
    "json_schema": "str",
    "regex": "str",
    "ebnf": "str",
    "ignore_eos": "bool",
    "skip_special_tokens": "bool",
    "no_stop_trim": "bool",
    "sampling_seed": "u64",
}
_INT_RANGES = {"i32": (-(2**31), 2**31 - 1), "u32": (0, 2**32 - 1), "u64": (0, 2**64 - 1)}
_EXPECTED = {"str": "a string", "bool": "a boolean", "bool!": "a boolean", "map": "a map", "i32": "i32",
             "u32": "u32", "u64": "u64", "f32": "f32"}


class _Refusal(Exception):
    def __init__(self, status: int, text: str) -> None:
        super().__init__(text)
        self.status = status
        self.text = text


def _unexpected(value: Any) -> str:
    """serde_json's `Unexpected` wording for a JSON value."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return f"boolean `{str(value).lower()}`"
    if isinstance(value, int):
        return f"integer `{value}`"
    if isinstance(value, float):
        return f"floating point `{value!r}`"
    if isinstance(value, str):
        return f"string {json.dumps(value)}"
    if isinstance(value, list):
        return "sequence"
    return "map"


def _type_error(path: str, value: Any, expected: str) -> _Refusal:
    prefix = f"{path}: " if path else ""
    return _Refusal(422, f"Failed to deserialize the JSON body into the target type: {prefix}invalid type: "
                         f"{_unexpected(value)}, expected {expected}")


def _check_scalar(kind: str, value: Any, path: str) -> Any:
    if kind in ("str",):
        if not isinstance(value, str):
            raise _type_error(path, value, "a string")
        return value
    if kind in ("bool", "bool!"):
        if not isinstance(value, bool):
            raise _type_error(path, value, "a boolean")
        return value
    if kind in _INT_RANGES:
        if isinstance(value, bool) or not isinstance(value, int):
            raise _type_error(path, value, kind)
        lo, hi = _INT_RANGES[kind]
        if not lo <= value <= hi:
            raise _Refusal(422, f"Failed to deserialize the JSON body into the target type: {path}: invalid value: "
                                f"integer `{value}`, expected {kind}")
        return value
    if kind == "f32":
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise _type_error(path, value, "f32")
        return float(value)
    if kind == "map":
        if not isinstance(value, dict):
            raise _type_error(path, value, "a map")
        return value
    if kind.startswith("list["):
        item_kind = kind[5:-1]
        if not isinstance(value, list):
            raise _type_error(path, value, "a sequence")
        return [_check_scalar(item_kind, v, f"{path}[{i}]") for i, v in enumerate(value)]
    if kind == "str|list[str]":
        if isinstance(value, str):
            return value
        if isinstance(value, list) and all(isinstance(v, str) for v in value):
            return value
        raise _Refusal(422, f"Failed to deserialize the JSON body into the target type: {path}: data did not match "
                            "any variant of untagged enum StringOrArray")
    if kind == "input_ids":
        flat = isinstance(value, list) and all(isinstance(v, int) and not isinstance(v, bool) for v in value)
        nested = isinstance(value, list) and all(
            isinstance(row, list) and all(isinstance(v, int) and not isinstance(v, bool) for v in row) for row in value)
        if not (flat or nested):
            raise _Refusal(422, f"Failed to deserialize the JSON body into the target type: {path}: data did not match "
                                "any variant of untagged enum InputIds")
        return value
    return value  # "any"


def normalise_generate(body: Any, flavor: str = "0.3.2") -> dict[str, Any]:
    """The JSON body the router sends to the worker for a client's `/generate` body (raises `_Refusal`)."""
    if not isinstance(body, dict):
        if isinstance(body, list):  # serde tries the struct as a sequence of its fields: first one is `text`
            first = body[0] if body else None
            if body and not isinstance(first, str):
                raise _type_error("[0]", first, "a string")
        raise _type_error("", body, "struct GenerateRequest")
    out: dict[str, Any] = {}
    for name, (kind, default) in GENERATE_FIELDS.items():
        value = body.get(name, None)
        if value is None:
            if name in body and kind == "bool!":
                raise _type_error(name, None, "a boolean")
            if default is not _ABSENT:
                out[name] = default
            continue
        if kind == "sampling":
            if not isinstance(value, dict):
                raise _type_error(name, value, "a map")
            kept = {}
            for key, item in value.items():
                if key in SAMPLING_FIELDS and item is not None:
                    kept[key] = _check_scalar(SAMPLING_FIELDS[key], item, f"{name}.{key}")
            out[name] = kept
        else:
            out[name] = _check_scalar(kind, value, name)
    if flavor == "spec" and (("text" in out) == ("input_ids" in out)):
        raise _Refusal(400, "Exactly one of text or input_ids must be provided")
    return out


class FakeRouter:
    """An sglang router in front of `worker_urls`; `.app` is the ASGI app (the instance itself).

    `client`: the `httpx.AsyncClient` used to reach workers (default: one created on first use in the serving
    loop). `FakeRouter.for_apps({url: asgi_app})` routes to in-process apps without sockets.
    """

    def __init__(
        self,
        worker_urls: Sequence[str],
        policy: str = "round_robin",
        client: Any = None,
        *,
        flavor: str = "0.3.2",
        faults: FaultPlan | None = None,
        max_attempts: int = MAX_ATTEMPTS,
        seed: int = 0,
        request_timeout: float | None = None,
    ) -> None:
        if flavor not in ROUTER_FLAVORS:
            raise ValueError(f"flavor must be one of {ROUTER_FLAVORS}, not {flavor!r}")
        if policy not in {"round_robin", "random", "cache_aware", "power_of_two", "manual"}:
            raise ValueError(f"unknown policy {policy!r}")
        self.worker_urls = [u.rstrip("/") for u in worker_urls]
        self.policy = policy
        self.flavor = flavor
        self.faults = faults
        self.max_attempts = max_attempts
        self.request_timeout = request_timeout
        self._client = client
        self._own_client = client is None
        self._rng = random.Random(seed)
        self._next = 0
        self.healthy: dict[str, bool] = {u: True for u in self.worker_urls}
        self.worker_ids = {u: str(uuid.UUID(int=self._rng.getrandbits(128), version=4)) for u in self.worker_urls}
        self.crashed = False
        self._closed: asyncio.Event | None = None
        self.forwarded: list[tuple[str, str, dict[str, Any] | None]] = []  # (worker, path, body) log

    @property
    def app(self) -> FakeRouter:
        return self

    @classmethod
    def for_apps(cls, apps: dict[str, Any], **kwargs: Any) -> FakeRouter:
        """A router whose workers are in-process ASGI apps keyed by base URL (httpx mounts, no sockets)."""
        import httpx

        mounts = {url.rstrip("/"): httpx.ASGITransport(app=app) for url, app in apps.items()}
        client = httpx.AsyncClient(mounts={f"{u}": t for u, t in mounts.items()}, timeout=None)
        router = cls(list(apps), client=client, **kwargs)
        router._own_client = True
        return router

    # ------------------------------------------------------------------------------------------ workers

    def set_worker_health(self, url: str, healthy: bool) -> None:
        self.healthy[url.rstrip("/")] = healthy

    def _healthy_workers(self) -> list[str]:
        return [u for u in self.worker_urls if self.healthy.get(u, False)]

    def pick_worker(self, exclude: Sequence[str] = ()) -> str | None:
        """The next worker by policy among the healthy ones (round robin over the whole list, skipping)."""
        candidates = [u for u in self._healthy_workers() if u not in exclude] or self._healthy_workers()
        if not candidates:
            return None
        if self.policy == "random":
            return self._rng.choice(candidates)
        for _ in range(len(self.worker_urls)):
            url = self.worker_urls[self._next % len(self.worker_urls)]
            self._next += 1
            if url in candidates:
                return url
        return candidates[0]

    def _get_client(self) -> Any:
        if self._client is None:
            import httpx

            self._client = httpx.AsyncClient(timeout=self.request_timeout)
        return self._client

    async def aclose(self) -> None:
        if self._closed is not None:
            self._closed.set()
        if self._client is not None and self._own_client:
            await self._client.aclose()
            self._client = None

    # ------------------------------------------------------------------------------------------ ASGI

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            await self._lifespan(receive, send)
            return
        if scope["type"] != "http":
            return
        if self._closed is None:
            self._closed = asyncio.Event()
        if self.crashed:
            raise RuntimeError("fake router crashed (injected fault)")
        method, path = scope["method"], scope["path"]
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers", [])}
        body = await read_body(receive)
        fault = self.faults.pick(path) if self.faults is not None else None
        if fault is not None:
            if fault.kind == "latency":
                await asyncio.sleep(fault.latency_s)
            elif fault.kind == "error":
                await _send_json(send, fault.error_status, fault.error_body)
                return
            elif fault.kind == "hang":
                await self._closed.wait()
                return
            elif fault.kind == "crash":
                self.crashed = True
                raise RuntimeError("fake router crashed (injected fault)")
        await self._dispatch(method, path, headers, body, scope, send, fault)

    async def _lifespan(self, receive: Any, send: Any) -> None:
        await lifespan(receive, send, self.aclose)

    async def _dispatch(self, method: str, path: str, headers: dict[str, str], body: bytes, scope: dict[str, Any],
                        send: Any, fault: Any) -> None:
        spec = self.flavor == "spec"
        routes: dict[str, tuple[tuple[str, ...], Any]] = {
            "/generate": (("POST",), self._generate),
            "/health": (("GET",), self._liveness),
            "/liveness": (("GET",), self._liveness),
            "/readiness": (("GET",), self._readiness),
            "/health_generate": (("GET",), self._health_generate),
            "/get_model_info": (("GET",), self._model_info),
            "/get_server_info": (("GET",), self._server_info),
            "/workers": (("GET",), self._workers),
            "/flush_cache": (("POST",), self._flush_cache),
            "/v1/models": (("GET",), self._models),
            "/get_loads": (("GET",), self._loads),
        }
        if spec:
            routes["/model_info"] = routes["/get_model_info"]
            routes["/server_info"] = routes["/get_server_info"]
        route = routes.get(path)
        if route is None:
            await _send_empty(send, 404)
            return
        methods, handler = route
        if method not in methods and not (method == "HEAD" and "GET" in methods):
            await _send_empty(send, 405)
            return
        await handler(method=method, path=path, headers=headers, body=body, send=send, fault=fault)

    # ------------------------------------------------------------------------------------------ handlers

    async def _liveness(self, send: Any, **_: Any) -> None:
        await _send_text(send, 200, "OK")

    async def _readiness(self, send: Any, **_: Any) -> None:
        healthy, total = len(self._healthy_workers()), len(self.worker_urls)
        status = 200 if healthy else 503
        await _send_json(send, status, {"status": "ready" if healthy else "not ready", "healthy_workers": healthy,
                                        "total_workers": total})

    async def _health_generate(self, send: Any, **kw: Any) -> None:
        if self.flavor == "spec":
            await self._proxy_first_healthy("/health_generate", send)
            return
        if self._healthy_workers():
            await _send_text(send, 200, "At least one router has healthy workers")
        else:
            await _send_text(send, 503, "No routers with healthy workers available")  # UNCONFIRMED wording

    async def _model_info(self, send: Any, path: str, **_: Any) -> None:
        await self._proxy_first_healthy("/model_info" if self.flavor == "spec" else "/get_model_info", send)

    async def _server_info(self, send: Any, **_: Any) -> None:
        if self.flavor == "spec":
            await self._proxy_first_healthy("/server_info", send)
            return
        text = json.dumps({"router_manager": True, "routers_count": 1, "workers_count": len(self.worker_urls)},
                          separators=(",", ":"))
        await _send_text(send, 200, text)

    async def _workers(self, send: Any, **_: Any) -> None:
        workers = [
            {"id": self.worker_ids[u], "url": u, "model_id": "unknown", "priority": 50, "cost": 1.0,
             "worker_type": "regular", "is_healthy": self.healthy.get(u, False), "load": 0, "connection_mode": "HTTP",
             "disable_health_check": False}
            for u in self.worker_urls
        ]
        await _send_json(send, 200, {"workers": workers, "total": len(workers),
                                     "stats": {"prefill_count": 0, "decode_count": 0, "regular_count": len(workers)}})

    async def _models(self, send: Any, **_: Any) -> None:
        await _send_json(send, 200, {"object": "list", "data": [{"id": "unknown", "object": "model",
                                                                 "owned_by": "local"}]})

    async def _loads(self, send: Any, **_: Any) -> None:
        await _send_json(send, 200, {"workers": [{"worker": u, "load": -1} for u in self.worker_urls]})

    async def _flush_cache(self, send: Any, fault: Any, **_: Any) -> None:
        client = self._get_client()

        async def one(url: str) -> tuple[str, str | None]:
            if fault is not None and fault.kind == "flush_fail":
                return url, "HTTP 400 Bad Request"
            try:
                resp = await client.post(url + "/flush_cache")
            except Exception as e:  # noqa: BLE001 - any transport error is a failed worker
                return url, f"error sending request for url ({url}/flush_cache)" if _is_connect_error(e) else str(e)
            if resp.status_code >= 400:
                return url, f"HTTP {resp.status_code} {_reason(resp.status_code)}"
            return url, None

        results = await asyncio.gather(*(one(u) for u in self.worker_urls))
        ok = [u for u, err in results if err is None]
        failed = [{"worker": u, "error": err} for u, err in results if err is not None]
        total = len(self.worker_urls)
        if self.flavor == "spec":
            await _send_json(send, 200 if not failed else 500, {
                "successful": ok, "failed": [[f["worker"], f["error"]] for f in failed], "total_workers": total,
                "http_workers": total, "message": f"Cache flushed on {len(ok)} of {total} HTTP workers"})
            return
        if not failed:
            await _send_json(send, 200, {"status": "success",
                                         "message": f"Successfully flushed cache on all {total} HTTP workers",
                                         "workers_flushed": total, "total_http_workers": total, "total_workers": total})
            return
        status, label = (206, "partial_success") if ok else (500, "failed")  # all-failed shape: UNCONFIRMED
        await _send_json(send, status, {
            "status": label, "message": f"Cache flush: {len(ok)} succeeded, {len(failed)} failed",
            "workers_flushed": len(ok), "total_http_workers": total, "total_workers": total,
            "successful": ok, "failed": failed})

    async def _proxy_first_healthy(self, worker_path: str, send: Any) -> None:
        healthy = self._healthy_workers()
        if not healthy:
            await _send_json(send, 503, _no_workers_body())
            return
        client = self._get_client()
        try:
            resp = await client.get(healthy[0] + worker_path)
        except Exception as e:  # noqa: BLE001
            await _send_text(send, 502, f"Failed to send request to worker: {e}")
            return
        await _send_raw(send, resp.status_code, resp.headers.get("content-type"), resp.content)

    async def _generate(self, send: Any, headers: dict[str, str], body: bytes, **_: Any) -> None:
        content_type = headers.get("content-type", "").split(";")[0].strip().lower()
        if content_type != "application/json" and not content_type.endswith("+json"):
            await _send_text(send, 415, "Expected request with `Content-Type: application/json`")
            return
        try:
            parsed = json.loads(body) if body else None
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            await _send_text(send, 400, f"Failed to parse the request body as JSON: {getattr(e, 'msg', e)}")
            return
        if parsed is None and not body:
            await _send_text(send, 400, "Failed to parse the request body as JSON: EOF while parsing a value")
            return
        try:
            forwarded = normalise_generate(parsed, self.flavor)
        except _Refusal as refusal:
            await _send_text(send, refusal.status, refusal.text)
            return
        request_id = headers.get("x-request-id") or f"gnt-{uuid.UUID(int=self._rng.getrandbits(128)).hex[:24]}"
        await self._forward_generate(forwarded, request_id, send)

    async def _forward_generate(self, forwarded: dict[str, Any], request_id: str, send: Any) -> None:
        client = self._get_client()
        payload = json.dumps(forwarded, separators=(",", ":")).encode()
        tried: list[str] = []
        last: tuple[int, str | None, bytes] | None = None
        for _attempt in range(self.max_attempts):
            worker = self.pick_worker(exclude=tried)
            if worker is None:
                break
            tried.append(worker)
            self.forwarded.append((worker, "/generate", forwarded))
            request = client.build_request("POST", worker + "/generate", content=payload,
                                           headers={"content-type": "application/json", "x-request-id": request_id})
            try:
                resp = await client.send(request, stream=True)
            except Exception as e:  # noqa: BLE001 - connection refused / reset: next worker
                if _is_connect_error(e):
                    self.healthy[worker] = False
                last = (503, "application/json", json.dumps(_no_workers_body()).encode())
                continue
            if resp.status_code in RETRY_STATUSES and _attempt + 1 < self.max_attempts:
                last = (resp.status_code, resp.headers.get("content-type"), await resp.aread())
                await resp.aclose()
                continue
            await _stream_through(send, resp, request_id)
            return
        if last is None:
            last = (503, "application/json", json.dumps(_no_workers_body()).encode())
        await _send_raw(send, last[0], last[1], last[2], extra_headers=[(b"x-request-id", request_id.encode())])


# ------------------------------------------------------------------------------------------------ helpers


def _no_workers_body() -> dict[str, Any]:
    return {"error": {"type": "Service Unavailable", "code": "no_available_workers",
                      "message": "No available workers (all circuits open or unhealthy)"}}


def _is_connect_error(exc: BaseException) -> bool:
    try:
        import httpx
    except ImportError:  # pragma: no cover
        return False
    return isinstance(exc, httpx.ConnectError | httpx.RemoteProtocolError | httpx.ReadError)


def _reason(status: int) -> str:
    from http import HTTPStatus

    try:
        return HTTPStatus(status).phrase
    except ValueError:
        return ""


async def _stream_through(send: Any, resp: Any, request_id: str) -> None:
    headers = [(b"x-request-id", request_id.encode())]
    content_type = resp.headers.get("content-type")
    if content_type:
        headers.append((b"content-type", content_type.encode("latin-1")))
    await send({"type": "http.response.start", "status": resp.status_code, "headers": headers})
    try:
        async for chunk in resp.aiter_raw():
            if chunk:
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
    finally:
        await resp.aclose()
    await send({"type": "http.response.body", "body": b"", "more_body": False})


async def _send_raw(send: Any, status: int, content_type: str | None, payload: bytes,
                    extra_headers: list[tuple[bytes, bytes]] | None = None) -> None:
    headers = [(b"content-length", str(len(payload)).encode())] + list(extra_headers or [])
    if content_type:
        headers.append((b"content-type", content_type.encode("latin-1")))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": payload, "more_body": False})


async def _send_json(send: Any, status: int, obj: Any) -> None:
    await _send_raw(send, status, "application/json", json.dumps(obj, separators=(",", ":")).encode())


async def _send_text(send: Any, status: int, text: str) -> None:
    await _send_raw(send, status, "text/plain; charset=utf-8", text.encode())


async def _send_empty(send: Any, status: int) -> None:
    await _send_raw(send, status, None, b"")


__all__ = ["FakeRouter", "GENERATE_FIELDS", "SAMPLING_FIELDS", "WEIGHT_SYNC_PATHS", "normalise_generate",
           "ROUTER_FLAVORS"]
