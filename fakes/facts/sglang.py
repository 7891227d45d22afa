"""The SGLang family's table: the releases the fake behaves as, the facts per release, the failure answers, the
keep-alive and which failed loads kill the server. Read by the fake (``fakes.profiles``, the engine) and by the
suite (the checkers, the reference integration, the GPU backends), never copied.

Plain data. Each fact says where in SGLang it lives (paths under ``python/sglang/srt/`` of the
``sgl-project/sglang`` repository, the same in the wheels as ``sglang/srt/``) and how it changed: ``steps`` are
``(first release, value)``, oldest first, read in the released wheels. To add a fact measured on real SGLang, add an
entry to ``_FACTS`` (and, when the fake must act on it, a field of ``fakes.profiles.Profile`` of the same name):
``tests/fakes/test_releases.py`` checks that every fact is read and that the readers agree. Release labels are
written here and nowhere else (``tests/test_engine_facts.py``).
"""

from __future__ import annotations

from .family import Answer, EngineFamily, Fact, Release

_SRT = "python/sglang/srt/"
_MODEL_INFO_BASE = ("model_path", "tokenizer_path", "is_generation", "preferred_sampling_params", "weight_version")
_MODEL_INFO_056 = _MODEL_INFO_BASE + ("has_image_understanding", "has_audio_understanding", "model_type",
                                      "architectures")
_MODEL_INFO_0523 = _MODEL_INFO_056 + ("served_model_name", "load_format", "reasoning_parser", "tool_call_parser",
                                      "disaggregation_mode", "embedding")

