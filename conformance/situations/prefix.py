"""A prompt served from the prefix cache after a weight load on its engine: whether the KV it was served was computed
on the weights loaded since, or on the ones before (NeMo-RL#4018: the prefix cache never reset across refits, every
prompt that shares a prefix with one seen before the load is answered over the old weights' KV).

Built by the scenario's prompts, which share a preamble of several full cache blocks (:data:`TEMPLATE`), and an
update between batches; shown where an answer says the cache served some of its prompt (``cached_tokens``) to a
request sent once its engine stopped admitting for a load (a request in flight at the update is the pause mode's:
``in_place`` keeps it on the KV it has). Each such hit is attributed from the wire alone (:func:`prefix_hits`): the
cache's epoch is the time since its engine's last reset (a flush, or a pause that clears the caches), and in that
epoch the first request whose tokens cover the prefix computed it. Where no request on the wire covers it, the hit is
not attributed (never judged). A server with data-parallel ranks keeps a cache per rank, and the wire does not say
which rank served a request: a request that computed part of the prefix again (its own answer served it fewer cached
tokens) may have filled the hit's rank, so where one may have been scheduled after the load, the hit is not judged
either (the same holds for blocks evicted and computed again).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from fakes.scheduler import encode_text

from ..backends import Backend
from ..history import LORA_LOAD_PATHS, WEIGHT_LOAD_PATHS, History, WireCall
from ..prompts import TEMPLATE as PLAIN_TEMPLATE
from .scene import Situation

PREAMBLE = ("You are a careful assistant for a reinforcement-learning rollout. Read the task, think step by step, and "
            "answer in one line. Keep the answer short, and state any assumption before you use it. ") * 2
"""What every prompt of the scenario starts with: over two of vLLM's CPU cache blocks (128 tokens; the fake's
tokens are bytes), so every request after the first on an engine is served part of its prompt from the cache."""
TEMPLATE = PREAMBLE + PLAIN_TEMPLATE
"""The scenario's prompts (:class:`~conformance.prompts.PromptSource`'s template)."""


@dataclass(frozen=True)
class Scheduled:
    """When an engine could have scheduled a request, as the wire bounds it: when it was sent, or, sent while its
    engine was paused (the pause answered: vLLM queues new requests), when the engine continued. Sent while a pause
    was on its way (sent, not yet answered), either."""

    earliest: float
    latest: float


@dataclass(frozen=True)
class PrefixHit:
    """One request the prefix cache served part of its prompt, sent once its engine stopped admitting for a load."""

    call: WireCall
    cached: int
    """The prompt tokens the cache served (``meta_info.cached_tokens``)."""
    scheduled: Scheduled
    load: WireCall
    """The last weight load on its engine begun before it could be scheduled."""
    reset: WireCall | None
    """The last reset of its engine's cache (answered) before it could be scheduled, when begun after ``load``."""
    computed_by: WireCall | None
    """In the cache's epoch, the first request whose tokens cover the prefix it was served (None: none on the wire)."""
    computed: Scheduled | None
    """When ``computed_by`` could have been scheduled."""
    recomputed_by: WireCall | None = None
    """A later request of the epoch that computed part of the prefix again and may have been scheduled after the load
    (on another data-parallel rank than ``computed_by``, or over evicted blocks): it may have filled the cache the hit
    read."""

    @property
    def _before_load(self) -> bool:
        """Every request of the epoch that computed the prefix was scheduled before the load, for certain."""
        return self.computed is not None and self.computed.latest < self.load.t_start and self.recomputed_by is None

    @property
    def stale(self) -> bool:
        """Served KV its engine computed before ``load``, on weights it no longer held (for certain: a request that
        may have been scheduled on either side of the load is not judged)."""
        return self.reset is None and self._before_load

    @property
    def decided(self) -> bool:
        """Whether the wire settles it: a reset after the load, every computing request scheduled for certain before
        the load, or the first one for certain after it."""
        return self.reset is not None or self._before_load or (
            self.computed is not None and self.computed.earliest >= self.load.t_start)


def _tokens(call: WireCall) -> list[int]:
    """The request's prompt as token ids (the text as the byte tokenizer of the fake and the tiny model writes it)."""
    body = call.payload if isinstance(call.payload, dict) else {}
    ids = body.get("input_ids")
    return list(ids) if isinstance(ids, list) else encode_text(str(body.get("text") or ""))


def _covered(call: WireCall) -> list[int]:
    """What the request's KV covers: its prompt and its output."""
    outputs = call.generate_outputs()
    return _tokens(call) + (list(outputs[0].get("output_ids") or []) if outputs else [])


def _key(call: WireCall) -> tuple[Any, Any]:
    """What the cache keys a request's blocks by besides its tokens: its salt and its adapter."""
    body = call.payload if isinstance(call.payload, dict) else {}
    return body.get("cache_salt"), body.get("lora_path")


