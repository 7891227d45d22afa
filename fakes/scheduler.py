"""The pure, synchronous scheduler core of the fake SGLang engine. No asyncio, no I/O.

Models SGLang's scheduler as far as weight sync can observe it (``python/sglang/srt/managers/scheduler.py``): a waiting
queue and a running batch of at most ``max_running_requests``; each ``step()`` is one decode iteration
(admit + prefill, then every running request emits one token stamped with the current weight version);
aborts, pause modes (``in_place``/``retract``), retraction, the flush idle predicate and the response
bodies (``meta_info``) per profile. The async engine (``engine.py``) and the Hypothesis state machine
both drive this class directly.

Fake tokenizer: token ids are UTF-8 bytes; output tokens are printable ASCII (32..126) derived from
``(seed, rid, position)``, so ``text`` always decodes and a request's tokens survive retraction unchanged.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Any, Literal

from .clock import Clock, ManualClock
from .events import EventLog
from .profiles import Profile, get_profile

WAITING, RUNNING, FINISHED = "waiting", "running", "finished"
SchedulerPauseMode = Literal["in_place", "retract"]
SCHEDULER_PAUSE_MODES: tuple[str, ...] = ("in_place", "retract")

_FIRST_PRINTABLE, _NUM_PRINTABLE = 32, 95


def encode_text(text: str) -> list[int]:
    """The fake tokenizer: UTF-8 bytes are token ids."""
    return list(text.encode("utf-8"))


def decode_ids(ids: list[int]) -> str:
    """Inverse of ``encode_text`` (ids outside 0..255 are dropped)."""
    return bytes(i for i in ids if 0 <= i < 256).decode("utf-8", errors="replace")


def abort_finish_reason(message: str = "Aborted") -> dict[str, Any]:
    """``FINISH_ABORT.to_json()`` of a user-initiated abort of a running request (managers/schedule_batch.py)."""
    return {"type": "abort", "message": message, "status_code": None, "err_type": None}


def _hash64(*parts: object) -> int:
    digest = hashlib.blake2b(":".join(map(str, parts)).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big")


_blake2b = hashlib.blake2b
# -round(k / 1000 + 0.001, 4) for every k = (h >> 16) % 4000: one shared float per value, no rounding per token.
_LOGPROBS: tuple[float, ...] = tuple(-round(k / 1000 + 0.001, 4) for k in range(4000))


@dataclass(eq=False, slots=True)
class Request:
    """One generate request as the scheduler holds it (identity-hashed: rids may repeat on 0.5.4)."""

    rid: str
    input_ids: list[int]
    max_new_tokens: int = 128
    stop_token_ids: tuple[int, ...] = ()
    stop: tuple[str, ...] = ()
    lora: str | None = None
    return_logprob: bool = False
    return_text_in_logprobs: bool = False
    stream: bool = False
    # progress, owned by the scheduler
    output_ids: list[int] = field(default_factory=list)
    token_versions: list[str] = field(default_factory=list)
    token_weights: list[int] = field(default_factory=list)
    """Per token, the engine's weights when it was decoded (:attr:`Scheduler.weights_tag`): the suite's truth."""
    token_logprobs: list[float] = field(default_factory=list)
    cached_tokens: int = 0
    """Prompt tokens served from the prefix cache at its first scheduling (vLLM's ``num_cached_tokens``; the fake
    SGLang keeps no radix cache: 0)."""
    state: str = WAITING
    retractions: int = 0
    abort_pending: bool = False
    finish_reason: dict[str, Any] | None = None
    aborted_in_waiting_queue: bool = False
    submitted_at: float = 0.0
    finished_at: float | None = None
    serial: int = -1

    @property
    def finished(self) -> bool:
        return self.state == FINISHED

    @property
    def text(self) -> str:
        """Decoded output; a matched stop string is trimmed as SGLang does by default."""
        text = decode_ids(self.output_ids)
        matched = (self.finish_reason or {}).get("matched")
        if self.finish_reason and self.finish_reason.get("type") == "stop" and isinstance(matched, str):
            if text.endswith(matched):
                text = text[: len(text) - len(matched)]
        return text

    def spans(self, current_version: str) -> list[dict[str, Any]]:
        """Per-token version spans (``utils/weight_versions.py`` 0.5.23: end exclusive, empty spans
        dropped, a request without output gets one empty span of the current version)."""
        spans: list[dict[str, Any]] = []
        for i, version in enumerate(self.token_versions):
            if spans and spans[-1]["version"] == version:
                spans[-1]["end"] = i + 1
            else:
                spans.append({"version": version, "start": i, "end": i + 1})
        return spans or [{"version": current_version, "start": 0, "end": 0}]

    def weight_counts(self) -> list[list[int]]:
        """``[[weights tag, tokens decoded on them], …]`` in decode order (the engine's truth, never answered)."""
        counts: list[list[int]] = []
        for tag in self.token_weights:
            if counts and counts[-1][0] == tag:
                counts[-1][1] += 1
            else:
                counts.append([tag, 1])
        return counts


@dataclass(frozen=True)
class StepResult:
    """What one decode iteration did: who was admitted, who emitted a token and kept going, who finished."""

    admitted: tuple[Request, ...] = ()
    emitted: tuple[Request, ...] = ()
    finished: tuple[Request, ...] = ()

    @property
    def produced_output(self) -> bool:
        return bool(self.emitted or self.finished)


class Scheduler:
    """Waiting queue + running batch + pause state + weight version, stepped by the caller."""

    def __init__(
        self,
        profile: Profile | str | None,
        max_running_requests: int = 64,
        clock: Clock | None = None,
        seed: int = 0,
        *,
        version: str = "default",
        events: EventLog | None = None,
        engine_id: str = "e0",
        trace_tokens: bool = False,
    ) -> None:
        if max_running_requests < 1:
            raise ValueError(f"max_running_requests must be >= 1, got {max_running_requests}")
        self.profile = get_profile(profile) if profile is not None else None
        """The SGLang release's switches (the flush predicate, abort and render rules); None for an engine of
        another family, which renders its own answers and ends requests with :meth:`finish_now`."""
        self.max_running_requests = max_running_requests
        self.clock: Clock = clock if clock is not None else ManualClock()
        self.seed = seed
        self.version = version
        self.weights_tag = 0
        """Which weights the engine holds: bumped by each ``weights.load`` / ``weights.lost`` event, stamped on every
        token decoded (the per-decode-step truth P8 reads on the fake)."""
        self.events = events if events is not None else EventLog()
        self.engine_id = engine_id
        self.trace_tokens = trace_tokens
        self.running: list[Request] = []
        self.waiting: list[Request] = []
        self.pause_mode: str | None = None
        self.hold_new = False
        """Admit nothing from the waiting queue while the running batch goes on decoding (vLLM's ``PAUSED_NEW``:
        ``vllm/v1/core/sched/scheduler.py`` schedules no waiting request unless ``UNPAUSED``)."""
        self._serial = 0

    # -- state queries ------------------------------------------------------------------------
    @property
    def paused(self) -> bool:
        """The scheduler's ``_engine_paused`` (set by pause ``in_place``/``retract`` only)."""
        return self.pause_mode is not None

    def live(self) -> list[Request]:
        """Every request the scheduler holds (running first, then waiting)."""
        return self.running + self.waiting

    def find(self, rid: str) -> Request | None:
        """The live request with exactly this rid, if any."""
        return next((r for r in self.live() if r.rid == rid), None)

    def has_work(self) -> bool:
        """Whether a step would do anything (a held waiting queue is no work: :attr:`hold_new`)."""
        return bool(self.running or (self.waiting and not self.hold_new))

    def is_idle_for_flush(self) -> bool:
        """``Scheduler.flush_cache``'s idle predicate for this profile (is_fully_idle)."""
        if self.running:
            return False
        if not self.profile.flush_checks_waiting:
            return True
        if self.profile.flush_ignores_waiting_while_paused and self.paused:
            return True  # 0.5.23: is_fully_idle(ignore_waiting=self._engine_paused)
        return not self.waiting

    def snapshot(self) -> dict[str, Any]:
        return {
            "running": [r.rid for r in self.running],
            "waiting": [r.rid for r in self.waiting],
            "scheduler_paused": self.paused,
            "scheduler_pause_mode": self.pause_mode,
            "scheduler_version": self.version,
        }

    # -- transitions --------------------------------------------------------------------------
    def submit(self, req: Request) -> Request:
        """Queue a new request (it is prefilled on a later ``step``)."""
        if req.state != WAITING or req.serial >= 0:
            raise ValueError(f"request {req.rid!r} was already submitted")
        req.serial = self._serial
        self._serial += 1
        req.submitted_at = self.clock.now()
        self.waiting.append(req)
        self._event(
            "request.submit",
            rid=req.rid,
            prompt_tokens=len(req.input_ids),
            max_new_tokens=req.max_new_tokens,
            lora=req.lora,
            stream=req.stream,
        )
        return req

    def step(self) -> StepResult:
        """One decode iteration; a no-op while paused (the event loop ``continue``s: event_loop_normal)."""
        if self.paused:
            return StepResult()
        admitted = self._admit()
        emitted: list[Request] = []
        finished: list[Request] = []
        decode, finish_reason = self._decode_one, self._finish_reason
        for req in self.running:
            if req.abort_pending or len(req.output_ids) >= req.max_new_tokens:
                reason = finish_reason(req, decode(req) if req.abort_pending else None)
            else:
                token = decode(req)
                # _finish_reason(req, token), without the call when no rule can fire
                if len(req.output_ids) < req.max_new_tokens and not req.stop_token_ids and not req.stop:
                    reason = None
                else:
                    reason = finish_reason(req, token)
            if reason is None:
                emitted.append(req)
            else:
                self._finish(req, reason, detach=False)
                finished.append(req)
        if finished:  # leave the batch at once (one pass, not one list.remove per finished request)
            gone = set(finished)
            self.running[:] = [r for r in self.running if r not in gone]
        return StepResult(tuple(admitted), tuple(emitted), tuple(finished))

    def abort(self, rid: str = "", abort_all: bool = False) -> list[Request]:
        """Scheduler-side ``AbortReq``: match by rid **prefix** (``req.rid.startswith(rid)``).

        Running matches get ``to_finish`` and finish with ``abort`` on their next decode step (one
        extra token; after ``resume`` when paused). Waiting/retracted matches finish now with the
        profile's waiting-queue abort; they are returned so the caller can answer them.
        """
        hit = (lambda r: True) if abort_all else (lambda r: r.rid.startswith(rid))
        for req in self.running:
            if hit(req):
                req.abort_pending = True
        done: list[Request] = []
        for req in [r for r in self.waiting if hit(r)]:
            self.waiting.remove(req)
            req.aborted_in_waiting_queue = True
            before_prefill = self.profile.waiting_abort_style == "before_prefill"
            message = "Abort before prefill" if before_prefill else "Abort in waiting queue"
            self._finish(req, {"type": "abort", "message": message})
            done.append(req)
        return done

    def finish_now(self, reqs: list[Request], reason: dict[str, Any]) -> None:
        """End ``reqs`` (running or waiting) at once with ``reason``, without another decode step (vLLM's
        ``Scheduler.finish_requests``: an aborted request ends with the tokens it has)."""
        gone = set(reqs)
        self.running[:] = [r for r in self.running if r not in gone]
        self.waiting[:] = [r for r in self.waiting if r not in gone]
        for req in reqs:
            self._finish(req, reason, detach=False)

    def pause(self, mode: str) -> list[Request]:
        """``_engine_paused = True`` in ``in_place`` or ``retract`` mode (abort mode is tokenizer-only and
        never reaches the scheduler: 0.5.23 asserts this). Returns the requests retracted."""
        if mode not in SCHEDULER_PAUSE_MODES:
            raise ValueError(f"scheduler pause mode must be one of {SCHEDULER_PAUSE_MODES}, got {mode!r}")
        self.pause_mode = mode
        return self.retract_all() if mode == "retract" else []

    def resume(self) -> None:
        """``ContinueGenerationReqInput``: ``_engine_paused = False``."""
        self.pause_mode = None

    def retract_all(self) -> list[Request]:
        """Move every running request back to the waiting queue, keeping its tokens (re-prefilled later)."""
        retracted, self.running = self.running, []
        for req in retracted:
            req.state = WAITING
            req.retractions += 1
            self._event(
                "request.retract", rid=req.rid, completion_tokens=len(req.output_ids), retractions=req.retractions
            )
        # FCFS by arrival: retracted (older) requests are re-admitted before newer waiting ones.
        self.waiting = sorted(self.waiting + retracted, key=lambda r: r.serial)
        return retracted

    def set_version(self, version: str, cause: str = "") -> None:
        """Change the version stamped on tokens from now on (``record_weight_version_change``)."""
        old, self.version = self.version, version
        self._event("version.change", old=old, new=version, cause=cause)

    # -- response bodies (tokenizer_manager.py) ------------------------------------------------------
    def render(self, req: Request, *, since: int = 0, label: str | None = None) -> dict[str, Any]:
        """The /generate JSON object for ``req`` now: the final one if finished, else a streaming chunk.

        ``label`` is the tokenizer-side ``weight_version`` at output time (defaults to the scheduler's);
        ``since`` is how many output ids a delta-streaming client already has.
        """
        label = self.version if label is None else label
        if req.aborted_in_waiting_queue:
            return self._render_waiting_abort(req, label)
        final = req.finished
        first = since if req.stream and not self.profile.stream_cumulative_output_ids else 0
        meta: dict[str, Any] = {
            "id": req.rid,
            "finish_reason": req.finish_reason if final else None,
            "prompt_tokens": len(req.input_ids),
            "weight_version": label,
        }
        if self.profile.retraction_key:
            meta[self.profile.retraction_key] = req.retractions
        meta["completion_tokens"] = len(req.output_ids)
        meta["cached_tokens"] = 0
        if self.profile.reasoning_tokens:
            meta["reasoning_tokens"] = 0
        if req.return_logprob:
            meta.update(self._logprobs(req, first))
        if final and self.profile.weight_versions_spans:
            self._add_spans(meta, req)
        if self.profile.meta_info_cache_details:  # one engine, no cache breakdown: both null (fact of the name)
            meta["cached_tokens_details"] = None
            meta["dp_rank"] = None
        if final:
            meta["e2e_latency"] = self._latency(req)
        return {"text": req.text, "output_ids": list(req.output_ids[first:]), "meta_info": meta}

    def _render_waiting_abort(self, req: Request, label: str) -> dict[str, Any]:
        if self.profile.waiting_abort_style == "before_prefill":
            # 0.5.2 tokenizer_manager.py:1505: no output_ids, no weight_version, no logprobs.
            meta = {"id": req.rid, "finish_reason": req.finish_reason, "prompt_tokens": 0, "completion_tokens": 0}
            return {"text": "", "meta_info": meta}
        meta = {"id": req.rid, "finish_reason": req.finish_reason}
        if self.profile.waiting_abort_meta_version:
            meta["weight_version"] = label
            meta["e2e_latency"] = self._latency(req)
        if req.return_logprob:
            meta.update(self._logprobs(req, 0))
        if self.profile.weight_versions_spans:
            self._add_spans(meta, req)
        meta["completion_tokens"] = len(req.output_ids)  # no prompt_tokens on this path (_handle_abort_req)
        ids = req.output_ids[-1:] if req.stream else req.output_ids
        return {"text": req.text, "output_ids": list(ids), "meta_info": meta}

    def _add_spans(self, meta: dict[str, Any], req: Request) -> None:
        spans = req.spans(self.version)
        meta["weight_versions"] = spans
        meta["weight_version"] = spans[-1]["version"]  # add_weight_versions_to_meta_info (0.5.23)

    def _logprobs(self, req: Request, first: int) -> dict[str, Any]:
        triples = [
            [lp, tok, decode_ids([tok]) if req.return_text_in_logprobs else None]
            for lp, tok in zip(req.token_logprobs[first:], req.output_ids[first:])
        ]
        # input_token_logprobs is empty with the default logprob_start_len=-1 (0.5.10 scheduler.py:1877); the length
        # is tokenizer_manager.py's add_logprob_to_meta_info (0.5.10-0.5.23; found by python -m gpu.fidelity).
        return {"output_token_logprobs": triples, "input_token_logprobs": [],
                "output_token_logprobs_length": len(triples)}

    def _latency(self, req: Request) -> float:
        end = req.finished_at if req.finished_at is not None else self.clock.now()
        return round(end - req.submitted_at, 6)

    # -- internals ----------------------------------------------------------------------------
    def _admit(self) -> list[Request]:
        if self.hold_new:
            return []
        room = self.max_running_requests - len(self.running)
        if room <= 0 or not self.waiting:
            return []
        admitted = self.waiting[:room]  # FCFS: the head of the waiting queue
        del self.waiting[:room]
        for req in admitted:
            req.state = RUNNING
            self.running.append(req)
            self._event(
                "request.admit",
                rid=req.rid,
                prefill_tokens=len(req.input_ids) + len(req.output_ids),
                retractions=req.retractions,
            )
        return admitted

    def _decode_one(self, req: Request) -> int:
        position = len(req.output_ids)
        # == _hash64(self.seed, req.rid, position), inlined (it runs once per token)
        h = int.from_bytes(_blake2b(f"{self.seed!s}:{req.rid!s}:{position}".encode(), digest_size=8).digest(), "big")
        token = _FIRST_PRINTABLE + h % _NUM_PRINTABLE
        req.output_ids.append(token)
        req.token_versions.append(self.version)
        req.token_weights.append(self.weights_tag)
        req.token_logprobs.append(_LOGPROBS[(h >> 16) % 4000])
        if self.trace_tokens:
            self._event("request.token", rid=req.rid, index=position, token=token, version=self.version)
        return token

    def _finish_reason(self, req: Request, token: int | None) -> dict[str, Any] | None:
        """``Req.check_finished`` order: to_finish, length, stop token, stop string."""
        if req.abort_pending:
            return abort_finish_reason()
        if len(req.output_ids) >= req.max_new_tokens:
            return {"type": "length", "length": req.max_new_tokens}
        if token is not None and token in req.stop_token_ids:
            return {"type": "stop", "matched": token}
        if token is not None and req.stop:
            text = decode_ids(req.output_ids)
            for stop in req.stop:
                if stop and text.endswith(stop):
                    return {"type": "stop", "matched": stop}
        return None

    def _finish(self, req: Request, reason: dict[str, Any], *, detach: bool = True) -> None:
        if detach and req in self.running:
            self.running.remove(req)
        req.state = FINISHED
        req.finish_reason = reason
        req.finished_at = self.clock.now()
        self._event(
            "request.finish",
            rid=req.rid,
            finish_reason=reason,
            completion_tokens=len(req.output_ids),
            versions=req.spans(self.version),
            weights=req.weight_counts(),
        )

    def _event(self, kind: str, **fields: Any) -> None:
        self.events.record(self.clock.now(), kind, self.engine_id, **fields)
