"""What a fake engine tells about itself: ``/model_info`` (``/get_model_info``), ``/server_info``
(``/get_server_info``), ``/v1/models``, ``/get_weight_version`` per release, and the fake-only ``snapshot()``.

``InfoMixin`` is mixed into ``FakeEngine``; the state it uses is set up by ``FakeEngine.__init__``.
"""

from __future__ import annotations

from typing import Any

from .asgi import Reply

WEIGHT_VERSION_DEPRECATED = {  # 0.5.10–0.5.16, entrypoints/http_server.py get_weight_version
    "object": "error",
    "message": "Endpoint '/get_weight_version' or '/weight_version' is deprecated. Please use '/model_info' instead.",
    "type": "404",
    "param": None,
    "code": 404,
}


EMBEDDING_PLAN_GENERATIVE = {  # 0.5.23 /model_info "embedding" of a generative Llama (resolved_embedding_plan),
    # as real 0.5.23 answered it on CPU for the tiny model (python -m gpu.fidelity)
    "family": "none", "task": "none", "execution": "none", "attention": "none", "pooling": "model_defined",
    "normalize": False, "postprocessor": "none", "tokenizer_special_tokens": "model_default",
    "supports_dimensions": False, "supports_token_embeddings": False, "supports_multimodal": False,
    "requires_embedding_flag": False, "auto_enable_embedding": False, "bcg_eligibility": "disabled",
    "safe_disable_kv_cache": False, "safe_disable_radix_cache": False, "safe_disable_chunked_prefill": False,
    "enabled": False, "matryoshka_dimensions": [],
    "bcg": {"prefill_backend": "disabled", "enabled": False, "capture_token_budget": 4096,
            "capture_batch_sizes": [4, 8, 12, 16, 20, 24, 28, 32, 48, 64, 80, 96, 112, 128, 144, 160, 176, 192, 208,
                                    224, 240, 256, 288, 320, 352, 384, 416, 448, 480, 512, 576, 640, 704, 768, 832,
                                    896, 960, 1024, 1280, 1536, 1792, 2048, 2304, 2560, 2816, 3072, 3328, 3584, 3840,
                                    4096]},
    "cache": {"kv_cache_disabled": False, "radix_cache_disabled": False, "chunked_prefill_disabled": False},
}


class InfoMixin:
    """Info routes and the observable state of a ``FakeEngine``."""

    def snapshot(self) -> dict[str, Any]:
        """The engine's observable state (JSON-ready)."""
        return {
            "engine": self.engine_id,
            "profile": self.profile.version,
            **self.scheduler.snapshot(),
            "parked": list(self._parked),
            "paused": self.paused,
            "mode": self.pause_mode,
            "version": self.weight_version,
            "session_open": self.session_open,
            "loras": {a.name: a.path for a in self._loras.values()},
            "groups": sorted(self._groups),
            "model_path": self.model_path,
            "released_memory": sorted(self.offload_tags),
            "digest": self.weights.digest(),
            "flushing": self._flushing,
            "readers": self.update_lock.readers,
            "readers_waiting": self.update_lock.readers_waiting,
            "writer": self.update_lock.writer,
            "crashed": self.crashed,
            "crash_reason": self.crash_reason,
            "clock": self.clock.now(),
        }

    def model_info(self) -> dict[str, Any]:
        """``/model_info`` / ``/get_model_info`` body with this profile's keys (http_server.py get_model_info)."""
        values = {
            "model_path": self.model_path,
            "tokenizer_path": self.tokenizer_path,
            "is_generation": True,
            "preferred_sampling_params": None,
            "weight_version": self.weight_version,
            "has_image_understanding": False,
            "has_audio_understanding": False,
            "model_type": self.model.model_type,
            "architectures": self.model.architectures,
            "served_model_name": self.served_model_name,
            "load_format": self.load_format,
            "reasoning_parser": None,
            "tool_call_parser": None,
            "disaggregation_mode": "null",
            "embedding": EMBEDDING_PLAN_GENERATIVE,
        }
        return {key: values[key] for key in self.profile.model_info_keys}

    def server_info(self) -> dict[str, Any]:
        """A small ``/server_info``: server args + internal state. ``weight_version`` tracks updates
        ≤0.5.16 and is the startup value on 0.5.23 (http_server.py get_server_info, code-read)."""
        tracked = self.profile.server_info_tracks_version
        return {
            **self.server_args,
            "model_path": self.model_path,
            "tokenizer_path": self.tokenizer_path,
            "served_model_name": self.served_model_name,
            "skip_tokenizer_init": self.skip_tokenizer_init,
            "dtype": self.server_args.get("dtype", "auto"),
            "weight_version": self.weight_version if tracked else self.startup_weight_version,
            "max_running_requests": self.scheduler.max_running_requests,
            "enable_lora": self.enable_lora,
            "max_loaded_loras": self.max_loras,
            "tp_size": self.tp_size,
            "dp_size": 1,
            "load_format": self.load_format,
            "internal_states": [{"paused": self.scheduler.paused, "num_running_reqs": len(self.scheduler.running)}],
            "status": "ready",  # the scheduler's init info (managers/scheduler.py get_init_info, 0.5.10-0.5.23)
            "version": self.profile.version,
        }

    def models(self, model: str | None = None) -> Reply:
        """``/v1/models`` (the served model, then every loaded LoRA adapter on 0.5.10+) and
        ``/v1/models/{model}`` (the served model only; 404 ``model_not_found`` otherwise)."""
        base = {"id": self.served_model_name, "object": "model", "created": int(self._wall_time()),
                "owned_by": "sglang", "root": self.served_model_name, "parent": None,
                "max_model_len": self.context_length}
        if model is not None:
            if model != self.served_model_name:
                return Reply(404, {"error": {"message": f"The model '{model}' does not exist",
                                             "type": "invalid_request_error", "param": "model",
                                             "code": "model_not_found"}})
            return Reply(200, base)
        cards = [base]
        if self.enable_lora and self.profile.models_list_loras:
            cards += [{**base, "id": a.name, "root": a.path, "parent": self.served_model_name, "max_model_len": None}
                      for a in self._loras.values()]
        return Reply(200, {"object": "list", "data": cards})

    @staticmethod
    def _wall_time() -> float:
        import time

        return time.time()

    def get_weight_version(self) -> Reply:
        if self.profile.get_weight_version == "deprecated":
            return Reply(404, dict(WEIGHT_VERSION_DEPRECATED))
        return Reply(200, {"weight_version": self.weight_version})
