"""The wire's vocabulary per engine family: what an engine's calls mean in the suite's words, and back.

The history, its checkers, the scenarios and the sentinels speak one vocabulary: SGLang's routes and bodies (the
checkers read bodies as :data:`VOCABULARY_PROFILE` reads them). An engine family whose wire differs has a
:class:`Dialect` that its backend's recorders and probes go through, so every checker judges a vLLM integration as
it judges an SGLang one:

* :meth:`Dialect.recorded` / :meth:`Dialect.answered`: a call the integration sent the engine, and its answer, in
  the vocabulary (the wire recorder, :mod:`conformance.wire`); the call as sent is kept in ``WireCall.sent_as``;
* :meth:`Dialect.outgoing`: a call the suite makes itself (a sentinel's ``/generate``, an injected abort or pause, the
  label probe) in the engine's words.

SGLang's dialect is the identity. vLLM's (0.32.0, ``fakes.facts.VLLM``; its routes in ``fakes/vllm/app.py``):

* ``POST /pause?mode=abort`` (also no mode: vLLM's default) → ``/pause_generation {"mode": "abort"}``;
  ``keep&clear_cache=false`` → ``in_place``; ``keep`` with the caches cleared (``clear_cache``, true by default, in
  every mode: ``EngineCore._finish_pause`` preempts the running requests and resets the prefix cache; measured) →
  ``retract``; ``wait`` → ``retract`` (see below); a pause that clears the caches carries ``flush_cache: true``;
  ``POST /resume`` → ``/continue_generation {}``;
* ``POST /sleep?level&mode`` pauses the same way, then (level 1, 2) puts the weights and the KV cache to sleep
  (``EngineCore.sleep``, 0.32.0) → ``/pause_generation {"mode", "release_memory": ["kv_cache", "weights"]}``;
  ``/wake_up?tags=…`` that leaves memory asleep (the scheduler stays paused) → ``/resume_memory_occupation {"tags"}``;
  the one after which nothing sleeps resumes scheduling → ``/continue_generation {"resume_memory": [woken]}``;
* ``/update_weight_version`` → the same, with ``abort_all_requests: false`` (vLLM's never aborts);
* ``/collective_rpc`` ``reload_weights`` (``kwargs.weights_path``) → ``/update_weights_from_disk {"model_path"}``,
  neither aborting nor flushing; ``/reset_prefix_cache`` → ``/flush_cache``;
* ``/abort_requests {"request_ids": ["generate-tokens-" + rid]}`` / ``{}`` → ``/abort_request {"rid"}`` /
  ``{"abort_all": true}`` (vLLM knows a request by its route's prefix and the body's ``request_id``: fact
  ``request_id_prefix``; an id without the prefix is recorded as it is and aborts nothing);
* ``/v1/load_lora_adapter``, ``/v1/unload_lora_adapter`` → ``/load_lora_adapter``, ``/unload_lora_adapter``;
* vLLM's native weight transfer (``--weight-transfer-config``, the gloo engine of ``fakes.vllm.weight_transfer``):
  ``/init_weight_transfer_engine {init_info}`` → ``/init_weights_update_group`` (the group's name, ``backend:
  gloo``), ``/start_weight_update`` → ``/begin_weight_update``, ``/update_weights {update_info}`` →
  ``/update_weights_from_distributed`` on that group (``dtype_names`` → ``dtypes``; neither flushing nor aborting),
  ``/finish_weight_update`` → ``/end_weight_update`` (a ``weight_version`` it carries stays in the body: vLLM
  publishes it once the finish succeeded), ``/shutdown_weight_transfer_engine`` → ``/destroy_weights_update_group``.
  An update that fails ends vLLM's session (the worker's ``_weight_update_active = False``) with the layers reset; a
  ``/start_weight_update`` after it reopens one so that a finish restores them: recorded as sent (outside the
  vocabulary), the session the checkers see running on to that finish;
* ``/inference/v1/generate``, ``/v1/completions`` → ``/generate`` (``model`` → ``lora_path``, ``cache_salt`` kept),
  answered with ``meta_info`` (id, finish reason, tokens, version spans, and ``cached_tokens``: the prompt tokens the
  prefix cache served, answered with ``--enable-prompt-tokens-details``); ``GET /weight_info`` → ``/model_info``.

``wait`` drains the running requests before it answers and ``retract`` re-queues them: neither aborts nor freezes a
request, which is what the checkers judge of a pause; a vLLM reload neither aborts (it runs between two engine
steps) nor resets the prefix cache (``gpu_model_runner.reload_weights``). Token ids are read as the fake's byte
tokenizer writes them (``fakes.scheduler.encode_text``), so a prompt's text is recovered for the prompt book.
"""

