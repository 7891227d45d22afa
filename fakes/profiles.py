"""Version profiles: the SGLang behaviours that changed between releases, as switches of the fake, read from the
table of SGLang facts (``fakes.facts.SGLANG``)."""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Literal

from .facts import SGLANG, parse_version


@dataclass(frozen=True)
class Profile:
    """Behaviour switches of one SGLang release: each field is the fact of the same name in ``fakes.facts.SGLANG``
    (what it means, where it lives in SGLang, the releases it changed in)."""

    version: str
    pause_modes: bool
    pause_abort_waits_for_readers: bool
    continue_torch_empty_cache: bool
    paused_updates_skip_lock: bool
    waiting_abort_style: Literal["before_prefill", "waiting_queue"]
    waiting_abort_meta_version: bool
    reject_duplicate_rid: bool
    flush_checks_waiting: bool
    flush_ignores_waiting_while_paused: bool
    post_update_flush_failure: Literal["crash", "error"]
    disk_flush_cache_field: bool
    flush_timeout_query: bool
    distributed_receive_errors_answered: bool
    missing_shard_fails: bool
    release_memory_requires_idle: bool
    memory_tags: tuple[str, ...]
    models_list_loras: bool
    weight_update_sessions: bool
    weight_versions_spans: bool
    get_weight_version: Literal["ok", "deprecated", "gone"]
    weight_version_alias: bool
    server_info_tracks_version: bool
    retraction_key: str | None
    reasoning_tokens: bool
    meta_info_cache_details: bool
    meta_info_response_sent_ts: bool
    stream_cumulative_output_ids: bool
    model_info_route: bool
    model_info_keys: tuple[str, ...]
    lora_from_tensors_field: str | None
    lora_implicit_reload: bool
    local_serialized_tensor_module: str
    destroy_group_route: bool
    ready_route: bool


def _profile(version: str) -> Profile:
    return Profile(version=version,
                   **{f.name: SGLANG.fact(f.name, version) for f in fields(Profile) if f.name != "version"})


PROFILES: dict[str, Profile] = {v: _profile(v) for v in SGLANG.releases}
"""Release label → its behaviour switches."""

DEFAULT_PROFILE = SGLANG.default_release
"""The release the fake behaves as unless told otherwise: the newest it knows."""


def get_profile(version: str | Profile) -> Profile:
    """The profile for a release label (a ``Profile`` passes through); ValueError names the known ones."""
    if isinstance(version, Profile):
        return version
    try:
        return PROFILES[version]
    except KeyError:
        known = ", ".join(sorted(PROFILES, key=parse_version))
        raise ValueError(f"unknown SGLang profile {version!r}; known profiles: {known}") from None
