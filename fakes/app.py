"""``make_app(engine)``: the ASGI app of one fake SGLang server.

Which routes exist, their methods and their body structs come from the profile's io_struct snapshot
(``structs.endpoints``), so a route a release lacks answers FastAPI's 404 ``{"detail": "Not Found"}``.
Per call: fault injection → body validation (SGLang's 400 bodies, no state change) → the engine → a
``control`` event with the exact wire payload. Fake-only debug routes live under ``/_fake/``.
"""

from __future__ import annotations

import hmac
import json
from typing import Any, Awaitable, Callable, Mapping, Protocol

from . import structs
from .asgi import (
    until_disconnect,
    HTTPRequest,
    Receive,
    Reply,
    Route,
    Router,
    Scope,
    Send,
    lifespan,
    read_body,
    request_from_scope,
    send_reply,
)
from .events import EventLog
from .failures import EngineClosed, EngineCrashed, _flush_fault, flush_fault_scope
from .faults import Fault, FaultPlan
from .profiles import Profile
from .tensors import WeightStore


class ServedEngine(Protocol):
    """What the app reads of the engine it serves (``fakes.engine.FakeEngine`` is one; the engine builds its app,
    so the app names only this, not the engine's module). The routes of ``HANDLERS`` built by ``_method`` call the
    engine's method of the same name."""

    profile: Profile
    events: EventLog
    weights: WeightStore
    faults: FaultPlan | None
    api_key: str | None
    weight_version: str
    dead: bool

    async def generate(self, obj: Any) -> Reply: ...
    async def pause_generation(self, obj: Mapping[str, Any] | None) -> Reply: ...
    async def continue_generation(self, obj: Mapping[str, Any] | None) -> Reply: ...
    async def flush_cache(self, timeout: float = 0.0) -> Reply: ...
    async def health(self) -> Reply: ...
    async def ready(self) -> Reply: ...
    def model_info(self) -> dict[str, Any]: ...
    def server_info(self) -> dict[str, Any]: ...
    def get_weight_version(self) -> Reply: ...
    def models(self, model: str | None = None) -> Reply: ...
    def snapshot(self) -> dict[str, Any]: ...
    async def step(self, n: int = 1) -> int: ...
    async def apply_fault(self, fault: Fault, endpoint: str) -> Reply | None: ...
    def dead_reply(self, endpoint: str) -> Reply: ...
    def record_control(self, endpoint: str, payload: Any, status: int, body: Any) -> None: ...
    async def aclose(self) -> None: ...


EngineHandler = Callable[[ServedEngine, HTTPRequest, Any], Awaitable[Reply]]
NOT_CONTROL = frozenset({"/generate", "/health", "/health_generate", "/ready", "/v1/models",
                         "/v1/models/{model:path}"})

