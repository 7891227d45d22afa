"""``make_app(engine)``: the ASGI app of one fake vLLM server (``VLLM_SERVER_DEV_MODE=1``, runtime LoRA on).

Routes, bodies and answers of vLLM 0.32.0: the RL router (``vllm/entrypoints/rl/online/api_router.py``), the dev
routes (``entrypoints/serve/dev``), the LoRA router (``entrypoints/serve/lora``), the OpenAI completion route and the
token-in/token-out generate route (``entrypoints/scale_out/token_in_token_out``, 403 without
``--enable-scale-out``). A body or query FastAPI rejects answers vLLM's 400 (``exception_handling/handlers/
validation.py``: ``{"error": {"message": "N validation error(s): ...", "type": "Bad Request", ...}}``), changing
nothing; an unknown route FastAPI's 404 ``{"detail": "Not Found"}``.
"""

from __future__ import annotations

import json
from typing import Any, AsyncIterator, Awaitable, Callable
from urllib.parse import parse_qs

from ..asgi import (
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
    until_disconnect,
)
from ..facts import VLLM
from ..failures import EngineClosed, EngineCrashed
from .logprobs import (completion_logprobs, completion_request_error, fractional, generate_logprobs, over_limit,
                       sampling_params_error)
from .errors import answer, error_reply, worker_failed

FakeVLLMEngine = Any
"""The engine served (``fakes.vllm.engine.FakeVLLMEngine``, which builds its app: named, not imported, here)."""
Handler = Callable[[FakeVLLMEngine, HTTPRequest], Awaitable[Reply]]


class Invalid(ValueError):
    """A body or query FastAPI's validation rejects: ``loc`` and pydantic's message (one error, after ``preceding``
    ones: ``(kind, loc, msg, given, ctx)``)."""

    def __init__(self, loc: tuple[Any, ...], msg: str, kind: str, given: Any = None,
                 ctx: dict[str, Any] | None = None,
                 preceding: tuple[tuple[str, tuple[Any, ...], str, Any, dict[str, Any] | None], ...] = ()) -> None:
        super().__init__(msg)
        self.loc, self.msg, self.kind, self.given = loc, msg, kind, given
        self.errors = [*preceding, (kind, loc, msg, given, ctx)]

    def reply(self) -> Reply:
        """``validation_exception_handler`` (``serve/exception_handling/handlers/validation.py``, 0.32.0): each error
        with its ``loc`` joined (``clean_loc_for_param``) and its ``input`` summarised (``_summarize_error_input``);
        ``param`` the first error's joined ``loc``."""
        rendered = []
        for kind, loc, msg, given, ctx in self.errors:
            error: dict[str, Any] = {"type": kind, "loc": ".".join(str(p) for p in loc), "msg": msg,
                                     "input": _summarised(given)}
            if ctx is not None:
                error["ctx"] = ctx
            rendered.append(f"  {error}")
        count = len(rendered)
        return error_reply(400, f"{count} validation {'error' if count == 1 else 'errors'}:\n" + "\n".join(rendered),
                           "Bad Request", ".".join(str(p) for p in self.errors[0][1]))


def _summarised(value: Any) -> str:
    """``_summarize_error_input``: a container as ``<list of N items>``, anything else as its text (200 characters)."""
    if isinstance(value, (list, tuple, set, frozenset, dict)):
        return f"<{type(value).__name__} of {len(value)} items>"
    text = value if isinstance(value, str) else str(value)
    return text[:200] + "...[truncated]" if len(text) > 200 else text


def _json(req: HTTPRequest) -> Any:
    """The JSON body (FastAPI: an empty body is no body)."""
    if not req.body:
        return None
    try:
        return json.loads(req.body)
    except ValueError:
        raise Invalid(("body",), "JSON decode error", "json_invalid") from None


def _field(body: Any, name: str, kind: type | tuple[type, ...], required: bool = True, default: Any = None) -> Any:
    """A ``Body(embed=True)`` field: present and of ``kind`` (str, bool...), else pydantic's error."""
    if not isinstance(body, dict) or name not in body:
        if required:
            raise Invalid(("body", name), "Field required", "missing", body)
        return default
    value = body[name]
    if kind is str and not isinstance(value, str):
        raise Invalid(("body", name), "Input should be a valid string", "string_type", value)
    if kind is bool and not isinstance(value, bool):
        raise Invalid(("body", name), "Input should be a valid boolean", "bool_type", value)
    return value


