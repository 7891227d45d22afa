"""Version profiles: the SGLang behaviours that changed between releases, as switches.

Every field cites the spec section (``shared/docs/sglang-api.md``, "spec §N") it comes from.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Literal

_MODEL_INFO_BASE = ("model_path", "tokenizer_path", "is_generation", "preferred_sampling_params", "weight_version")
_MODEL_INFO_056 = _MODEL_INFO_BASE + (
    "has_image_understanding",
    "has_audio_understanding",
    "model_type",
    "architectures",
)
_MODEL_INFO_0523 = _MODEL_INFO_056 + (
    "served_model_name",
    "load_format",
    "reasoning_parser",
    "tool_call_parser",
    "disaggregation_mode",
)


@dataclass(frozen=True)
class Profile:
    """Behaviour switches of one SGLang release."""

    version: str

    # -- pause / continue (spec §2) --
    pause_modes: bool
    """≥0.5.6: pause takes a required body with ``mode``; ≤0.5.4 the body is ignored and pause = abort."""
    pause_abort_waits_for_readers: bool
    """≥0.5.6: pause(abort) loops abort until no /generate holds the reader lock (spec §2.2)."""
    continue_torch_empty_cache: bool
    """0.5.15+: ``ContinueGenerationReqInput.torch_empty_cache`` (spec §2.1; in the 0.5.15.post1 wheel)."""
    paused_updates_skip_lock: bool
    """≥0.5.6: weight updates while paused skip the model-update writer lock (spec §3.3.2)."""

    # -- aborts and request ids (spec §6.3, §6.5) --
    waiting_abort_style: Literal["before_prefill", "waiting_queue"]
    """≤0.5.4 "Abort before prefill" (text "", no output_ids); ≥0.5.6 "Abort in waiting queue"."""
    waiting_abort_meta_version: bool
    """0.5.10+: waiting-queue abort bodies carry ``weight_version`` and ``e2e_latency``."""
    reject_duplicate_rid: bool
    """0.5.10+: a rid already in flight → 400 "Duplicate request ID detected: <rid>"."""

    # -- flush (spec §7.1, §3.3.3) --
    flush_checks_waiting: bool
    """The idle predicate requires an empty waiting queue (0.5.2, 0.5.10–0.5.23; not 0.5.6)."""
    flush_ignores_waiting_while_paused: bool
    """0.5.23: ``is_fully_idle(ignore_waiting=self._engine_paused)``."""
    post_update_flush_failure: Literal["crash", "error"]
    """≤0.5.16: ``assert flush_cache_success`` kills the scheduler; 0.5.23: 400 with a message."""
    disk_flush_cache_field: bool
    """≥0.5.6: ``UpdateWeightFromDiskReqInput.flush_cache``; before, a disk update always flushes."""
    flush_timeout_query: bool
    """0.5.10+: ``/flush_cache?timeout=`` and ``FlushCacheReqOutput.message``."""

    # -- loading weights (model_loader/weight_utils.py) --
    missing_shard_fails: bool
    """0.5.23: an index naming a shard that is not on disk fails the disk update ("references N shard file(s)
    missing", ``filter_duplicate_safetensors_files``); before, the shards present load silently."""

    # -- memory occupation (scheduler weight_updater / update_weights_mixin) --
    release_memory_requires_idle: bool
    """0.5.10+: ``assert is_fully_idle()`` in the scheduler (0.5.23: waiting requests ignored while paused): a
    release with requests resident kills the server."""
    memory_tags: tuple[str, ...]
    """The tags released/resumed when the body names none (``GPU_MEMORY_ALL_TYPES``; 0.5.4 has no cuda_graph)."""

    # -- OpenAI-compatible listing --
    models_list_loras: bool
    """0.5.10+: ``/v1/models`` lists every loaded LoRA adapter (``id`` its name, ``root`` its path, ``parent`` the
    served model)."""

    # -- weight-update sessions (spec §3.3.6) --
    weight_update_sessions: bool
    """0.5.23: /begin_weight_update + /end_weight_update, required around distributed/tensor updates."""

    # -- where the version shows (spec §5, §6.2) --
    weight_versions_spans: bool
    """0.5.23: ``meta_info.weight_versions`` spans; ``weight_version`` = last span's version."""
    get_weight_version: Literal["ok", "deprecated", "gone"]
    """``/get_weight_version``: 200 (≤0.5.6), 404 deprecation body (0.5.10–0.5.16), route gone (0.5.23)."""
    weight_version_alias: bool
    """The ``/weight_version`` alias route exists (0.5.6–0.5.16)."""
    server_info_tracks_version: bool
    """≤0.5.16 ``/server_info`` reflects runtime version changes; 0.5.23 reports the startup config."""

    # -- /generate meta_info and streaming (spec §6.1, §6.4) --
    retraction_key: str | None
    """``total_retractions`` (0.5.6–0.5.10), ``num_retractions`` (0.5.15+), absent before."""
    reasoning_tokens: bool
    """0.5.10+: ``meta_info.reasoning_tokens``."""
    stream_cumulative_output_ids: bool
    """Streaming ``output_ids`` cumulative (0.5.6+) or delta (0.5.2; 0.5.4 assumed the same)."""

    # -- routes (spec §0.1, §4, §5) --
    model_info_route: bool
    """0.5.6+: ``/model_info`` and ``/server_info`` (``/get_*`` aliases kept)."""
    model_info_keys: tuple[str, ...]
    lora_from_tensors_field: str | None
    """``/load_lora_adapter_from_tensors`` payload field (0.5.10+), None where the route is absent."""
    destroy_group_route: bool
    """0.5.4+: ``/destroy_weights_update_group``."""
    ready_route: bool
    """0.5.23: ``/ready`` → 503 while paused (http_server.py:715)."""


_P054 = Profile(
    version="0.5.4",
    pause_modes=False,
    pause_abort_waits_for_readers=False,
    continue_torch_empty_cache=False,
    paused_updates_skip_lock=False,
    waiting_abort_style="before_prefill",
    waiting_abort_meta_version=False,
    reject_duplicate_rid=False,
    # spec §7.1 documents 0.5.2 (waiting AND running) and 0.5.6 (running only); 0.5.4 assumed like 0.5.2.
    flush_checks_waiting=True,
    flush_ignores_waiting_while_paused=False,
    post_update_flush_failure="crash",
    disk_flush_cache_field=False,
    flush_timeout_query=False,
    missing_shard_fails=False,
    release_memory_requires_idle=False,
    memory_tags=("weights", "kv_cache"),
    models_list_loras=False,
    weight_update_sessions=False,
    weight_versions_spans=False,
    get_weight_version="ok",
    weight_version_alias=False,
    server_info_tracks_version=True,
    retraction_key=None,
    reasoning_tokens=False,
    stream_cumulative_output_ids=False,
    model_info_route=False,
    model_info_keys=_MODEL_INFO_BASE,
    lora_from_tensors_field=None,
    destroy_group_route=True,
    ready_route=False,
)

# Each later release is stated as what changed since the one before it (read in that release's wheel).
_P0510 = replace(
    _P054, version="0.5.10", pause_modes=True, pause_abort_waits_for_readers=True, paused_updates_skip_lock=True,
    waiting_abort_style="waiting_queue", waiting_abort_meta_version=True, reject_duplicate_rid=True,
    disk_flush_cache_field=True, flush_timeout_query=True, release_memory_requires_idle=True,
    memory_tags=("kv_cache", "weights", "cuda_graph"), models_list_loras=True, get_weight_version="deprecated",
    weight_version_alias=True, retraction_key="total_retractions", reasoning_tokens=True,
    stream_cumulative_output_ids=True, model_info_route=True, model_info_keys=_MODEL_INFO_056,
    lora_from_tensors_field="serialized_tensors")
# 0.5.15 (the 0.5.15.post1 wheel, the build a major framework pins): everything else as 0.5.10 -- no weight-update
# sessions, a failed post-update flush still asserts, is_fully_idle() still counts the waiting queue (a flush after
# a retract pause cannot succeed until continue), /get_weight_version still the 404 deprecation.
_P0515 = replace(_P0510, version="0.5.15", continue_torch_empty_cache=True, retraction_key="num_retractions")
_P0523 = replace(
    _P0515, version="0.5.23", flush_ignores_waiting_while_paused=True, post_update_flush_failure="error",
    missing_shard_fails=True, weight_update_sessions=True, weight_versions_spans=True, get_weight_version="gone",
    weight_version_alias=False, server_info_tracks_version=False, model_info_keys=_MODEL_INFO_0523,
    lora_from_tensors_field="serialized_named_tensors", ready_route=True)

PROFILES: dict[str, Profile] = {p.version: p for p in (_P054, _P0510, _P0515, _P0523)}
"""Release label → its behaviour switches."""

DEFAULT_PROFILE = "0.5.23"


def get_profile(version: str | Profile) -> Profile:
    """The profile for a release label (a ``Profile`` passes through); ValueError names the known ones."""
    if isinstance(version, Profile):
        return version
    try:
        return PROFILES[version]
    except KeyError:
        known = ", ".join(sorted(PROFILES, key=lambda v: tuple(int(p) for p in v.split("."))))
        raise ValueError(f"unknown SGLang profile {version!r}; known profiles: {known}") from None