from __future__ import annotations

from typing import Any, Callable
from urllib.parse import parse_qs

from fakes.facts import VLLM
from fakes.profiles import DEFAULT_PROFILE
from fakes.scheduler import decode_ids, encode_text
from fakes.vllm.weight_transfer import GROUP_NAME

VOCABULARY_PROFILE = DEFAULT_PROFILE
"""The SGLang release whose routes and bodies the vocabulary is: a translated call means under it what it meant to
its own engine."""


class Dialect:
    """SGLang's dialect: the vocabulary itself (every call recorded and sent as it is)."""

    family = "sglang"
    prefix_cache: str | None = ("the fake SGLang keeps no radix cache (its answers' cached_tokens are always 0), so a "
                                "prompt served from the cache after a weight load cannot be shown on SGLang here")
    """Why the suite cannot show this family's prefix cache on its wire, or None: its answers say how many prompt
    tokens the cache served, and what resets the cache is a call on the wire (:mod:`conformance.situations.prefix`)."""

    def fresh(self) -> "Dialect":
        """The dialect for one more engine (a stateful dialect keeps what it learnt per engine)."""
        return self

    def recorded(self, method: str, path: str, query: str, payload: Any) -> tuple[str, Any]:
        """The call the integration sent, as the history records it: ``(path, payload)``."""
        return path, payload

    def answered(self, path: str, payload: Any, response: Any) -> Any:
        """The engine's answer to the recorded call ``path`` (``payload``), as the history records it."""
        return response

    def outgoing(self, path: str, body: Any = None) -> tuple[str, Any]:
        """A call of the suite's in the vocabulary, as this engine takes it: ``(path with query, body)``."""
        return path, body

    def drains(self, sent_as: str | None) -> bool:
        """Whether a pause, sent as ``sent_as`` (``WireCall.sent_as``), answers only once every request in flight
        finished: a long-lived request resident there would hold it for its whole budget. None of SGLang's
        modes does."""
        return False

    def failing_load(self, path: str) -> Callable[[Any], Any] | None:
        """How a load at ``path`` (vocabulary) is made to fail on this family's engine itself: a rewrite of the body
        the integration sent; None where the suite answers it at the wire instead (SGLang: a disk or tensor load
        that raises kills its server, so the scenarios inject the 400 it answers for a load that reports failure)."""
        return None

    def rid(self, engine_rid: str) -> str:
        """The rid the history knows a request by (``meta_info.id``, ``Turn.rid``), from the id the engine's own
        scheduler gives it (the fake's event log). SGLang: the same."""
        return engine_rid


SGLANG_DIALECT = Dialect()

_PAUSE_MODES = {"abort": "abort", "keep": "in_place", "wait": "retract"}
"""vLLM's pause mode → the vocabulary's (see the module docstring for ``wait``; ``keep`` clearing the caches is
``retract``: :func:`_paused`)."""
_VLLM_MODES = {mode: vllm for vllm, mode in _PAUSE_MODES.items()}
"""The vocabulary's pause mode → vLLM's."""
_GENERATION = frozenset({"/inference/v1/generate", "/v1/completions"})
_RENAMED = {"/resume": "/continue_generation", "/reset_prefix_cache": "/flush_cache", "/weight_info": "/model_info",
            "/v1/load_lora_adapter": "/load_lora_adapter", "/v1/unload_lora_adapter": "/unload_lora_adapter"}
_TRANSFER = {"/init_weight_transfer_engine": "/init_weights_update_group", "/start_weight_update": "/begin_weight_update",
             "/update_weights": "/update_weights_from_distributed", "/finish_weight_update": "/end_weight_update",
             "/shutdown_weight_transfer_engine": "/destroy_weights_update_group"}
"""vLLM's native weight-transfer routes → the vocabulary's (:meth:`VllmDialect._transfer`)."""
MISSING = "/nonexistent/made-to-fail-by-the-conformance-suite"
"""Where a load the suite makes fail points the engine (:meth:`VllmDialect.failing_load`)."""
SERVED = "<the served model>"
"""``model_path`` of a reload that names no path before any that did: the directory the server was started on."""