def _literal(value: str, allowed: tuple[str, ...], loc: tuple[str, ...]) -> str:
    if value not in allowed:
        quoted = ", ".join(f"'{a}'" for a in allowed[:-1]) + f" or '{allowed[-1]}'"
        raise Invalid(loc, f"Input should be {quoted}", "literal_error", value)
    return value


def _bool_query(req: HTTPRequest, name: str, default: bool) -> bool:
    raw = req.query.get(name)
    if raw is None:
        return default
    if raw.lower() in ("true", "1", "yes", "on"):
        return True
    if raw.lower() in ("false", "0", "no", "off"):
        return False
    raise Invalid(("query", name), "Input should be a valid boolean, unable to interpret input", "bool_parsing", raw)


# -- handlers ----------------------------------------------------------------------------------------------------------

async def _pause(e: FakeVLLMEngine, req: HTTPRequest) -> Reply:
    mode = _literal(req.query.get("mode", VLLM.fact("pause_default_mode", e.release)),
                    VLLM.fact("pause_modes", e.release), ("query", "mode"))
    return await e.pause(mode, _bool_query(req, "clear_cache", True))


async def _abort_requests(e: FakeVLLMEngine, req: HTTPRequest) -> Reply:
    try:
        body = json.loads(req.body)
    except ValueError:
        return answer("invalid_json")
    if not isinstance(body, dict):
        return error_reply(400, "Request body must be a JSON object")
    return e.abort_requests(body.get("request_ids"))


async def _update_weight_version(e: FakeVLLMEngine, req: HTTPRequest) -> Reply:
    return e.update_weight_version(_field(_json(req), "new_version", str))


async def _collective_rpc(e: FakeVLLMEngine, req: HTTPRequest) -> Reply:
    try:
        body = json.loads(req.body)
    except ValueError as err:
        return error_reply(400, f"JSON decode error: {err}")
    if not isinstance(body, dict):
        return error_reply(400, "Request body must be a JSON object")
    method = body.get("method")
    if method is None:
        return answer("missing_rpc_method")
    if method != "reload_weights":
        return worker_failed("collective_rpc", f"'Worker' object has no attribute '{method}'")
    kwargs = body.get("kwargs") or {}
    return e.reload_weights(kwargs.get("weights_path") if isinstance(kwargs, dict) else None)


async def _weight_transfer(e: FakeVLLMEngine, req: HTTPRequest) -> Reply:
    """init/start/update/finish/shutdown of vLLM's native weight transfer (:mod:`fakes.vllm.weight_transfer`): the
    body validated as FastAPI does, then the worker's session rules. Without ``--weight-transfer-config`` every call
    but shutdown answers 500 (fact ``weight_transfer_needs_config``); a finish that fails publishes no version."""
    body = _json(req)
    if req.path == "/init_weight_transfer_engine":
        _field(body, "init_info", dict)
    elif req.path == "/update_weights":
        _field(body, "update_info", dict)
    elif req.path == "/finish_weight_update":
        _field(body, "weight_version", str, required=False)
    return await e.weight_transfer.call(req.path, body)


async def _weight_checker(e: FakeVLLMEngine, req: HTTPRequest) -> Reply:
    body = _json(req)
    action = _literal(_field(body, "action", str), ("checksum", "reset", "compare"), ("body", "action"))
    baseline = _field(body, "baseline", dict, required=False)
    if action == "reset":
        return Reply(200, {"status": "reset"})
    if action == "compare" and baseline is None:
        return answer("compare_needs_baseline")
    if e.weights_gone:  # the parameters a failed reload left on the meta device (measured on 0.32.0)
        return worker_failed("compute_weight_checksums", "Cannot copy out of meta tensor; no data!")
    checksums = e.checksums()
    if action == "checksum":
        return Reply(200, {"checksums": checksums})
    mismatches = sorted(k for k in checksums.keys() | baseline.keys() if checksums.get(k) != baseline.get(k))
    return Reply(200, {"match": not mismatches, "mismatches": mismatches})


