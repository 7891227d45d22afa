"""FakeEngine: the async shell over the pure scheduler (SGLang's TokenizerManager + scheduler process).

It owns what SGLang's tokenizer side owns (``python/sglang/srt/managers/tokenizer_manager.py`` and its
mixins): the pause gate that parks new requests,
the writer-preferring model-update lock every /generate holds as a reader, the tokenizer-side
``weight_version`` label, LoRA refcounts, weight-update groups and sessions; and it drives the
``Scheduler`` either by hand (``await engine.step(n)``, manual clock) or with a real-time ticker
(``tokens_per_second``). Every public coroutine returns an ``asgi.Reply`` carrying SGLang's status and body;
``app.py`` does the wire parsing and validation. The engine binds to the event loop that first serves it.

One class, its responsibilities in one module each: ``engine_loop`` (loop, waiting, stepping, crash, faults,
events), ``generation`` (``/generate`` and the pause gate), ``weight_updates`` (every transport, flush, memory),
``lora`` (adapters), ``info`` (info routes); this module holds the state they share.
"""

from __future__ import annotations

import asyncio
import random
import threading
from collections import OrderedDict
from typing import Any, Callable, Mapping, Sequence

from . import weights as W
from .app import make_app
from .clock import Clock, ManualClock, RealClock
from .engine_loop import EngineLoop, _UpdateLock
from .events import EventLog
from .failures import EngineClosed, EngineCrashed, error_reply, flush_fault_scope
from .faults import FaultPlan
from .generation import CONTINUED_BODY, HEALTH_RID_PREFIX, PAUSED_BODY, GenerationMixin, _Call, _Sink
from .info import WEIGHT_VERSION_DEPRECATED, InfoMixin
from .lora import LORA_NOT_ENABLED, LoraMixin, _Adapter
from .profiles import DEFAULT_PROFILE, Profile, get_profile
from .scheduler import Request, Scheduler
from .served_model import BUILTIN_MODEL_PATH, ServedModel, builtin_model
from .weight_updates import (
    FLUSH_AFTER_UPDATE_ASSERT,
    FLUSH_AFTER_UPDATE_ERROR,
    FLUSH_OK_TEXT,
    WeightUpdatesMixin,
)

DEFAULT_MODEL_PATH = BUILTIN_MODEL_PATH

__all__ = [  # FakeEngine, and the names that lived here before the split
    "FakeEngine", "DEFAULT_MODEL_PATH", "EngineClosed", "EngineCrashed", "error_reply", "flush_fault_scope",
    "PAUSED_BODY", "CONTINUED_BODY", "HEALTH_RID_PREFIX", "WEIGHT_VERSION_DEPRECATED", "LORA_NOT_ENABLED",
    "FLUSH_AFTER_UPDATE_ASSERT", "FLUSH_AFTER_UPDATE_ERROR", "FLUSH_OK_TEXT",
]