class VllmDialect(Dialect):
    """vLLM's dialect (see the module docstring); one per engine: it follows the engine's served path."""

    family = "vllm"
    prefix_cache = None

    def __init__(self) -> None:
        self.served = SERVED
        self.group = GROUP_NAME
        """The weight-transfer group the engine was last told to join (its ``update_weights`` use it)."""
        self.ended_by_failure = False
        """vLLM ended the engine's weight-update session when an update failed (the worker's
        ``_weight_update_active = False``); the session the vocabulary sees goes on until a finish."""
        self.asleep: set[str] = set()
        """The engine's memory a ``/sleep`` put to sleep and no ``/wake_up`` woke yet (its executor's
        ``sleeping_tags``; a tag not asleep wakes nothing): while any sleeps, the scheduler stays paused."""

    def fresh(self) -> "VllmDialect":
        return VllmDialect()

    def rid(self, engine_rid: str) -> str:
        """The body's ``request_id``: the route's prefix stripped, and the prompt's index that the completions route
        appends (``f"{request_id}-{i}"``, ``entrypoints/openai/completion/serving.py``, 0.32.0)."""
        for path, prefix in _PREFIXES.items():
            if engine_rid.startswith(prefix):
                rid = engine_rid[len(prefix):]
                return rid.rpartition("-")[0] if path == "/v1/completions" else rid
        return engine_rid

    def recorded(self, method: str, path: str, query: str, payload: Any) -> tuple[str, Any]:
        body = payload if isinstance(payload, dict) else {}
        if path == "/pause":
            query_of = parse_qs(query)
            return "/pause_generation", _paused(query_of, _flag(query_of, "clear_cache"))
        if path == "/sleep":
            query_of = parse_qs(query)
            asleep = (query_of.get("level") or ["1"])[0] != "0"
            paused = _paused(query_of, asleep)
            if asleep:
                self.asleep = {"weights", "kv_cache"}
                paused["release_memory"] = sorted(self.asleep)
            return "/pause_generation", paused
        if path == "/wake_up":
            given = parse_qs(query, keep_blank_values=True).get("tags")  # none: every tag
            tags = None if not given else [t for t in given if t != "scheduling"]
            woken = set(self.asleep) if tags is None else set(tags) if tags and set(tags) <= self.asleep else set()
            self.asleep -= woken
            if self.asleep:  # woke nothing: as sent (SGLang reads no tags as every tag)
                return ("/resume_memory_occupation", {"tags": sorted(woken)}) if woken else (path, payload)
            return "/continue_generation", {"resume_memory": sorted(woken)}
        if path == "/update_weight_version":
            return path, {**body, "abort_all_requests": False}
        if path == "/collective_rpc" and body.get("method") == "reload_weights":
            kwargs = body.get("kwargs") if isinstance(body.get("kwargs"), dict) else {}
            if kwargs.get("weights_path"):
                self.served = str(kwargs["weights_path"])  # vLLM serves it from then on, read or not
            return "/update_weights_from_disk", {"model_path": self.served, "abort_all_requests": False,
                                                 "flush_cache": False}
        if path == "/abort_requests":
            ids = body.get("request_ids")
            return "/abort_request", {"rid": _rid(str(ids[0]))} if ids else {"abort_all": True}
        if path in ("/v1/load_lora_adapter", "/v1/unload_lora_adapter"):
            return _RENAMED[path], {k: body[k] for k in ("lora_name", "lora_path") if k in body}
        if path in _GENERATION:
            return "/generate", _generate_request(path, body)
        if path in _TRANSFER:
            return self._transfer(path, body)
        return _RENAMED.get(path, path), payload if path not in ("/resume", "/reset_prefix_cache") else {}

    def _transfer(self, path: str, body: dict[str, Any]) -> tuple[str, Any]:
        """A call of vLLM's native weight transfer in the vocabulary (see the module docstring)."""
        if path == "/init_weight_transfer_engine":
            info = body.get("init_info") if isinstance(body.get("init_info"), dict) else {}
            self.group = str(info.get("group_name") or GROUP_NAME)
            return "/init_weights_update_group", {**{k: info[k] for k in (
                "master_address", "master_port", "rank_offset", "world_size") if k in info},
                "group_name": self.group, "backend": "gloo"}
        if path == "/update_weights":
            info = body.get("update_info")
            info = info[0] if isinstance(info, list) and info else info  # this engine's (its one rank's)
            info = info if isinstance(info, dict) else {}
            return "/update_weights_from_distributed", {
                "names": info.get("names"), "dtypes": info.get("dtype_names"), "shapes": info.get("shapes"),
                "group_name": self.group, "flush_cache": False, "abort_all_requests": False}
        if path == "/shutdown_weight_transfer_engine":
            return "/destroy_weights_update_group", {"group_name": self.group}
        if path == "/start_weight_update" and self.ended_by_failure:
            self.ended_by_failure = False  # reopened after a failed update: the same session, not a second one
            return path, {}
        if path == "/finish_weight_update":
            self.ended_by_failure = False
        if path == "/finish_weight_update" and body.get("weight_version") is not None:
            return "/end_weight_update", {"weight_version": body["weight_version"]}
        return _TRANSFER[path], {}

    def answered(self, path: str, payload: Any, response: Any) -> Any:
        if path == "/generate" and isinstance(response, dict) and isinstance(response.get("choices"), list):
            rid = payload.get("rid") if isinstance(payload, dict) else None
            return [_output(choice, response, rid) for choice in response["choices"]] \
                if len(response["choices"]) != 1 else _output(response["choices"][0], response, rid)
        if path == "/update_weights_from_distributed" and isinstance(response, dict) and "error" in response:
            self.ended_by_failure = True
        if path == "/update_weights_from_disk" and isinstance(response, dict) and "results" in response:
            return {"success": True, "message": "reload_weights", "results": response["results"]}
        return response

    def drains(self, sent_as: str | None) -> bool:
        """``POST /pause?mode=wait`` (``vllm/entrypoints/rl/online/api_router.py``, 0.32.0: it waits for the requests
        in flight to finish), and ``/sleep?mode=wait`` (it pauses the same way first)."""
        if not sent_as or " " not in sent_as:
            return False
        path, _, query = sent_as.split(" ", 1)[1].partition("?")
        return path in ("/pause", "/sleep") and parse_qs(query).get("mode") == ["wait"]

    def failing_load(self, path: str) -> Callable[[Any], Any] | None:
        """The checkpoint (or adapter) the cycle brings fails to load: every reload (adapter load) naming the path the
        first one named is pointed at a missing path, which vLLM fails itself, with what follows (a failed reload
        leaves the engine without weights until one succeeds: ``FakeVLLMEngine._reload_failed``); a load of any other
        path, the one served before included, goes through."""
        if path == "/update_weights_from_disk":
            return _failing(lambda body: (body.get("kwargs") or {}).get("weights_path"),
                            lambda body: {**body, "kwargs": {**(body.get("kwargs") or {}), "weights_path": MISSING}})
        if path == "/load_lora_adapter":
            return _failing(lambda body: body.get("lora_path"), lambda body: {**body, "lora_path": MISSING})
        return None

    def outgoing(self, path: str, body: Any = None) -> tuple[str, Any]:
        body = body if isinstance(body, dict) else {}
        if path == "/generate":
            params = _renamed(dict(body.get("sampling_params") or {}), "max_new_tokens", "max_tokens")
            ids = body.get("input_ids") or encode_text(str(body.get("text", "")))
            out: dict[str, Any] = {"token_ids": list(ids), "sampling_params": params}
            if body.get("rid"):
                out["request_id"] = body["rid"]
            if body.get("lora_path"):
                out["model"] = body["lora_path"]
            return "/inference/v1/generate", out
        if path == "/abort_request":  # the suite's requests go to /inference/v1/generate
            return "/abort_requests", {"request_ids": [_PREFIXES["/inference/v1/generate"] + body["rid"]]} \
                if body.get("rid") else {}
        if path == "/pause_generation":
            mode = body.get("mode", "abort")
            return f"/pause?mode={_VLLM_MODES[mode]}" + ("&clear_cache=false" if mode == "in_place" else ""), None
        if path == "/continue_generation":
            return "/resume", None
        if path == "/model_info":
            return "/weight_info", None
        return path, body or None