async def _sleep(e: FakeVLLMEngine, req: HTTPRequest) -> Reply:
    raw = req.query.get("level", "1")
    if not raw.lstrip("-").isdigit() or not 0 <= int(raw) <= 2:
        raise Invalid(("query", "level"), "Input should be less than or equal to 2", "less_than_equal", raw)
    mode = _literal(req.query.get("mode", VLLM.fact("pause_default_mode", e.release)),
                    VLLM.fact("pause_modes", e.release), ("query", "mode"))
    return await e.sleep(int(raw), mode)


async def _wake_up(e: FakeVLLMEngine, req: HTTPRequest) -> Reply:
    tags = parse_qs(req.raw_query, keep_blank_values=True).get("tags")  # query_params.getlist("tags"); [] → None
    return e.wake_up(tags or None)


async def _load_lora(e: FakeVLLMEngine, req: HTTPRequest) -> Reply:
    body = _json(req)
    return e.load_lora(_field(body, "lora_name", str), _field(body, "lora_path", str),
                       bool(_field(body, "load_inplace", bool, required=False, default=False)))


async def _unload_lora(e: FakeVLLMEngine, req: HTTPRequest) -> Reply:
    return e.unload_lora(_field(_json(req), "lora_name", str))


def _sampling(body: dict[str, Any]) -> dict[str, Any]:
    return {k: body[k] for k in ("max_tokens", "temperature", "ignore_eos", "stop_token_ids") if k in body}


def _completion_logprobs(body: dict[str, Any]) -> int | None:
    """``CompletionRequest.logprobs``, checked as vLLM parses the body (:mod:`fakes.vllm.logprobs`)."""
    value = body.get("logprobs")
    refused = completion_request_error(value)
    if refused is not None:
        raise _Refused(refused)
    if fractional(value):
        raise Invalid(("body", "logprobs"), "Input should be a valid integer, got a number with a fractional part",
                      "int_from_float", value)
    return None if value is None else int(value)


def _sampling_logprobs(sampling: dict[str, Any]) -> int | None:
    """``sampling_params.logprobs`` of ``/inference/v1/generate``, as pydantic builds ``SamplingParams`` from the
    dict: a value no lax ``int`` takes fails both arms (not an instance, and the dict's field), then
    ``SamplingParams._verify_args`` refuses a negative one."""
    value = sampling.get("logprobs")
    if isinstance(value, str):
        try:
            value = int(value.strip())
        except ValueError:
            _bad_sampling(sampling, "int_parsing", "Input should be a valid integer, unable to parse string as an "
                          "integer", value)
    elif fractional(value):
        _bad_sampling(sampling, "int_from_float", "Input should be a valid integer, got a number with a fractional "
                      "part", value)
    elif value is not None and not isinstance(value, (int, float)):
        _bad_sampling(sampling, "int_type", "Input should be a valid integer", value)
    refused = sampling_params_error(value)
    if refused is not None:
        raise _Refused(refused)
    return None if value is None else int(value)


def _bad_sampling(sampling: dict[str, Any], kind: str, msg: str, value: Any) -> None:
    """The two errors pydantic reports for a ``sampling_params`` field (measured on 0.32.0: the ``is_instance_of``
    arm first, ``param`` ``body.sampling_params``)."""
    raise Invalid(("body", "sampling_params", "logprobs"), msg, kind, value, preceding=(
        ("is_instance_of", ("body", "sampling_params"), "Input should be an instance of SamplingParams", sampling,
         {"class": "SamplingParams"}),))


class _Refused(Exception):
    """A request refused with ``reply`` before anything runs."""

    def __init__(self, reply: Reply) -> None:
        super().__init__(reply.status)
        self.reply = reply


async def _error_event(reply: Reply) -> AsyncIterator[Any]:
    """A streamed request the engine refused once its 200 was sent: the error body as the one event."""
    yield reply.body