def cached_tokens(call: WireCall) -> int:
    outputs = call.generate_outputs()
    return int(outputs[0]["meta_info"].get("cached_tokens") or 0) if outputs else 0


Windows = dict[int, list[tuple[WireCall, float]]]


def _paused(windows: Windows, engine: int, t: float) -> tuple[WireCall, float] | None:
    """The accepted pause ``engine`` was under (or on its way to) at ``t``: the pause call, when the engine
    continued."""
    return next(((pause, resumed) for pause, resumed in windows[engine] if pause.t_start <= t < resumed), None)


def _scheduled(windows: Windows, call: WireCall) -> Scheduled:
    window = _paused(windows, call.engine, call.t_start)
    if window is None:
        return Scheduled(call.t_start, call.t_start)
    pause, resumed = window
    answered = pause.t_end is not None and pause.t_end <= call.t_start
    return Scheduled(resumed if answered else call.t_start, resumed)


def _stopped(windows: Windows, load: WireCall) -> float:
    """From when requests sent to ``load``'s engine are scheduled after it: its pause answered, or the load itself
    where nothing paused the engine."""
    window = _paused(windows, load.engine, load.t_start)
    return load.t_start if window is None or window[0].t_end is None else window[0].t_end


def _resets(h: History, engine: int) -> list[WireCall]:
    """The answered calls that dropped ``engine``'s cache: a flush, a pause that clears the caches (vLLM's
    ``clear_cache``). (SGLang's transfers flush too, by default: the situation is not built on SGLang.)"""
    return [w for w in h.integration_calls(engine=engine) if w.ok and w.t_end is not None and (
        w.path == "/flush_cache"
        or w.path == "/pause_generation" and isinstance(w.payload, dict) and w.payload.get("flush_cache") is True)]


def _loads(h: History, engine: int, adapter: Any) -> list[WireCall]:
    """The successful loads into ``engine`` of what a request naming ``adapter`` runs on: full weights, and the
    adapter's."""
    return [w for w in h.integration_calls(engine=engine) if w.ok and (
        w.path in WEIGHT_LOAD_PATHS
        or adapter is not None and w.path in LORA_LOAD_PATHS and isinstance(w.payload, dict)
        and w.payload.get("lora_name") == adapter)]


def prefix_hits(h: History) -> list[PrefixHit]:
    """Every integration request sent once its engine stopped admitting for a weight load (the load's pause answered,
    or the load itself where nothing paused), served from the prefix cache, attributed. A request in flight at the
    update is the pause mode's (``in_place`` keeps it on the KV it has): not here."""
    generates = [w for w in h.wire if w.path == "/generate"]
    served = [(w, cached_tokens(w)) for w in generates if w.origin == "integration"]
    if not any(cached for _, cached in served):
        return []
    windows: Windows = {engine: h.pause_windows(engine) for engine in {w.engine for w in generates}}
    at = {id(w): _scheduled(windows, w) for w in generates}
    resets = {engine: _resets(h, engine) for engine in windows}
    loads: dict[tuple[int, Any], list[WireCall]] = {}
    hits = []
    for call, cached in ((c, n) for c, n in served if n):
        when, key = at[id(call)], _key(call)
        if (call.engine, key[1]) not in loads:
            loads[call.engine, key[1]] = _loads(h, call.engine, key[1])
        load = next((w for w in reversed(loads[call.engine, key[1]]) if w.t_start < when.earliest), None)
        if load is None or call.t_start < _stopped(windows, load):
            continue
        reset = next((w for w in reversed(resets[call.engine]) if (w.t_end or 0.0) <= when.earliest), None)
        since = reset.t_end if reset is not None else float("-inf")
        prefix = _tokens(call)[:cached]
        covering = [w for w in generates if w is not call and w.engine == call.engine and _key(w) == key
                    and since < at[id(w)].earliest and at[id(w)].earliest <= when.earliest
                    and w.t_start < call.t_start and _covered(w)[:cached] == prefix]
        computed_by = covering[0] if covering else None
        recomputed_by = next((w for w in covering[1:] if cached_tokens(w) < cached
                              and at[id(w)].latest >= load.t_start), None)
        after_load = reset if reset is not None and reset.t_start >= load.t_start else None
        hits.append(PrefixHit(call, cached, when, load, after_load, computed_by,
                              None if computed_by is None else at[id(computed_by)], recomputed_by))
    return hits


def _why_not(backend: Backend) -> str | None:
    return backend.dialect.prefix_cache


SITUATION = Situation("prefix-after-load", "prompt served from the prefix cache after a weight load on its engine",
                      lambda h: bool(prefix_hits(h)), _why_not)