def _flag(query: dict[str, list[str]], name: str, default: bool = True) -> bool:
    """A boolean query parameter as FastAPI reads it (an unreadable one is refused before anything happens)."""
    raw = (query.get(name) or [None])[0]
    return default if raw is None else raw.lower() in ("true", "1", "yes", "on")


def _paused(query: dict[str, list[str]], clears: bool) -> dict[str, Any]:
    """A vLLM pause (``/pause``, or the one ``/sleep`` makes) in the vocabulary: ``keep`` is ``in_place`` only when
    nothing clears the caches; with them cleared (``clear_cache``, the default: ``EngineCore._finish_pause``) the
    running requests are preempted and recomputed on resume, which is ``retract``. A pause that clears them carries
    ``flush_cache: true``, the vocabulary's word for a call that flushes."""
    mode = (query.get("mode") or [VLLM.fact("pause_default_mode", VLLM.default_release)])[0]
    out: dict[str, Any] = {"mode": "retract" if mode == "keep" and clears else _PAUSE_MODES.get(mode, mode)}
    if clears:
        out["flush_cache"] = True
    return out


_PREFIXES: dict[str, str] = VLLM.fact("request_id_prefix", VLLM.default_release)
"""Per generation route, the prefix of the id vLLM knows a request by (``generate-tokens-`` + the body's
``request_id``)."""