async def _completions(e: FakeVLLMEngine, req: HTTPRequest) -> Reply:
    """``/v1/completions`` with a prompt of token ids (or text, the fake's byte tokenizer), ``n`` = 1."""
    body = _json(req)
    if not isinstance(body, dict):
        raise Invalid(("body",), "Input should be a valid dictionary or object to extract fields from",
                      "model_attributes_type", body)
    try:
        logprobs, salt = _completion_logprobs(body), _cache_salt(body)
    except _Refused as refused:
        return refused.reply
    wrong = e.check_model(body.get("model"))
    if wrong is not None:
        return wrong
    prompt = body.get("prompt")
    if isinstance(prompt, list) and prompt and isinstance(prompt[0], list):
        prompt = prompt[0]
    if isinstance(prompt, str):
        prompt = e.encode(prompt)
    if not prompt:
        return answer("no_prompt", param="prompt")
    stream = bool(body.get("stream"))
    rank = _dp_rank(req)
    refused = over_limit(logprobs, e.vocab_size, e.max_logprobs) or e.refuses_rank(rank)
    if refused is not None:
        return Reply(200, stream=_error_event(refused)) if stream else refused
    lora = body.get("model") if body.get("model") in e.adapters else None
    rid = _request_id(e, req, body)
    request, call = e.submit(prompt, _sampling(body), f"{rid}-0", lora, stream, salt, rank)
    ids = bool(body.get("return_token_ids"))
    model = body.get("model") or e.served_model_name
    if stream:
        return Reply(200, stream=_completion_stream(e, request, call, rid, model, ids, logprobs))
    out = await e.finished(request, call)
    output = list(out.output_ids)
    return Reply(200, {
        "id": rid, "object": "text_completion", "created": e.now(), "model": model,
        "choices": [{"index": 0, "text": e.text(output),
                     "logprobs": None if logprobs is None else completion_logprobs(output, logprobs, e.vocab_size,
                                                                                      e.text),
                     "finish_reason": e.finish_reason(out), "stop_reason": e.stop_reason(out),
                     "token_ids": output if ids else None, "prompt_logprobs": None,
                     "prompt_token_ids": list(out.input_ids) if ids else None, "routed_experts": None}],
        "service_tier": None, "system_fingerprint": e.system_fingerprint, "usage": _usage(e, out),
        "kv_transfer_params": None, "ec_transfer_params": None, "metrics": None})


def _usage(e: FakeVLLMEngine, out: Any) -> dict[str, Any]:
    """``UsageInfo``: with ``--enable-prompt-tokens-details``, the prompt tokens the prefix cache served."""
    prompt, completion = len(out.input_ids), len(out.output_ids)
    details = {"cached_tokens": out.cached_tokens, "created_cache_tokens": None, "multimodal_tokens": None}
    return {"prompt_tokens": prompt, "total_tokens": prompt + completion, "completion_tokens": completion,
            "prompt_tokens_details": details if e.enable_prompt_tokens_details else None,
            "completion_tokens_details": None}


_SALT_FORBIDDEN = ("@", "/", "\\", "\0")
_SALT_MAX = 128


def _cache_salt(body: dict[str, Any]) -> str | None:
    """``cache_salt`` (``validate_cache_salt``, ``entrypoints/generate/base/protocol.py``, 0.32.0): a non-empty
    string of at most 128 characters without ``@``, ``/``, ``\\`` or NUL, else vLLM's ``VLLMValidationError``."""
    salt = body.get("cache_salt")
    if salt is None:
        return None
    if not isinstance(salt, str) or not salt:
        raise _Refused(_salt_refused("must be a non-empty string if provided"))
    if len(salt) > _SALT_MAX or any(c in salt for c in _SALT_FORBIDDEN):
        raise _Refused(_salt_refused(f"must be at most {_SALT_MAX} characters and must not contain '@', '/', "
                                     "'\\\\', or NUL"))
    return salt


def _salt_refused(why: str) -> Reply:
    return error_reply(400, f"Parameter 'cache_salt' {why}. (parameter=cache_salt)", "BadRequestError", "cache_salt")