class FakeEngine(GenerationMixin, WeightUpdatesMixin, LoraMixin, InfoMixin, EngineLoop):
    """A faithful fake of one SGLang server's weight-sync surface (see ``fakes/README.md``)."""

    def __init__(
        self,
        profile: str | Profile = DEFAULT_PROFILE,
        tokens_per_second: float | None = None,
        max_running_requests: int = 64,
        enable_lora: bool = False,
        max_loras: int | None = 8,
        seed: int = 0,
        weights: W.WeightStore | Mapping[str, Any] | None = None,
        model_path: str | None = None,
        faults: FaultPlan | None = None,
        engine_id: str = "e0",
        health_check_timeout_s: float = 20.0,
        *,
        clock: Clock | None = None,
        weight_version: str = "default",
        group_timeout_s: float = 60.0,
        trace_tokens: bool = False,
        model: ServedModel | None = None,
        tokenizer_path: str | None = None,
        served_model_name: str | None = None,
        skip_tokenizer_init: bool = False,
        max_lora_rank: int | None = None,
        lora_target_modules: Sequence[str] | None = None,
        load_format: str = "auto",
        server_args: Mapping[str, Any] | None = None,
        starting: bool = False,
        strict_weights: bool = False,
        enable_memory_saver: bool = False,
        enable_weights_cpu_backup: bool = False,
        context_length: int | None = None,
        tp_size: int = 1,
        api_key: str | None = None,
    ) -> None:
        if tokens_per_second is not None and tokens_per_second <= 0:
            raise ValueError(f"tokens_per_second must be > 0 or None (manual clock), got {tokens_per_second}")
        self.profile = get_profile(profile)
        self.tokens_per_second = tokens_per_second
        if clock is None:
            clock = ManualClock() if tokens_per_second is None else RealClock()
        self.clock: Clock = clock
        self.enable_lora = enable_lora
        self.max_loras = max_loras
        self.seed = seed
        self.faults = faults
        self.engine_id = engine_id
        self.health_check_timeout_s = health_check_timeout_s
        self.group_timeout_s = group_timeout_s
        if tp_size < 1:
            raise ValueError(f"tp_size must be >= 1, got {tp_size}")
        self.tp_size = tp_size  # TP ranks: each joins weight-update groups and takes its tensor payload item
        self.api_key = api_key  # --api-key: every route but the probes needs "Authorization: Bearer <api_key>"
        self.events = EventLog()
        self.scheduler = Scheduler(
            self.profile,
            max_running_requests,
            self.clock,
            seed,
            version=weight_version,
            events=self.events,
            engine_id=engine_id,
            trace_tokens=trace_tokens,
        )
        if model is not None and weights is not None:
            raise ValueError("pass model= or weights=, not both")
        if model is None:
            model = builtin_model(seed) if weights is None else ServedModel(
                model_path or DEFAULT_MODEL_PATH, self._initial_weights(weights, seed), dict(W.TINY_CONFIG))
        self.model = model
        self.weights: W.WeightStore = model.weights
        self.model_path = model_path or model.path
        self.tokenizer_path = tokenizer_path or self.model_path
        self.served_model_name = served_model_name or self.model_path
        self.skip_tokenizer_init = skip_tokenizer_init
        self.max_lora_rank = max_lora_rank
        self.lora_target_modules = tuple(lora_target_modules) if lora_target_modules else None
        self.load_format = load_format
        self.strict_weights = strict_weights  # refuse unknown names / partial checkpoints (SGLang skips, loads)
        self.server_args = dict(server_args or {})  # the launch flags (python -m fakes.launch_server)
        self.server_status = "Starting" if starting else "Up"  # TokenizerManager.server_status
        self.enable_memory_saver = enable_memory_saver
        self.enable_weights_cpu_backup = enable_weights_cpu_backup
        self.offload_tags: set[str] = set()  # released GPU memory types (release/resume_memory_occupation)
        self.memory_gone = False  # weights or KV cache released by the memory saver: a forward pass crashes
        self.context_length = context_length or model.config.get("max_position_embeddings")
        self.weight_version = weight_version  # tokenizer-side label (/model_info, ≤0.5.16 meta_info)
        self.startup_weight_version = weight_version
        self.crashed = False
        self.crash_reason: str | None = None
        self.on_crash: Callable[[str], None] | None = None
        """Called with the reason when the engine crashes (the drop-in server exits there, as SGLang does)."""
        self.closed = False
        # tokenizer-side state
        self.paused = False  # TokenizerManager.is_pause
        self.pause_mode: str | None = None
        self.session_open = False
        self._parked: list[str] = []
        self._loras: OrderedDict[str, _Adapter] = OrderedDict()
        self._lora_refs: dict[str, tuple[str, bool]] = {}  # every adapter loaded once: name -> (path, pinned)
        self._groups: dict[str, list[Any]] = {}  # group name -> one DistributedGroup per TP rank
        self._sinks: dict[Request, _Sink] = {}
        self._sink_rids: dict[str, int] = {}  # rid -> how many of ``_sinks`` carry it (O(1) rid lookups)
        self._calls: set[_Call] = set()
        self._flushing = False
        self._lora_update_lock: asyncio.Lock | None = None
        self._rid_rng = random.Random(f"rid:{seed}:{engine_id}")
        self._outputs = 0  # scheduler outputs so far (health checks watch it)
        self._health_checks = 0
        self._background: set[asyncio.Task] = set()
        # loop binding
        self._loop: asyncio.AbstractEventLoop | None = None
        self._waiters: dict[asyncio.Future, None] = {}  # insertion-ordered: waiters wake in arrival order
        self._ticker: asyncio.Task | None = None
        self._sync_lock = threading.Lock()
        self.update_lock = _UpdateLock(self._wait_for, self._touch, self._raise_if_dead)
        self._app = None
        self._weights_event("weights.load", source="startup", model_path=self.model_path)

    @staticmethod
    def _initial_weights(weights: W.WeightStore | Mapping[str, Any] | None, seed: int) -> W.WeightStore:
        if weights is None:
            return W.WeightStore(W.tiny_model(seed))
        if isinstance(weights, W.WeightStore):
            return weights
        return W.WeightStore(weights)

    @property
    def app(self) -> Any:
        """The ASGI app serving this engine (built once)."""
        if self._app is None:
            self._app = make_app(self)
        return self._app

    def __repr__(self) -> str:
        return f"FakeEngine({self.engine_id!r}, profile={self.profile.version!r}, version={self.weight_version!r})"
