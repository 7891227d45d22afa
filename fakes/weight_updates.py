"""Weight updates per transport (SGLang's tokenizer ``update_weights_from_*`` + scheduler ``weight_updater``): the
shared update cycle (abort, writer lock unless paused, load, post-update flush, version stamp), loading as the
model's ``load_weights`` does, disk / tensor / distributed transports, weight-update groups and sessions,
``/get_weights_by_name``, ``/flush_cache`` and ``/release_memory_occupation`` / ``/resume_memory_occupation``.

``WeightUpdatesMixin`` is mixed into ``FakeEngine``; the state it uses is set up by ``FakeEngine.__init__``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any, Awaitable, Callable, Mapping

from . import weights as W
from .facts import SGLANG
from .asgi import JSON_NULL, Reply
from .failures import EngineClosed, EngineCrashed, _flush_fault, error_reply

logger = logging.getLogger(__name__)

FLUSH_OK_TEXT = (
    "Cache flushed.\nPlease check backend logs for more details. "
    "(When there are running or waiting requests, the operation will not be performed.)\n"
)


FLUSH_AFTER_UPDATE_ASSERT = SGLANG.answer("post_update_flush_crash").text()
"""Why the scheduler dies when the flush after a weight update fails (fact ``post_update_flush_failure``: crash)."""


FLUSH_AFTER_UPDATE_ERROR = SGLANG.answer("post_update_flush").text()
"""The 400 message when the flush after a weight update fails (fact ``post_update_flush_failure``: error)."""


class WeightUpdatesMixin:
    """Weight updates, groups, sessions, flush and memory occupation of a ``FakeEngine``."""

    async def _weight_update(
        self,
        source: str,
        obj: Mapping[str, Any],
        load: Callable[[], Awaitable[W.WeightStore | str]],
        ok_message: str,
        flush: bool,
        extra: Mapping[str, Any] | None = None,
        needs_session: bool = False,
    ) -> Reply:
        """The shared update cycle (tokenizer_control_mixin.py / scheduler_components/weight_updater.py,
        0.5.23): abort → lock (skipped while paused ≥0.5.6) → load →
        post-update flush → version stamp. ``load`` returns the new store, or a failure message."""
        extra = dict(extra or {})
        if obj.get("abort_all_requests"):
            self.abort(abort_all=True)
        try:
            async with self._writer_unless_paused():
                if needs_session and not self.session_open:
                    message = SGLANG.answer("session_required").text(source=source)
                    return Reply(400, {"success": False, "message": message, **extra})
                loaded = await load()
                self._raise_if_dead()
                if isinstance(loaded, str):
                    return Reply(400, {"success": False, "message": loaded, **extra})
                return self._apply_update(source, obj, loaded, ok_message, flush, extra)
        except (EngineCrashed, EngineClosed):
            return self.dead_reply(f"/{source}")

    def _writer_unless_paused(self) -> contextlib.AbstractAsyncContextManager[Any]:
        """The writer side of ``model_update_lock`` (it waits for every ``/generate`` in flight, each holding the
        reader side to its end), skipped while paused (≥0.5.6: whoever paused holds it)."""
        skip_lock = self.paused and self.profile.paused_updates_skip_lock
        return contextlib.nullcontext() if skip_lock else self.update_lock.write()

    def _apply_update(
        self, source: str, obj: Mapping[str, Any], loaded: W.WeightStore, ok_message: str, flush: bool, extra: dict
    ) -> Reply:
        self.weights = loaded
        self._weights_event("weights.load", source=source, model_path=obj.get("model_path"))
        version = obj.get("weight_version")
        if flush and not self._flush_now():
            if self.profile.post_update_flush_failure == "crash":
                self.crash(FLUSH_AFTER_UPDATE_ASSERT)
                return self.dead_reply(f"/{source}")
            if version is not None:  # 0.5.23: scheduler-side version recorded, tokenizer label not (code-read)
                self.scheduler.set_version(version, f"{source} (cache flush failed)")
            return Reply(400, {"success": False, "message": FLUSH_AFTER_UPDATE_ERROR, **extra})
        if source == "update_weights_from_disk":  # the tokenizer records the path only on success
            self.model_path = obj["model_path"]
        message = ok_message
        if version is not None:
            self._set_version(version, source)
            message += f" Weight version updated to {version}."
        return Reply(200, {"success": True, "message": message, **extra})

    def _merged(self, blobs: Mapping[str, W.TensorBlob], source: str, strict: bool = False) -> W.WeightStore:
        """The weights after loading ``blobs`` as the model's ``load_weights`` does (``models/llama.py``, the same
        in ``qwen2.py``/``qwen3.py``, 0.5.4–0.5.23): a name the model lacks is skipped with
        ``logger.warning("Parameter <name> not found in params_dict")`` (silently for the names its stacked
        q/k/v and gate/up mapping or its skip rules swallow) and the rest load; the update succeeds. A shape
        mismatch raises (``default_weight_loader``'s assert). ``strict_weights`` refuses unknown names instead."""
        if not (self.strict_weights or strict):
            unknown = [name for name in blobs if name not in self.weights]
            for name in unknown:
                silent = _silently_skipped(name, self.model.config)
                message = None if silent else f"Parameter {name} not found in params_dict"
                if message is not None:
                    logger.warning(message)
                self._event("weights.skipped", name=name, source=source, message=message)
            if unknown:
                blobs = {name: blob for name, blob in blobs.items() if name in self.weights}
        return self.weights.updated(blobs, cast=True)

    def _keep_partial(self, error: Exception, source: str) -> None:
        """A load that failed part-way leaves the parameters before the failing one loaded (SGLang copies them one
        by one and restores nothing: "The full weights of the ModelRunner are partially updated. Please discard the
        whole weights.", ``model_runner_components/weight_updater.py``, 0.5.23; the same loader in 0.5.10-0.5.16)."""
        partial = getattr(error, "partial", None)
        if partial is not None:
            self.weights = partial
            self._weights_event("weights.load", source=f"{source} (partial)", model_path=None)

    def _flush_now(self) -> bool:
        """One flush attempt: the profile's idle predicate, unless a ``flush_fail`` fault is active."""
        return self.scheduler.is_idle_for_flush() and not _flush_fault.get()

    async def update_weights_from_disk(self, obj: Mapping[str, Any]) -> Reply:
        """``/update_weights_from_disk``: read the checkpoint. A failure before loading (no such folder, no weight
        files) answers 400 and keeps the weights. A failure while the files load (a truncated file, a shape that does
        not fit) is followed by SGLang's "rollback", which re-reads the same folder and kills the server when it
        still fails (``SGLANG.load_failure_kills["disk"]``); when the folder has meanwhile become readable (a
        checkpoint still being written), the "rollback" loads it and the answer is the 400 ``disk_load`` answer
        ("Rolling back to original weights") with the new weights in place. ``strict_weights`` (opt-in) refuses with
        the 400 and keeps the weights."""

        missing_shards = "error" if self.profile.missing_shard_fails else "skip"

        async def read() -> W.WeightStore:
            blobs = await asyncio.to_thread(W.load_checkpoint, obj["model_path"], obj.get("load_format"),
                                            strict=self.strict_weights, missing_shards=missing_shards)
            return self._merged(blobs, "update_weights_from_disk")

        async def load() -> W.WeightStore | str:
            try:
                return await read()
            except W.CheckpointError as e:
                if e.stage != "load" or self.strict_weights:
                    return _disk_failure(e, e.stage)
                failure: W.WeightError = e
            except W.WeightError as e:
                if self.strict_weights:
                    return _disk_failure(e, "load")
                failure = e
            try:
                self.weights = await read()  # the "rollback": the same folder again
            except W.WeightError as again:
                self.crash(f"{type(again).__name__} in update_weights_from_disk's rollback (it re-reads "
                           f"{obj['model_path']}): {again}")
                raise EngineCrashed(self.crash_reason) from None
            self._weights_event("weights.load", source="update_weights_from_disk (rollback)",
                        model_path=obj.get("model_path"))
            return _disk_failure(failure, "load")

        flush = obj.get("flush_cache", True) if self.profile.disk_flush_cache_field else True
        return await self._weight_update(
            "update_weights_from_disk",
            obj,
            load,
            "Succeeded to update model weights.",
            flush,
            {"num_paused_requests": 0},
        )

    async def update_weights_from_tensor(self, obj: Mapping[str, Any]) -> Reply:
        """``/update_weights_from_tensor``: decode this rank's payload. SGLang's model runner has no
        try/except here (``update_weights_from_tensor`` → ``load_weights``), so a bad payload or unknown
        parameter kills the scheduler: the fake crashes."""

        async def load() -> W.WeightStore | str:
            try:
                load_format = obj.get("load_format")
                items = obj["serialized_named_tensors"]
                # tp_worker.deserialize_own_rank: each TP rank takes items[tp_rank] (a LocalSerializedTensor inside
                # is unwrapped for that rank, weight_updater._unwrap_tensor). Rank 0's item is decoded; the other
                # ranks' items must be there (IndexError otherwise) but are not opened: a CPU shared-memory handle
                # opens once, where CUDA IPC handles open on every rank.
                blobs = W.decode_tensor_payload(items[0], tp_rank=0, load_format=load_format,
                                                release=self.profile.version)
                if len(items) < self.tp_size:
                    raise IndexError(f"list index out of range: {len(items)} serialized_named_tensors item(s) "
                                     f"for tp_size {self.tp_size}")
                if load_format == "direct":  # _model_load_weights_direct: params_dict[name], the model's own names
                    stacked = next((n for n in blobs if any(part in n for part in _STACKED)), None)
                    if stacked is not None:  # q/k/v and gate/up live stacked (qkv_proj, gate_up_proj): a KeyError
                        raise KeyError(repr(stacked))  # (measured on real 0.5.23: the server exits)
                return self._merged(blobs, "update_weights_from_tensor", strict=load_format == "direct")
            except (W.WeightError, IndexError, KeyError) as e:
                self.crash(f"{type(e).__name__} in update_weights_from_tensor: {e}")
                raise EngineCrashed(self.crash_reason) from None

        return await self._weight_update(
            "update_weights_from_tensor",
            obj,
            load,
            "Success",
            bool(obj.get("flush_cache", True)),
            needs_session=self.profile.weight_update_sessions,
        )

    async def update_weights_from_distributed(self, obj: Mapping[str, Any]) -> Reply:
        """``/update_weights_from_distributed``: receive the broadcast on the named group. An unknown group
        hits an ``assert`` outside the model runner's try (scheduler_update_weights_mixin.py, ≤0.5.16): the fake
        crashes; 0.5.23's scheduler catches the receive and answers 400 (answer ``distributed_receive``, fact
        ``distributed_receive_errors_answered``)."""

        async def load() -> W.WeightStore | str:
            groups = self._groups.get(obj["group_name"])
            answered = self.profile.distributed_receive_errors_answered  # 0.5.23 catches the receive
            if groups is None:
                reason = (f"Group {obj['group_name']} not in {list(self._groups)}. "
                          "Please call `init_weights_update_group` first.")
                if answered:
                    return SGLANG.answer("distributed_receive").text(error=reason)
                self.crash(f"AssertionError: {reason}")
                raise EngineCrashed(self.crash_reason)
            try:
                received = await asyncio.gather(*(  # every TP rank receives every broadcast
                    asyncio.to_thread(g.receive, obj["names"], obj["dtypes"], obj["shapes"],
                                      load_format=obj.get("load_format")) for g in groups))
            except Exception as e:  # noqa: BLE001 - 0.5.23 catches the receive apart from the load
                if answered:
                    return SGLANG.answer("distributed_receive").text(error=e)
                return _partial_update_message(e)
            try:
                return self._merged(received[0], "update_weights_from_distributed")
            except Exception as e:  # noqa: BLE001 - model_runner catches Exception here
                self._keep_partial(e, "update_weights_from_distributed")
                return _partial_update_message(e)

        return await self._weight_update(
            "update_weights_from_distributed",
            obj,
            load,
            "Succeeded to update parameter online.",
            bool(obj.get("flush_cache", True)),
            needs_session=self.profile.weight_update_sessions,
        )

    async def init_weights_update_group(self, obj: Mapping[str, Any]) -> Reply:
        """``/init_weights_update_group``: every TP rank joins the trainer's group as ``rank_offset + tp_rank``
        (blocks until all join; no lock)."""
        joins = [asyncio.to_thread(W.DistributedGroup.join, obj["master_address"], obj["master_port"],
                                   obj["rank_offset"] + tp_rank, obj["world_size"], obj["group_name"], obj["backend"],
                                   self.group_timeout_s)
                 for tp_rank in range(self.tp_size)]
        groups = await asyncio.gather(*joins, return_exceptions=True)
        failed = [g for g in groups if isinstance(g, BaseException)]
        if failed:
            for group in groups:
                if not isinstance(group, BaseException):
                    await asyncio.to_thread(group.destroy)
            message = f"Failed to initialize custom process group: {failed[0]}."
            return Reply(400, {"success": False, "message": message})
        self._groups[obj["group_name"]] = groups
        return Reply(200, {"success": True, "message": "Succeeded to initialize custom process group."})

    async def destroy_weights_update_group(self, obj: Mapping[str, Any]) -> Reply:
        groups = self._groups.pop(obj["group_name"], None)
        if groups is None:
            return Reply(400, {"success": False, "message": "The group to be destroyed does not exist."})
        for group in groups:
            await asyncio.to_thread(group.destroy)
        return Reply(200, {"success": True, "message": "Succeeded to destroy custom process group."})

    async def begin_weight_update(self, obj: Mapping[str, Any]) -> Reply:
        """0.5.23 ``/begin_weight_update`` (``scheduler_components/weight_updater.py``), under the writer lock
        unless paused (``tokenizer_control_mixin.py`` ``_weight_update_session_call``): with a request decoding it
        answers once that request ended (measured: the state matrix)."""
        async with self._writer_unless_paused():
            if self.session_open:
                message = SGLANG.answer("session_already_open").text()
                return Reply(400, {"success": False, "message": message})
            self.session_open = True
            return Reply(200, {"success": True, "message": "Success"})

    async def end_weight_update(self, obj: Mapping[str, Any]) -> Reply:
        """0.5.23 ``/end_weight_update``: the same lock as :meth:`begin_weight_update`, also when no session is
        open (the check runs in the scheduler, after the lock)."""
        async with self._writer_unless_paused():
            if not self.session_open:
                message = SGLANG.answer("no_session_open").text()
                return Reply(400, {"success": False, "message": message})
            self.session_open = False
            return Reply(200, {"success": True, "message": "Success"})

    async def get_weights_by_name(self, obj: Mapping[str, Any]) -> Reply:
        blob = self.weights.get(obj["name"])
        values = None if blob is None else W.values_preview(blob, obj["truncate_size"])
        if values is None:
            return error_reply(400, "Get parameter by name failed")
        return Reply(200, values)

    async def flush_cache(self, timeout: float = 0.0) -> Reply:
        """``/flush_cache``: plain-text body; ``timeout`` (0.5.10+) waits that long for idleness
        (scheduler_components/flush_wrapper.py)."""
        if self._flushing:
            return Reply(400, "Another flush_cache is already in progress.")
        message = ""
        if timeout > 0:
            self._flushing = True
            self._touch()
            try:
                ok = await self._engine_time_wait(self.scheduler.is_idle_for_flush, timeout)
            finally:
                self._flushing = False
                self._touch()
            if not ok:
                message = "Timed out waiting for idle state."
        ok = self._flush_now()
        if ok:
            return Reply(200, FLUSH_OK_TEXT)
        if not self.profile.flush_timeout_query:
            return Reply(400, FLUSH_OK_TEXT)  # ≤0.5.6: same text, status 400
        return Reply(400, message or "Flush cache failed.\n")

    def _note_memory(self) -> None:
        """``memory_gone``: weights or KV cache released by torch_memory_saver (``--enable-memory-saver``; without
        it the adapter is a no-op and release/resume change nothing on the GPU). Read once per decode step."""
        self.memory_gone = self.enable_memory_saver and bool(self.offload_tags & {"weights", "kv_cache"})

    def _memory_tags(self, obj: Mapping[str, Any] | None) -> list[str]:
        tags = (obj or {}).get("tags")
        return list(tags) if tags else list(self.profile.memory_tags)

    async def release_memory_occupation(self, obj: Mapping[str, Any] | None) -> Reply:
        """``/release_memory_occupation`` (scheduler ``weight_updater.release_memory_occupation``): no lock, no
        pause gate. 0.5.10+ asserts the scheduler is idle (a resident request kills the server); the KV cache is
        flushed; with ``--enable-memory-saver`` the released memory holds nothing until resumed. Answers 200
        ``null``."""
        if self.profile.release_memory_requires_idle and not self.scheduler.is_idle_for_flush():
            self.crash("AssertionError: release_memory_occupation should be called only when server is idle.")
            return self.dead_reply("/release_memory_occupation")
        tags = self._memory_tags(obj)
        self.offload_tags.update(tags)
        self._note_memory()
        self._event("memory.release", tags=tags, memory_saver=self.enable_memory_saver)
        return Reply(200, JSON_NULL)

    async def resume_memory_occupation(self, obj: Mapping[str, Any] | None) -> Reply:
        """``/resume_memory_occupation``: ``offload_tags.remove(tag)`` (a tag not released is a KeyError that kills
        the scheduler). Weights resumed by the memory saver without ``--enable-weights-cpu-backup`` come back as
        fresh, unfilled memory (zeros here): the trainer must push weights again before generating."""
        tags = self._memory_tags(obj)
        missing = [t for t in tags if t not in self.offload_tags]
        if missing:
            self.crash(f"KeyError: {missing[0]!r} (resume_memory_occupation of memory that is not released)")
            return self.dead_reply("/resume_memory_occupation")
        self.offload_tags.difference_update(tags)
        self._note_memory()
        if "weights" in tags and self.enable_memory_saver and not self.enable_weights_cpu_backup:
            zeros = {name: W.TensorBlob.zeros(b.dtype, b.shape) for name, b in self.weights.items()}
            self.weights = W.WeightStore(zeros)
            self._weights_event("weights.load", source="resume_memory_occupation",
                        model_path=None)
        self._event("memory.resume", tags=tags, memory_saver=self.enable_memory_saver)
        self._touch()
        return Reply(200, JSON_NULL)


_STACKED = (".q_proj", ".k_proj", ".v_proj", ".gate_proj", ".up_proj")  # LlamaForCausalLM.stacked_params_mapping
_SKIPPED = ("rotary_emb.inv_freq", "projector", "rotary_emb.cos_cached", "rotary_emb.sin_cached")


def _silently_skipped(name: str, config: Mapping[str, Any]) -> bool:
    """Unknown names ``LlamaForCausalLM.load_weights`` drops without a warning: rotary caches and projectors,
    ``lm_head`` of a tied model, and names its stacked mapping rewrites (``q_proj`` → ``qkv_proj``) to a
    parameter that does not exist (``if name not in params_dict: continue``)."""
    if any(part in name for part in _SKIPPED):
        return True
    if config.get("tie_word_embeddings") and "lm_head.weight" in name:
        return True
    return any(part in name for part in _STACKED)


_DISK_ANSWERS = {"loader": "disk_loader", "iterator": "disk_iterator", "load": "disk_load"}
"""Failing stage of ``model_runner.update_weights_from_disk`` → its answer in ``SGLANG.answers``."""


def _disk_failure(e: Exception, stage: str) -> str:
    """``model_runner.update_weights_from_disk``'s message for the stage that failed (a stage that is not the
    loader's or the iterator's is the load's)."""
    return SGLANG.answer(_DISK_ANSWERS.get(stage, "disk_load")).text(error=e)


def _partial_update_message(error: Exception) -> str:
    """The model runner's answer to a distributed update that raised (``update_weights_from_distributed``)."""
    return SGLANG.answer("distributed_partial").text(error=error)