async def _completion_stream(e: FakeVLLMEngine, request: Any, call: Any, rid: str, model: str, ids: bool,
                             logprobs: int | None) -> AsyncIterator[dict[str, Any]]:
    """``completion_stream_generator`` (``entrypoints/openai/completion/serving.py``, 0.32.0): the choice's fields
    set (``exclude_unset``: no ``usage``), the prompt ids on the first chunk, ``text_offset`` absolute across
    chunks, ``system_fingerprint`` on the terminal chunk."""
    sent, offset = 0, 0
    async for out, final in e.outputs(request, call):
        new = list(out.output_ids[sent:])
        if not new and not final:  # an output with nothing new (its tokens went out with an earlier one)
            continue
        lp = None if logprobs is None else completion_logprobs(new, logprobs, e.vocab_size, e.text, sent, offset)
        if lp is not None and lp["tokens"]:
            offset = lp["text_offset"][-1] + len(lp["tokens"][-1])
        chunk: dict[str, Any] = {
            "id": rid, "object": "text_completion", "created": e.now(), "model": model,
            "choices": [{"index": 0, "text": e.text(new), "logprobs": lp,
                         "finish_reason": e.finish_reason(out) if final else None,
                         "stop_reason": e.stop_reason(out) if final else None,
                         "prompt_token_ids": list(out.input_ids) if ids and sent == 0 else None,
                         "token_ids": new if ids else None}]}
        sent = len(out.output_ids)
        if final:
            chunk["system_fingerprint"] = e.system_fingerprint
        yield chunk


def _dp_rank(req: HTTPRequest) -> int | None:
    """The rank an ``X-data-parallel-rank`` header pins the request to (``_get_data_parallel_rank``,
    ``entrypoints/generate/base/serving.py``, 0.32.0: what ``int()`` does not read is ignored); None without one."""
    value = req.headers.get("x-data-parallel-rank")
    try:
        return None if value is None else int(value)
    except ValueError:
        return None


def _request_id(e: FakeVLLMEngine, req: HTTPRequest, body: dict[str, Any]) -> str:
    """The id vLLM knows the request by (fact ``request_id_prefix``): the route's prefix, then the body's
    ``request_id``, else a random one. (vLLM's ``X-Request-Id`` header, which takes precedence, is not modelled.)"""
    prefix = VLLM.fact("request_id_prefix", e.release)[req.path]
    return prefix + (body.get("request_id") or e.new_id())


async def _generate(e: FakeVLLMEngine, req: HTTPRequest) -> Reply:
    """``/inference/v1/generate``: token ids in and out, each choice with its ``weight_versions`` spans and, with
    ``sampling_params.logprobs``, its logprobs (``output_mode`` ``tokens``; ``text`` is not modelled)."""
    if not e.enable_scale_out:
        return answer("scale_out_disabled")
    body = _json(req)
    ids = _field(body, "token_ids", list)
    if not ids:
        raise Invalid(("body", "token_ids"), "List should have at least 1 item after validation, not 0",
                      "too_short", ids)
    sampling = _field(body, "sampling_params", dict)
    try:
        logprobs, salt = _sampling_logprobs(sampling), _cache_salt(body)
    except _Refused as refused:
        return refused.reply
    rid = _request_id(e, req, body)
    wrong = e.check_model(body.get("model"))
    if wrong is not None:
        return wrong
    stream = bool(body.get("stream"))
    rank = _dp_rank(req)
    refused = over_limit(logprobs, e.vocab_size, e.max_logprobs) or e.refuses_rank(rank)
    if refused is not None:
        return Reply(200, stream=_error_event(refused)) if stream else refused
    lora = body.get("model") if body.get("model") in e.adapters else None
    prompt_ids = bool(body.get("return_token_ids"))
    request, call = e.submit(ids, sampling, rid, lora, stream, salt, rank)
    if stream:
        return Reply(200, stream=_generate_stream(e, request, call, rid, logprobs, prompt_ids))
    out = await e.finished(request, call)
    output = list(out.output_ids)
    return Reply(200, {
        "request_id": rid, "created": e.now(), "model": body.get("model") or e.served_model_name,
        "output_mode": "tokens",
        "choices": [{"index": 0, "finish_reason": e.finish_reason(out), "stop_reason": e.stop_reason(out),
                     "token_ids": output,
                     "logprobs": None if logprobs is None else generate_logprobs(output, logprobs, e.vocab_size),
                     "routed_experts": None, "sampling_mask": None, "weight_versions": e.spans(out)}],
        "prompt_token_ids": list(out.input_ids) if prompt_ids else None, "prompt_logprobs": None,
        "prompt_token_id_logprobs": None, "mm_placeholders": None, "usage": _usage(e, out), "kv_transfer_params": None,
        "ec_transfer_params": None, "metrics": None})