_INTERNAL = frozenset({"http_worker_ipc"})  # BaseReq plumbing between SGLang's processes
# Fields SGLang accepts that the fake validates but deliberately does not act on (no GPU, one TP rank, no draft
# model, no multimodal / disaggregation / sessions); every other field of a served struct is read by the engine.
IGNORED_FIELDS: dict[str, frozenset[str]] = {
    "AbortReq": _INTERNAL | {"abort_message", "abort_reason", "finished_reason", "weight_versions"},
    "BeginWeightUpdateReqInput": _INTERNAL | {"selector"},
    "EndWeightUpdateReqInput": _INTERNAL,
    "ContinueGenerationReqInput": _INTERNAL | {"torch_empty_cache"},
    "PauseGenerationReqInput": _INTERNAL,
    "UpdateWeightVersionReqInput": _INTERNAL,
    "DestroyWeightsUpdateGroupReqInput": _INTERNAL,
    "InitWeightsUpdateGroupReqInput": _INTERNAL,
    "ReleaseMemoryOccupationReqInput": _INTERNAL,
    "ResumeMemoryOccupationReqInput": _INTERNAL,
    "GetWeightsByNameReqInput": _INTERNAL,
    "UpdateWeightFromDiskReqInput": _INTERNAL
    | {"is_async", "keep_pause", "manifest", "recapture_cuda_graph", "token_step", "torch_empty_cache"},
    "UpdateWeightsFromDistributedReqInput": _INTERNAL | {"selector", "torch_empty_cache"},
    "UpdateWeightsFromTensorReqInput": _INTERNAL | {"disable_draft_model", "selector", "torch_empty_cache"},
    "LoadLoRAAdapterReqInput": _INTERNAL | {"lora_id"},
    "UnloadLoRAAdapterReqInput": _INTERNAL | {"lora_id"},
    "LoadLoRAAdapterFromTensorsReqInput": _INTERNAL
    | {"added_tokens_config", "config_dict", "expected_checksums", "lora_id"},
    "GenerateReqInput": _INTERNAL
    | {
        # multimodal inputs
        "audio_data", "image_data", "video_data", "input_embeds", "modalities", "use_audio_in_video",
        "video_config", "images_config", "mm_hashes", "mm_content_hashes", "mm_processor_kwargs",
        "max_dynamic_patch", "min_dynamic_patch", "image_max_dynamic_patch", "video_max_dynamic_patch",
        "need_wait_for_mm_inputs", "num_items_assigned", "mm_data_mooncake", "encoder_urls",
        "multi_item_delimiter_indices", "token_indices_to_pool", "positional_embed_overrides",
        # PD disaggregation, data parallelism, routing
        "bootstrap_host", "bootstrap_port", "bootstrap_room", "bootstrap_pair_key", "decode_tp_size",
        "data_parallel_rank", "routed_dp_rank", "disagg_prefill_dp_rank", "routing_key",
        # sessions, scheduling hints, caching
        "session_id", "session_params", "conversation_id", "priority", "background", "extra_key",
        "cache_salt", "kv_hints", "received_time", "lora_id",
        # extra outputs the fake does not produce (logprobs beyond output triples, hidden states, ...)
        "logprob_start_len", "top_logprobs_num", "token_ids_logprob", "sampling_logprobs_mode",
        "return_sampling_mask", "return_flat_raw_top_logprobs", "return_flat_raw_output_top_logprobs",
        "return_flat_raw_top_logprobs_b64", "return_hidden_states", "return_routed_experts",
        "routed_experts_start_len", "return_indexer_topk", "return_prompt_token_ids", "return_bytes",
        "return_entropy", "require_reasoning", "max_thinking_tokens", "watermark", "custom_logit_processor",
        # logging / tracing
        "log_metrics", "no_logs", "custom_labels", "external_trace_header",
    },
}


# -- handlers: (engine, request, validated body or None) -> Reply --------------------------------------


async def _generate(engine: ServedEngine, req: HTTPRequest, obj: Any) -> Reply:
    return await engine.generate(obj)


async def _pause(engine: ServedEngine, req: HTTPRequest, obj: Any) -> Reply:
    return await engine.pause_generation(obj)


async def _continue(engine: ServedEngine, req: HTTPRequest, obj: Any) -> Reply:
    return await engine.continue_generation(obj)


async def _flush(engine: ServedEngine, req: HTTPRequest, obj: Any) -> Reply:
    timeout = 0.0
    if engine.profile.flush_timeout_query and "timeout" in req.query:
        raw = req.query["timeout"]
        try:
            timeout = float(raw)
        except ValueError:
            error = {
                "type": "float_parsing",
                "loc": ("query", "timeout"),
                "msg": "Input should be a valid number, unable to parse string as a number",
                "input": raw,
            }
            return Reply(400, structs.error_body(f"1 validation error:\n  {error} {[error]}"))
    return await engine.flush_cache(max(0.0, timeout))


async def _health(engine: ServedEngine, req: HTTPRequest, obj: Any) -> Reply:
    return await engine.health()


async def _ready(engine: ServedEngine, req: HTTPRequest, obj: Any) -> Reply:
    return await engine.ready()


async def _model_info(engine: ServedEngine, req: HTTPRequest, obj: Any) -> Reply:
    return Reply(200, engine.model_info())