def _rid(known_as: Any) -> Any:
    """The rid (a generate body's ``request_id``) of the request vLLM knows as ``known_as``: its route's prefix
    stripped. An id without one names no request on vLLM (its abort aborts nothing) and is kept as it is."""
    if isinstance(known_as, str):
        for prefix in _PREFIXES.values():
            if known_as.startswith(prefix):
                return known_as[len(prefix):]
    return known_as


def _failing(named: Callable[[dict[str, Any]], Any], broken: Callable[[dict[str, Any]], Any]) -> Callable[[Any], Any]:
    """A rewrite that breaks every body naming what the first one named (``named(body)``)."""
    first: list[Any] = []

    def rewrite(body: Any) -> Any:
        if not isinstance(body, dict):
            return body
        if not first:
            first.append(named(body))
        return broken(body) if named(body) == first[0] else body
    return rewrite


def _renamed(params: dict[str, Any], old: str, new: str) -> dict[str, Any]:
    """``params`` with its ``old`` key (when present) under the name ``new``: SGLang's ``max_new_tokens`` is vLLM's
    ``max_tokens``."""
    if old in params:
        params[new] = params.pop(old)
    return params


def _generate_request(path: str, body: dict[str, Any]) -> dict[str, Any]:
    """A vLLM generation request as SGLang's ``/generate`` body (the fields the checkers read)."""
    native = _renamed(dict(body.get("sampling_params") or {}) if path == "/inference/v1/generate" else
                      {k: body[k] for k in ("max_tokens", "temperature", "ignore_eos", "stop_token_ids") if k in body},
                      "max_tokens", "max_new_tokens")
    ids = body.get("token_ids") if path == "/inference/v1/generate" else body.get("prompt")
    out: dict[str, Any] = {"sampling_params": native}
    if isinstance(ids, str):
        out["text"] = ids
    elif isinstance(ids, list) and all(isinstance(i, int) for i in ids):
        out["input_ids"], out["text"] = ids, decode_ids(ids)
    rid = body.get("request_id")
    if rid is not None:
        out["rid"] = rid
    if body.get("model") is not None and path == "/inference/v1/generate":
        out["lora_path"] = body["model"]
    if body.get("stream"):
        out["stream"] = True
    if body.get("cache_salt") is not None:
        out["cache_salt"] = body["cache_salt"]
    return out


def _output(choice: Any, response: dict[str, Any], rid: str | None) -> dict[str, Any]:
    """One vLLM choice as an SGLang ``/generate`` output: ``meta_info`` with the id, the finish reason, the token
    counts and the version spans (``weight_versions``; the label is the last span's, none without tokens)."""
    if not isinstance(choice, dict):
        return {"meta_info": None}
    ids = choice.get("token_ids") or []
    spans = choice.get("weight_versions") or None
    reason = choice.get("finish_reason")
    meta: dict[str, Any] = {
        "id": rid or _rid(response.get("request_id") or response.get("id")),
        "finish_reason": {"type": reason} if reason is not None else None,
        "completion_tokens": (response.get("usage") or {}).get("completion_tokens", len(ids)),
        "weight_version": spans[-1]["version"] if spans else None,
    }
    details = (response.get("usage") or {}).get("prompt_tokens_details")
    if isinstance(details, dict) and details.get("cached_tokens") is not None:
        meta["cached_tokens"] = details["cached_tokens"]
    if spans is not None:
        meta["weight_versions"] = spans
    text = choice.get("text")
    return {"text": text if isinstance(text, str) else decode_ids(ids), "output_ids": list(ids), "meta_info": meta}


VLLM_DIALECT = VllmDialect()
"""vLLM's dialect (``fresh()`` one per engine); each family's row names its own (:mod:`conformance.families`)."""