async def _generate_stream(e: FakeVLLMEngine, request: Any, call: Any, rid: str, logprobs: int | None,
                           prompt_ids: bool) -> AsyncIterator[dict[str, Any]]:
    """Token deltas; the final chunk carries the whole output's ``weight_versions``. ``serve_tokens_stream_generator``
    (0.32.0) leaves out ``prompt_token_ids``, ``mm_placeholders`` and ``metrics`` where they are None: the prompt ids
    ride on the first chunk with ``return_token_ids``, a text prompt has no placeholders."""
    sent = 0
    async for out, final in e.outputs(request, call):
        new = list(out.output_ids[sent:])
        if not new and not final:  # skipped, as vLLM skips a non-terminal output without tokens
            continue
        chunk: dict[str, Any] = {
            "request_id": rid, "usage": None, "output_mode": "tokens",
            "choices": [{"index": 0, "finish_reason": e.finish_reason(out) if final else None,
                         "stop_reason": e.stop_reason(out) if final else None, "token_ids": new,
                         "routed_experts": None, "sampling_mask": None,
                         "weight_versions": e.spans(out) if final else None,
                         "logprobs": None if logprobs is None else generate_logprobs(new, logprobs, e.vocab_size,
                                                                                        sent)}]}
        if prompt_ids and sent == 0:
            chunk["prompt_token_ids"] = list(out.input_ids)
        sent = len(out.output_ids)
        yield chunk


def _world_size(e: FakeVLLMEngine, req: HTTPRequest) -> Reply:
    """``/get_world_size``: TP × PP × DP, or without DP given ``include_dp=false`` (``entrypoints/rl/online/
    api_router.py``, 0.32.0); one process per rank (TP = PP = 1)."""
    return Reply(200, {"world_size": e.data_parallel_size if _bool_query(req, "include_dp", True) else 1})


def _models(e: FakeVLLMEngine) -> dict[str, Any]:
    def card(name: str, root: str, parent: str | None) -> dict[str, Any]:
        return {"id": name, "object": "model", "created": e.now(), "owned_by": "vllm", "root": root,
                "parent": parent, "max_model_len": e.max_model_len if parent is None else None,
                "permission": [{"id": f"modelperm-{name}", "object": "model_permission", "created": e.now(),
                                "allow_create_engine": False, "allow_sampling": True, "allow_logprobs": True,
                                "allow_search_indices": False, "allow_view": True, "allow_fine_tuning": False,
                                "organization": "*", "group": None, "is_blocking": False}]}
    return {"object": "list", "data": [card(e.served_model_name, e.model_path, None),
                                       *(card(n, p, e.served_model_name) for n, p in e.adapters.items())]}


def _sync(handler: Callable[[FakeVLLMEngine, HTTPRequest], Reply]) -> Handler:
    async def run(e: FakeVLLMEngine, req: HTTPRequest) -> Reply:
        return handler(e, req)
    return run