async def _server_info(engine: ServedEngine, req: HTTPRequest, obj: Any) -> Reply:
    return Reply(200, engine.server_info())


async def _weight_version(engine: ServedEngine, req: HTTPRequest, obj: Any) -> Reply:
    return engine.get_weight_version()


async def _models(engine: ServedEngine, req: HTTPRequest, obj: Any) -> Reply:
    prefix = "/v1/models/"
    return engine.models(req.path[len(prefix):] if req.path.startswith(prefix) else None)


def _method(name: str) -> EngineHandler:
    """A handler that passes the validated body to ``engine.<name>(obj)``."""

    async def handler(engine: ServedEngine, req: HTTPRequest, obj: Any) -> Reply:
        return await getattr(engine, name)(obj)

    handler.__name__ = name
    return handler


HANDLERS: dict[str, EngineHandler] = {
    "/generate": _generate,
    "/pause_generation": _pause,
    "/continue_generation": _continue,
    "/abort_request": _method("abort_request"),
    "/update_weight_version": _method("update_weight_version"),
    "/update_weights_from_disk": _method("update_weights_from_disk"),
    "/update_weights_from_tensor": _method("update_weights_from_tensor"),
    "/update_weights_from_distributed": _method("update_weights_from_distributed"),
    "/init_weights_update_group": _method("init_weights_update_group"),
    "/destroy_weights_update_group": _method("destroy_weights_update_group"),
    "/begin_weight_update": _method("begin_weight_update"),
    "/end_weight_update": _method("end_weight_update"),
    "/load_lora_adapter": _method("load_lora_adapter"),
    "/unload_lora_adapter": _method("unload_lora_adapter"),
    "/load_lora_adapter_from_tensors": _method("load_lora_adapter_from_tensors"),
    "/get_weights_by_name": _method("get_weights_by_name"),
    "/flush_cache": _flush,
    "/health": _health,
    "/health_generate": _health,
    "/ready": _ready,
    "/model_info": _model_info,
    "/get_model_info": _model_info,
    "/server_info": _server_info,
    "/get_server_info": _server_info,
    "/get_weight_version": _weight_version,
    "/weight_version": _weight_version,
    "/release_memory_occupation": _method("release_memory_occupation"),
    "/resume_memory_occupation": _method("resume_memory_occupation"),
    "/v1/models": _models,
    "/v1/models/{model:path}": _models,
}


# -- fake-only debug routes ----------------------------------------------------------------------------


def _fake_routes(engine: ServedEngine) -> list[Route]:
    async def events(req: HTTPRequest) -> Reply:
        return Reply(200, engine.events.to_jsonl())

    async def state(req: HTTPRequest) -> Reply:
        return Reply(200, engine.snapshot())

    async def digest(req: HTTPRequest) -> Reply:
        return Reply(200, {"digest": engine.weights.digest(), "weight_version": engine.weight_version})

    async def step(req: HTTPRequest) -> Reply:
        try:
            body = json.loads(req.body) if req.body else {}
            n = body.get("n", 1) if isinstance(body, dict) else None
            if not isinstance(n, int) or isinstance(n, bool) or n < 0:
                raise ValueError(f"'n' must be a non-negative int, got {n!r}")
        except ValueError as e:
            return Reply(400, {"error": {"message": str(e)}})
        tokens = await engine.step(n)
        return Reply(200, {"steps": n, "tokens": tokens, "state": engine.snapshot()})

    return [
        Route("/_fake/events", ("GET",), events, control=False),
        Route("/_fake/state", ("GET",), state, control=False),
        Route("/_fake/digest", ("GET",), digest, control=False),
        Route("/_fake/step", ("POST",), step, control=False),
    ]


# -- the app ---------------------------------------------------------------------------------------------


def _wire_payload(raw: bytes) -> Any:
    """What the client sent: parsed JSON, else the raw text, None when empty."""
    if not raw:
        return None
    try:
        return json.loads(raw)
    except (ValueError, UnicodeDecodeError):
        return raw.decode("utf-8", errors="replace")