_FACTS: dict[str, Fact] = {
    # -- pause / continue --
    "pause_modes": Fact(
        "/pause_generation takes a body with a mode (abort, retract, in_place); before, the handler takes no body and "
        "every pause aborts",
        _SRT + "managers/io_struct.py PauseGenerationReqInput; entrypoints/http_server.py pause_generation",
        (("0.5.4", False), ("0.5.6", True))),
    "pause_abort_waits_for_readers": Fact(
        "pause(abort) loops abort_request(abort_all) until no /generate holds the model-update reader lock",
        _SRT + "managers/tokenizer_manager.py pause_generation",
        (("0.5.4", False), ("0.5.6", True))),
    "continue_torch_empty_cache": Fact(
        "ContinueGenerationReqInput.torch_empty_cache (in the 0.5.15.post1 wheel)",
        _SRT + "managers/io_struct.py ContinueGenerationReqInput",
        (("0.5.4", False), ("0.5.15", True))),
    "paused_updates_skip_lock": Fact(
        "weight updates while paused skip the model-update writer lock",
        _SRT + "managers/tokenizer_communicator_mixin.py (≤0.5.10), managers/tokenizer_control_mixin.py (0.5.16+) "
               "update_weights_from_*",
        (("0.5.4", False), ("0.5.6", True))),
    # -- aborts and request ids --
    "waiting_abort_style": Fact(
        'a request aborted before it ran: "Abort before prefill" (text "", no output_ids), later "Abort in waiting '
        'queue"',
        _SRT + "managers/scheduler.py abort_request",
        (("0.5.4", "before_prefill"), ("0.5.6", "waiting_queue"))),
    "waiting_abort_meta_version": Fact(
        "waiting-queue abort bodies carry weight_version and e2e_latency",
        _SRT + "managers/tokenizer_manager.py _handle_abort_req",
        (("0.5.4", False), ("0.5.10", True))),
    "reject_duplicate_rid": Fact(
        'a rid already in flight answers 400 "Duplicate request ID detected: <rid>"',
        _SRT + "managers/tokenizer_manager.py _send_one_request",
        (("0.5.4", False), ("0.5.10", True))),
    # -- flush --
    "flush_checks_waiting": Fact(
        "the flush's idle predicate requires an empty waiting queue (0.5.2 and 0.5.10+; not 0.5.6)",
        _SRT + "managers/scheduler.py flush_cache, is_fully_idle",
        (("0.5.4", True), ("0.5.6", False), ("0.5.10", True))),
    "flush_ignores_waiting_while_paused": Fact(
        "is_fully_idle(ignore_waiting=self._engine_paused): a flush while paused ignores the waiting queue",
        _SRT + "managers/scheduler.py is_fully_idle",
        (("0.5.4", False), ("0.5.23", True))),
    "post_update_flush_failure": Fact(
        "a failed flush after a weight update: assert flush_cache_success kills the scheduler (crash), later a 400 "
        "with a message (error)",
        _SRT + "managers/scheduler_update_weights_mixin.py (≤0.5.16), managers/scheduler_components/"
               "weight_updater.py (0.5.23)",
        (("0.5.4", "crash"), ("0.5.23", "error"))),
    "disk_flush_cache_field": Fact(
        "UpdateWeightFromDiskReqInput.flush_cache (default true); before, a disk update always flushes",
        _SRT + "managers/io_struct.py UpdateWeightFromDiskReqInput",
        (("0.5.4", False), ("0.5.6", True))),
    "flush_timeout_query": Fact(
        "/flush_cache?timeout= (wait for idleness) and FlushCacheReqOutput.message",
        _SRT + "entrypoints/http_server.py flush_cache; managers/scheduler_components/flush_wrapper.py",
        (("0.5.4", False), ("0.5.10", True))),
    # -- loading weights --
    "distributed_receive_errors_answered": Fact(
        "a failed receive of /update_weights_from_distributed (e.g. an unknown group: the model runner's assert) is "
        "answered 400 \"Failed to receive weights: <error>\"; before, the assert kills the scheduler and the server "
        "exits (measured on real 0.5.15 and 0.5.23 on CPU, python -m gpu.fidelity)",
        _SRT + "managers/scheduler_components/weight_updater.py update_weights_from_distributed (0.5.23)",
        (("0.5.4", False), ("0.5.23", True))),
    "missing_shard_fails": Fact(
        'an index naming a shard that is not on disk fails the disk update ("references N shard file(s) missing"); '
        "before, the shards present load silently",
        _SRT + "model_loader/weight_utils.py filter_duplicate_safetensors_files",
        (("0.5.4", False), ("0.5.23", True))),
    # -- memory occupation --
    "release_memory_requires_idle": Fact(
        "release_memory_occupation asserts is_fully_idle() in the scheduler: a release with requests resident kills "
        "the server",
        _SRT + "managers/scheduler_update_weights_mixin.py release_memory_occupation",
        (("0.5.4", False), ("0.5.10", True))),
    "memory_tags": Fact(
        "the tags released/resumed when the body names none (GPU_MEMORY_ALL_TYPES)",
        _SRT + "constants.py GPU_MEMORY_ALL_TYPES",
        (("0.5.4", ("weights", "kv_cache")), ("0.5.10", ("kv_cache", "weights", "cuda_graph")))),
    # -- OpenAI-compatible listing --
    "models_list_loras": Fact(
        "/v1/models lists every loaded LoRA adapter (id its name, root its path, parent the served model)",
        _SRT + "entrypoints/http_server.py available_models",
        (("0.5.4", False), ("0.5.10", True))),
    "lora_implicit_reload": Fact(
        "a /generate naming an adapter that was loaded once and unloaded since reloads it from its path first "
        "('Reloading evicted adapter'); one never loaded is refused with 'Got LoRA adapter that has never been "
        "loaded' (read in 0.5.23, compared on real 0.5.23 on CPU; older releases not compared: they refuse it as "
        "lora_registry.acquire does)",
        _SRT + "managers/tokenizer_manager.py _resolve_lora_path (lora_ref_cache)",
        (("0.5.4", False), ("0.5.23", True))),
    # -- weight-update sessions --
    "weight_update_sessions": Fact(
        "/begin_weight_update and /end_weight_update, required around distributed and tensor updates",
        _SRT + "entrypoints/http_server.py begin_weight_update, end_weight_update",
        (("0.5.4", False), ("0.5.23", True))),
    # -- where the version shows --
    "weight_versions_spans": Fact(
        "meta_info.weight_versions spans over output tokens; meta_info.weight_version is the last span's",
        _SRT + "utils/weight_versions.py",
        (("0.5.4", False), ("0.5.23", True))),
    "get_weight_version": Fact(
        "/get_weight_version answers 200, then a 404 deprecation body, then the route is gone",
        _SRT + "entrypoints/http_server.py get_weight_version",
        (("0.5.4", "ok"), ("0.5.10", "deprecated"), ("0.5.23", "gone"))),
    "weight_version_alias": Fact(
        "the /weight_version alias route exists",
        _SRT + "entrypoints/http_server.py",
        (("0.5.4", False), ("0.5.6", True), ("0.5.23", False))),
    "server_info_tracks_version": Fact(
        "/server_info reflects runtime version changes; 0.5.23 reports the startup config",
        _SRT + "entrypoints/http_server.py get_server_info",
        (("0.5.4", True), ("0.5.23", False))),
    # -- /generate meta_info and streaming --
    "retraction_key": Fact(
        "the meta_info key counting retractions (none before 0.5.6)",
        _SRT + "managers/tokenizer_manager.py _handle_batch_output",
        (("0.5.4", None), ("0.5.6", "total_retractions"), ("0.5.15", "num_retractions"))),
    "reasoning_tokens": Fact(
        "meta_info.reasoning_tokens",
        _SRT + "managers/tokenizer_manager.py _handle_batch_output",
        (("0.5.4", False), ("0.5.10", True))),
    "meta_info_cache_details": Fact(
        "meta_info carries cached_tokens_details and dp_rank (both null on one plain engine), in every output; "
        "measured on real 0.5.10/0.5.15/0.5.23 on CPU (python -m gpu.fidelity)",
        _SRT + "managers/tokenizer_manager.py _handle_batch_output",
        (("0.5.4", False), ("0.5.10", True))),
    "meta_info_response_sent_ts": Fact(
        "the first output sent to the client (a non-streamed answer: its only one) carries meta_info."
        "response_sent_to_client_ts, the wall-clock time it was sent",
        _SRT + "managers/tokenizer_manager.py _wait_one_response",
        (("0.5.4", False), ("0.5.10", True))),
    "stream_cumulative_output_ids": Fact(
        "streamed output_ids are cumulative (before: deltas)",
        _SRT + "managers/tokenizer_manager.py _handle_batch_output",
        (("0.5.4", False), ("0.5.6", True))),
    # -- routes --
    "model_info_route": Fact(
        "/model_info and /server_info (the /get_* aliases kept)",
        _SRT + "entrypoints/http_server.py",
        (("0.5.4", False), ("0.5.6", True))),
    "model_info_keys": Fact(
        "the keys of /model_info",
        _SRT + "entrypoints/http_server.py get_model_info",
        (("0.5.4", _MODEL_INFO_BASE), ("0.5.6", _MODEL_INFO_056), ("0.5.23", _MODEL_INFO_0523))),
    "lora_from_tensors_field": Fact(
        "the tensor field of /load_lora_adapter_from_tensors: none before the route (an adapter goes through disk, "
        "/load_lora_adapter), serialized_tensors (one string), then serialized_named_tensors (one per TP rank)",
        _SRT + "managers/io_struct.py LoadLoRAAdapterFromTensorsReqInput",
        (("0.5.4", None), ("0.5.10", "serialized_tensors"), ("0.5.23", "serialized_named_tensors"))),
    "local_serialized_tensor_module": Fact(
        "the module a pickled LocalSerializedTensor (what weight_sync.utils.update_weights sends) must name: the one "
        "the class lives in. SafeUnpickler resolves it there; elsewhere it raises (≤0.5.15: outside its module "
        "prefixes; 0.5.23: the old path is allow-listed but model_runner no longer holds the class), in the TP "
        "worker, outside any try, and the server exits (measured on 0.5.15 with the 0.5.23 path)",
        _SRT + "model_executor/model_runner.py (≤0.5.15), model_executor/model_runner_components/weight_updater.py "
               "(0.5.23) LocalSerializedTensor; utils/common.py SafeUnpickler.find_class",
        (("0.5.4", "sglang.srt.model_executor.model_runner"),
         ("0.5.23", "sglang.srt.model_executor.model_runner_components.weight_updater"))),
    "destroy_group_route": Fact(
        "/destroy_weights_update_group",
        _SRT + "entrypoints/http_server.py destroy_weights_update_group",
        (("0.5.1", False), ("0.5.4", True))),
    "ready_route": Fact(
        "/ready answers 503 while paused",
        _SRT + "entrypoints/http_server.py ready (0.5.23:715)",
        (("0.5.4", False), ("0.5.23", True))),
}


