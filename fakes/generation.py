"""Generation and the pause gate (SGLang's ``TokenizerManager.generate_request`` and the scheduler's outputs):
``/generate`` normalisation (batches, ``n > 1``, rids), the pause gate that parks new requests, the reader side of
the model-update lock, delivery of scheduler outputs (whole or streamed), aborts, ``/health``, ``/ready``,
``/pause_generation``, ``/continue_generation``, ``/abort_request`` and ``/update_weight_version``.

``GenerationMixin`` is mixed into ``FakeEngine``; the state it uses is set up by ``FakeEngine.__init__``.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from dataclasses import dataclass
from typing import Any, AsyncIterator, Mapping

from .asgi import Reply
from .failures import EngineClosed, EngineCrashed, error_reply
from .lora import _Adapter
from .scheduler import Request, StepResult, encode_text

PAUSED_BODY = {"message": "Generation paused successfully.", "status": "ok"}


CONTINUED_BODY = {"message": "Generation continued successfully.", "status": "ok"}


HEALTH_RID_PREFIX = "HEALTH_CHECK_"
_UUID4_CLEAR = ~((0xC000 << 48) | (0xF000 << 64)) & ((1 << 128) - 1)
_UUID4_SET = (0x8000 << 48) | (4 << 76)


class _Call:
    """One HTTP /generate call: the queue its requests' outputs go to (single consumer, unbounded; an
    ``asyncio.Queue`` without the ~3 KB and the locks it costs per call)."""

    __slots__ = ("_items", "_head", "_waiter")

    def __init__(self) -> None:
        self._items: list[Any] = []
        self._head = 0
        self._waiter: asyncio.Future | None = None

    def put_nowait(self, item: Any) -> None:
        self._items.append(item)
        waiter = self._waiter
        if waiter is not None:
            self._waiter = None
            if not waiter.done():
                waiter.set_result(None)

    async def get(self) -> Any:
        while self._head >= len(self._items):
            waiter = self._waiter = asyncio.get_running_loop().create_future()
            try:
                await waiter
            finally:
                if self._waiter is waiter:
                    self._waiter = None
        item = self._items[self._head]
        self._items[self._head] = None
        self._head += 1
        if self._head == len(self._items):
            self._items.clear()
            self._head = 0
        return item


@dataclass(eq=False, slots=True)
class _Sink:
    call: _Call
    index: int
    sent: int = 0  # output ids already streamed (delta streaming)
    adapter: _Adapter | None = None


@dataclass(frozen=True, slots=True)
class _Spec:
    """One normalized generate item (after batch / n>1 expansion)."""

    rid: str
    input_ids: list[int]
    sampling: Mapping[str, Any]
    lora: str | None
    return_logprob: bool
    return_text_in_logprobs: bool
    stream: bool


class GenerationMixin:
    """``/generate``, the pause gate, aborts, health, pause/continue and the version label of a ``FakeEngine``."""

    def _render(self, req: Request, sink: _Sink) -> dict[str, Any]:
        body = self.scheduler.render(req, since=sink.sent, label=self.weight_version)
        if sink.sent == 0 and self.profile.meta_info_response_sent_ts and "meta_info" in body:
            body["meta_info"]["response_sent_to_client_ts"] = time.time()  # the first output sent (wall clock)
        sink.sent = len(req.output_ids)
        return body

    def _deliver(self, result: StepResult) -> None:
        if result.produced_output:
            self._outputs += 1
        sinks = self._sinks
        for req in result.emitted:
            if req.stream:
                sink = sinks.get(req)
                if sink is not None:
                    sink.call.put_nowait((sink.index, self._render(req, sink), False))
        self._deliver_finished(result.finished)

    def _deliver_finished(self, reqs: list[Request] | tuple[Request, ...]) -> None:
        for req in reqs:
            sink = self._pop_sink(req)
            if sink is None:
                continue
            if sink.adapter is not None:
                sink.adapter.users -= 1
            sink.call.put_nowait((sink.index, self._render(req, sink), True))
        self._touch()

    def _add_sink(self, req: Request, sink: _Sink) -> None:
        self._sinks[req] = sink
        self._sink_rids[req.rid] = self._sink_rids.get(req.rid, 0) + 1

    def _pop_sink(self, req: Request) -> _Sink | None:
        sink = self._sinks.pop(req, None)
        if sink is not None:
            left = self._sink_rids[req.rid] - 1
            if left:
                self._sink_rids[req.rid] = left
            else:
                del self._sink_rids[req.rid]
        return sink

    def abort(self, rid: str = "", abort_all: bool = False) -> None:
        """``TokenizerManager.abort_request``: fire-and-forget. A rid the tokenizer does not hold (and an
        empty rid without ``abort_all``) is ignored; the scheduler then matches by prefix (managers/scheduler.py
        abort_request).
        Waiting-queue aborts are answered after the caller's handler returns (so on ≤0.5.16 they carry
        a version set right after the abort: tokenizer_manager.py _handle_abort_req)."""
        if not abort_all and rid not in self._sink_rids:
            return
        done = self.scheduler.abort(rid, abort_all)
        if done:
            if self._loop is not None and not self._loop.is_closed():
                self._loop.call_soon(self._deliver_finished, done)
            else:
                self._deliver_finished(done)
        self._touch()

    def _new_rid(self) -> str:
        """``uuid.UUID(int=<128 random bits>, version=4).hex``, without the UUID object."""
        value = self._rid_rng.getrandbits(128) & _UUID4_CLEAR | _UUID4_SET
        return f"{value:032x}"

    def normalize_generate(self, obj: Mapping[str, Any]) -> tuple[list[_Spec], bool]:
        """``GenerateReqInput.normalize_batch_and_arguments``: expand batch and ``n>1`` into items with rids.
        Returns (items, whether the answer is a list). Raises ValueError with SGLang's messages."""
        text, input_ids = obj.get("text"), obj.get("input_ids")
        # GenerateReqInput._validate_inputs refuses only none of text/input_ids/input_embeds, or all three (0.5.15,
        # 0.5.23 managers/io_struct.py); given text and input_ids, _tokenize_one_request uses the input_ids.
        if text is None and input_ids is None:
            raise ValueError("Either text, input_ids or input_embeds should be provided.")
        if input_ids is None and self.skip_tokenizer_init:  # tokenizer_manager._tokenize_one_request
            raise ValueError(
                "The engine initialized with skip_tokenizer_init=True cannot accept text prompts. Please provide "
                "input_ids or re-initialize the engine with skip_tokenizer_init=False.")
        if input_ids is None:
            is_batch = isinstance(text, list)
            prompts = [encode_text(t) for t in (text if is_batch else [text])]
        else:
            is_batch = bool(input_ids) and isinstance(input_ids[0], list)
            prompts = [list(p) for p in input_ids] if is_batch else [list(input_ids)]
        if not prompts:
            raise ValueError("The batch of prompts is empty.")
        params = obj.get("sampling_params") or {}
        if isinstance(params, list):
            if len(params) != len(prompts):
                raise ValueError("The length of sampling_params does not match the batch size.")
            per_prompt = [dict(p or {}) for p in params]
        else:
            per_prompt = [dict(params)] * len(prompts)
        n = int(per_prompt[0].get("n", 1) or 1)
        if n < 1:
            raise ValueError(f"n must be at least 1, got {n}.")
        items = prompts * n  # GenerateReqInput._expand_inputs: text * num
        item_params = per_prompt * n
        is_list = is_batch or n > 1
        rids = self._rids(obj.get("rid"), len(items), is_list)
        loras = obj.get("lora_path")
        lora_list = loras if isinstance(loras, list) else [loras] * len(items)
        if len(lora_list) != len(items):
            lora_list = (lora_list * n)[: len(items)]
        specs = []
        for rid, ids, sp, lora in zip(rids, items, item_params, lora_list):
            self._check_sampling(sp)
            specs.append(
                _Spec(
                    rid=rid,
                    input_ids=ids,
                    sampling=sp,
                    lora=lora,
                    return_logprob=bool(obj.get("return_logprob")),
                    return_text_in_logprobs=bool(obj.get("return_text_in_logprobs")),
                    stream=bool(obj.get("stream")),
                )
            )
        return specs, is_list

    def _rids(self, rid: Any, num: int, is_list: bool) -> list[str]:
        """``GenerateReqInput._normalize_rid``."""
        if rid is None:
            return [self._new_rid() for _ in range(num)]
        if isinstance(rid, list):
            if len(rid) != num:
                raise ValueError("The specified rids length mismatch with the batch_size for batch processing.")
            return [str(r) for r in rid]
        return [f"{rid}_{i}" for i in range(num)] if is_list else [str(rid)]

    @staticmethod
    def _check_sampling(sp: Mapping[str, Any]) -> None:
        max_new = sp.get("max_new_tokens", 128)
        if not isinstance(max_new, int) or isinstance(max_new, bool) or max_new < 0:
            raise ValueError(f"max_new_tokens must be at least 0, got {max_new}.")
        stop_ids = sp.get("stop_token_ids") or []
        if not isinstance(stop_ids, list) or (stop_ids and not all(isinstance(t, int) for t in stop_ids)):
            raise ValueError(f"stop_token_ids must be a list of ints, got {stop_ids!r}.")

    async def generate(self, obj: Mapping[str, Any]) -> Reply:
        """``POST /generate``: one object, a list (batch / n>1), or an SSE stream (tokenizer_manager.py
        _handle_batch_output)."""
        try:
            specs, is_list = self.normalize_generate(obj)
        except ValueError as e:
            return error_reply(400, str(e))
        if specs and specs[0].stream:
            return Reply(200, stream=self._stream(specs, is_list))
        results: list[Any] = [None] * len(specs)
        try:
            async for index, body in self.run_generate(specs):
                results[index] = body
        except ValueError as e:
            return error_reply(400, str(e))
        except (EngineCrashed, EngineClosed):
            return self.dead_reply("/generate")
        return Reply(200, results if is_list else results[0])

    async def _stream(self, specs: list[_Spec], is_list: bool) -> AsyncIterator[dict[str, Any]]:
        try:
            async for index, chunk in self.run_generate(specs, final_only=False):
                if is_list:
                    chunk = {**chunk, "index": index}
                yield chunk
        except ValueError as e:
            yield {"error": {"message": str(e)}}
        except (EngineCrashed, EngineClosed) as e:
            yield {"error": {"message": str(e)}}

    async def run_generate(self, specs: list[_Spec], final_only: bool = True) -> AsyncIterator[tuple[int, dict]]:
        """``TokenizerManager.generate_request``: pause gate → reader lock → LoRA (implicit reload)/rid checks →
        scheduler, yielding ``(index, body)`` as outputs arrive. Leaving early (client gone) aborts what is unfinished."""
        self._bind()
        self._raise_if_dead()
        if self.paused:  # _pass_gate returns at once otherwise
            await self._pass_gate([s.rid for s in specs])
        await self.update_lock.acquire_read()
        call = _Call()
        reqs: list[Request] = []
        try:
            await self._resolve_loras([s.lora for s in specs])
            reqs = self._dispatch(specs, call)
            remaining = len(reqs)
            while remaining:
                index, item, final = await call.get()
                if isinstance(item, BaseException):
                    raise item
                if final:
                    remaining -= 1
                if final or not final_only:
                    yield index, item
        finally:
            self._calls.discard(call)
            unfinished = [r for r in reqs if r in self._sinks]
            for req in unfinished:  # create_abort_task: the client left before the end
                self.abort(req.rid)
            for req in unfinished:
                sink = self._pop_sink(req)
                if sink is not None and sink.adapter is not None:
                    sink.adapter.users -= 1
            self.update_lock.release_read()

    async def _pass_gate(self, rids: list[str]) -> None:
        """``async with is_pause_cond: await wait_for(lambda: not is_pause)`` (tokenizer_manager.py)."""
        if not self.paused:
            return
        for rid in rids:
            self._event("request.parked", rid=rid)
        self._parked.extend(rids)
        self._touch()
        try:
            await self._wait_for(lambda: not self.paused)
        finally:
            for rid in rids:
                self._parked.remove(rid)
            self._touch()

    def _dispatch(self, specs: list[_Spec], call: _Call) -> list[Request]:
        """Validate LoRA names and rids, then hand the items to the scheduler (all or none)."""
        adapters = [self._lookup_adapter(s.lora) for s in specs]
        if self.profile.reject_duplicate_rid:
            held = self._sink_rids
            seen: set[str] = set()
            for s in specs:
                if s.rid in held or s.rid in seen:
                    raise ValueError(f"Duplicate request ID detected: {s.rid}")
                seen.add(s.rid)
        self._calls.add(call)
        reqs = []
        for index, (spec, adapter) in enumerate(zip(specs, adapters)):
            req = Request(
                rid=spec.rid,
                input_ids=spec.input_ids,
                max_new_tokens=spec.sampling.get("max_new_tokens", 128),
                stop_token_ids=tuple(spec.sampling.get("stop_token_ids") or ()),
                stop=_as_tuple(spec.sampling.get("stop")),
                lora=spec.lora,
                return_logprob=spec.return_logprob,
                return_text_in_logprobs=spec.return_text_in_logprobs,
                stream=spec.stream,
            )
            if adapter is not None:
                adapter.users += 1
                self._loras.move_to_end(adapter.name)
            self._add_sink(req, _Sink(call, index, adapter=adapter))
            self.scheduler.submit(req)
            reqs.append(req)
        self._touch()
        return reqs

    async def health(self) -> Reply:
        """``/health``, ``/health_generate``: a 1-token probe; 200 once any scheduler output arrives after
        the check started, 503 after ``health_check_timeout_s`` of engine time (http_server.py health_generate)."""
        if self.dead or self.server_status == "Starting":  # 503 until the warmup request succeeded
            return Reply(503)
        start = self._outputs
        self._health_checks += 1
        spec = _Spec(f"{HEALTH_RID_PREFIX}{self._health_checks}", [0], {"max_new_tokens": 1}, None, False, False, False)

        async def probe() -> None:
            with contextlib.suppress(ValueError, EngineCrashed, EngineClosed):
                async for _ in self.run_generate([spec]):
                    pass

        task = asyncio.get_running_loop().create_task(probe())
        self._background.add(task)
        task.add_done_callback(lambda t: (self._background.discard(t), self._touch()))
        ok = await self._engine_time_wait(lambda: task.done() or self._outputs > start, self.health_check_timeout_s)
        if not ok or self.dead:
            task.cancel()
            return Reply(503)
        return Reply(200)

    async def ready(self) -> Reply:
        """0.5.23 ``/ready``: ``is_ready() = not is_pause and is_healthy()`` (http_server.py:715)."""
        return Reply(503 if self.paused or self.dead else 200)

    async def pause_generation(self, obj: Mapping[str, Any] | None) -> Reply:
        """``/pause_generation`` (http_server.py, tokenizer_manager.py pause_generation). ≤0.5.4: body ignored,
        abort once, return."""
        mode = obj.get("mode", "abort") if (obj is not None and self.profile.pause_modes) else "abort"
        self.paused = True
        self.pause_mode = mode
        self._touch()
        if mode != "abort":
            self.scheduler.pause(mode)
        elif not self.profile.pause_abort_waits_for_readers:
            self.abort(abort_all=True)
        else:
            # loop {abort_request(abort_all=True); if not model_update_lock.is_locked(): break; sleep(1.0)}
            while True:
                self.abort(abort_all=True)
                if not self.update_lock.locked:
                    break
                await self._next_change()
                self._raise_if_dead()
        self._touch()
        return Reply(200, dict(PAUSED_BODY))

    async def continue_generation(self, obj: Mapping[str, Any] | None) -> Reply:
        """``/continue_generation``: reopen the gate and resume the scheduler (``torch_empty_cache`` is a no-op)."""
        self.paused = False
        self.pause_mode = None
        self.scheduler.resume()
        self._touch()
        return Reply(200, dict(CONTINUED_BODY))

    async def abort_request(self, obj: Mapping[str, Any]) -> Reply:
        """``/abort_request``: 200 with an empty body, immediately (http_server.py abort_request)."""
        rids = obj.get("rid")
        for rid in rids if isinstance(rids, list) else [rids or ""]:
            self.abort(rid, bool(obj.get("abort_all")))
        return Reply(200)

    async def update_weight_version(self, obj: Mapping[str, Any]) -> Reply:
        """``/update_weight_version``: abort all (default True!) then set the label (http_server.py
        update_weight_version)."""
        if obj["abort_all_requests"]:
            self.abort(abort_all=True)
        version = obj["new_version"]
        self._set_version(version, "update_weight_version")
        return Reply(200, {"success": True, "message": f"Weight version updated to {version}", "new_version": version})

    def _set_version(self, version: str, cause: str) -> None:
        self.weight_version = version
        self.scheduler.set_version(version, cause)
        self._touch()


def _as_tuple(value: Any) -> tuple[str, ...]:
    if value is None:
        return ()
    return (value,) if isinstance(value, str) else tuple(value)