class FakeSGLangApp:
    """ASGI callable over one engine (a ``ServedEngine``)."""

    def __init__(self, engine: ServedEngine) -> None:
        self.engine = engine
        version = engine.profile.version
        wire = structs.endpoints(version)
        self.structs: dict[str, str | None] = {}
        routes = _fake_routes(engine)
        for path, handler in HANDLERS.items():
            if path not in wire:
                continue  # this release has no such route: 404 Not Found
            self.structs[path] = wire[path].get("struct")
            control = path not in NOT_CONTROL
            routes.append(Route(path, tuple(wire[path]["methods"]), self._bind(path, handler, control), control))
        self.router = Router(routes)

    def _bind(self, path: str, handler: EngineHandler, control: bool) -> Callable[[HTTPRequest], Awaitable[Reply]]:
        async def endpoint(req: HTTPRequest) -> Reply:
            engine = self.engine
            if engine.dead:  # the process is gone: nothing reaches it, nothing is recorded
                return engine.dead_reply(path)
            reply = await self._answer(path, handler, req)
            if control:
                engine.record_control(path, _wire_payload(req.body), reply.status, reply.body)
            return reply

        return endpoint

    async def _answer(self, path: str, handler: EngineHandler, req: HTTPRequest) -> Reply:
        engine = self.engine
        fault = engine.faults.pick(path) if engine.faults is not None else None
        if fault is not None:
            early = await engine.apply_fault(fault, path)
            if early is not None:
                return early
        struct_name = self.structs.get(path)
        obj = None
        if struct_name is not None:
            try:
                obj = structs.validate_raw(struct_name, req.body, engine.profile.version, method=req.method, path=path)
            except structs.RequestError as e:
                return Reply(e.status, e.body)
        try:
            flush_fail = fault is not None and fault.kind == "flush_fail"
            if not flush_fail and not _flush_fault.get():  # the scope would set what is already there
                return await handler(engine, req, obj)
            with flush_fault_scope(flush_fail):
                return await handler(engine, req, obj)
        except (EngineCrashed, EngineClosed):
            return engine.dead_reply(path)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await lifespan(receive, send, on_shutdown=self.engine.aclose)
            return
        if scope["type"] != "http":
            raise RuntimeError(f"fake SGLang serves HTTP only, got scope type {scope['type']!r}")
        body = await read_body(receive)
        req = request_from_scope(scope, body, receive)
        if self.engine.api_key is not None and not _authorized(scope, req.method, req.path, self.engine.api_key):
            await send_reply(send, Reply(401, {"error": "Unauthorized"}))
            return
        route = self.router.match(req.method, req.path)
        if isinstance(route, Reply):
            await send_reply(send, route)
            return
        if route.path == "/generate":
            await until_disconnect(self._serve(route, req, send), receive)
        else:
            await self._serve(route, req, send)

    @staticmethod
    async def _serve(route: Route, req: HTTPRequest, send: Send) -> None:
        await send_reply(send, await route.handler(req))


_OPEN_PREFIXES = ("/health", "/ready", "/metrics", "/_fake/")  # probes, scraping, the fake's own debug routes


def _authorized(scope: Scope, method: str, path: str, api_key: str) -> bool:
    """``--api-key`` (``utils/auth.py`` ``decide_request_auth``, an ``api_key`` alone): every route needs
    ``Authorization: Bearer <api_key>``, except OPTIONS and the health, readiness and metrics probes."""
    if method == "OPTIONS" or path.startswith(_OPEN_PREFIXES):
        return True
    header = next((v for k, v in scope.get("headers", ()) if k == b"authorization"), b"").decode("latin-1")
    scheme, _, token = header.partition(" ")
    return scheme.lower() == "bearer" and hmac.compare_digest(token, api_key)


def make_app(engine: ServedEngine) -> FakeSGLangApp:
    """The ASGI app for ``engine`` (also available as ``engine.app``)."""
    return FakeSGLangApp(engine)