_ROWS = (
    Release("0.5.4"),
    Release("0.5.10", real_on_cpu=True),
    Release("0.5.15", real_on_cpu=True),  # read from the 0.5.15.post1 wheel (fakes/snapshots)
    Release("0.5.23", real_on_cpu=True, lora_on_cpu=True),
)

_ANSWERS: dict[str, Answer] = {
    "session_required": Answer(
        400, "{source} must run between begin_weight_update() and end_weight_update()",
        _SRT + "managers/scheduler_components/weight_updater.py"),
    "session_already_open": Answer(
        400, "a weight-update session is already open; call end_weight_update() first",
        _SRT + "managers/scheduler_components/weight_updater.py begin_weight_update"),
    "no_session_open": Answer(
        400, "no weight-update session is open; call begin_weight_update() first",
        _SRT + "managers/scheduler_components/weight_updater.py end_weight_update"),
    "post_update_flush": Answer(
        400, "Weights were updated, but the cache was not flushed because requests are still running or queued. "
             "Retract or finish them, then call /flush_cache.",
        _SRT + "managers/scheduler_components/weight_updater.py (fact post_update_flush_failure: error)"),
    "post_update_flush_crash": Answer(
        500, "AssertionError: Cache flush failed after updating weights",
        _SRT + "managers/scheduler_update_weights_mixin.py (fact post_update_flush_failure: crash)"),
    "disk_loader": Answer(
        400, "Failed to get model loader: {error}.",
        _SRT + "model_executor/model_runner.py update_weights_from_disk"),
    "disk_iterator": Answer(
        400, "Failed to get weights iterator: {error}.",
        _SRT + "model_executor/model_runner.py update_weights_from_disk"),
    "disk_load": Answer(
        400, "Failed to update weights: {error}.\nRolling back to original weights.",
        _SRT + "model_executor/model_runner.py update_weights_from_disk"),
    "distributed_receive": Answer(
        400, "Failed to receive weights: {error}",
        _SRT + "managers/scheduler_components/weight_updater.py (fact distributed_receive_errors_answered)"),
    "distributed_partial": Answer(
        400, "Failed to update parameter online: {error}. The full weights of the ModelRunner are partially "
             "updated. Please discard the whole weights.",
        _SRT + "model_executor/model_runner.py update_weights_from_distributed"),
}

_LOAD_FAILURE_KILLS: dict[str, str] = {
    "disk": "update_weights_from_disk points the model config at the new folder before loading, and its rollback "
            "re-reads that folder outside any try: a checkpoint that still fails to load kills the scheduler and "
            "the server exits (measured on real SGLang on CPU, python -m gpu.fidelity); a failure before the "
            "files load (no such folder) is answered 400",
    "tensor": "model_runner.update_weights_from_tensor has no try/except: a payload that fails to decode or load "
              "kills the scheduler",
}

SGLANG = EngineFamily(
    name="SGLang",
    rows=_ROWS,
    facts=_FACTS,
    answers=_ANSWERS,
    load_failure_kills=_LOAD_FAILURE_KILLS,
    keep_alive_s=5.0,
    keep_alive_source="SGLANG_TIMEOUT_KEEP_ALIVE (python/sglang/srt/environ.py), passed to uvicorn in "
                      "python/sglang/srt/entrypoints/http_server.py",
    sources="sgl-project/sglang",
)
"""SGLang's facts."""