ROUTES: dict[str, tuple[tuple[str, ...], Handler]] = {
    "/health": (("GET",), _sync(lambda e, r: Reply(200))),
    "/metrics": (("GET",), _sync(lambda e, r: Reply(200, e.metrics()))),
    "/version": (("GET",), _sync(lambda e, r: Reply(200, {"version": e.release}))),
    "/v1/models": (("GET",), _sync(lambda e, r: Reply(200, _models(e)))),
    "/v1/completions": (("POST",), _completions),
    "/inference/v1/generate": (("POST",), _generate),
    "/pause": (("POST",), _pause),
    "/resume": (("POST",), _sync(lambda e, r: e.resume())),
    "/is_paused": (("GET",), _sync(lambda e, r: Reply(200, {"is_paused": e.paused}))),
    "/abort_requests": (("POST",), _abort_requests),
    "/update_weight_version": (("POST",), _update_weight_version),
    "/weight_info": (("GET",), _sync(lambda e, r: Reply(200, {"weight_version": e.weight_version}))),
    "/get_world_size": (("GET",), _sync(_world_size)),
    "/init_weight_transfer_engine": (("POST",), _weight_transfer),
    "/start_weight_update": (("POST",), _weight_transfer),
    "/start_draft_weight_update": (("POST",), _weight_transfer),
    "/update_weights": (("POST",), _weight_transfer),
    "/finish_weight_update": (("POST",), _weight_transfer),
    "/shutdown_weight_transfer_engine": (("POST",), _weight_transfer),
    "/weight_checker": (("POST",), _weight_checker),
    "/collective_rpc": (("POST",), _collective_rpc),
    "/reset_prefix_cache": (("POST",), _sync(lambda e, r: e.reset_prefix_cache(
        _bool_query(r, "reset_running_requests", False)))),
    "/sleep": (("POST",), _sleep),
    "/wake_up": (("POST",), _wake_up),
    # EngineCore.is_sleeping: the scheduler paused, or the executor's memory asleep (v1/engine/core.py, 0.32.0)
    "/is_sleeping": (("GET",), _sync(lambda e, r: Reply(200, {"is_sleeping": e.paused or bool(e.asleep)}))),
    "/v1/load_lora_adapter": (("POST",), _load_lora),
    "/v1/unload_lora_adapter": (("POST",), _unload_lora),
}
"""Path → (methods, handler): every route the fake vLLM serves."""
_CANCELLABLE = frozenset({"/v1/completions", "/inference/v1/generate"})
"""The routes vLLM wraps in ``with_cancellation`` (``entrypoints/utils.py``; both generation routers, 0.32.0)."""


class FakeVLLMApp:
    """ASGI app: route, validate, hand to the engine, record the control call."""

    def __init__(self, engine: FakeVLLMEngine) -> None:
        self.engine = engine
        self.on_engine_dead: Callable[[], None] | None = None
        """vLLM's ``terminate_if_errored``: called when a request other than ``/health`` met the crashed engine (its
        EngineDeadError handler shuts the API server down; fact ``engine_death_ends_server``). The drop-in server
        (:mod:`fakes.vllm.launch_server`) stops there; served in process, the fake keeps answering, as the fake
        SGLang does."""
        self.router = Router([Route(path, methods, self._bind(handler)) for path, (methods, handler) in ROUTES.items()])

    def _bind(self, handler: Handler) -> Callable[[HTTPRequest], Awaitable[Reply]]:
        async def run(req: HTTPRequest) -> Reply:
            engine = self.engine
            reply = engine.dead_reply(req.path) if engine.dead else await self._handle(engine, handler, req)
            if engine.crashed and req.path != "/health" and self.on_engine_dead is not None:
                self.on_engine_dead()
            return reply
        return run

    @staticmethod
    async def _handle(engine: FakeVLLMEngine, handler: Handler, req: HTTPRequest) -> Reply:
        """The live engine's answer to ``req`` (a control call recorded with it)."""
        try:
            reply = await handler(engine, req)
        except Invalid as invalid:
            reply = invalid.reply()
        except (EngineCrashed, EngineClosed):
            reply = engine.dead_reply(req.path)
        if req.path not in ("/health", "/metrics", "/v1/completions", "/inference/v1/generate", "/v1/models"):
            engine.record_control(req.path, req.text(), reply.status, reply.body)
        return reply

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await lifespan(receive, send, self.engine.aclose)
            return
        if scope["type"] != "http":
            return
        body = await read_body(receive)
        req = request_from_scope(scope, body, receive)
        route = self.router.match(req.method, req.path)
        if isinstance(route, Reply):
            await send_reply(send, route)
            return
        if req.path in _CANCELLABLE:  # with_cancellation: a client that leaves aborts its request
            await until_disconnect(self._serve(route, req, send), receive)
        else:
            await self._serve(route, req, send)

    @staticmethod
    async def _serve(route: Route, req: HTTPRequest, send: Send) -> None:
        await send_reply(send, await route.handler(req))


def make_app(engine: FakeVLLMEngine) -> FakeVLLMApp:
    """The ASGI app for ``engine`` (also ``engine.app``)."""
    return FakeVLLMApp(engine)
