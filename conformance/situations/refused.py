"""A cycle the engines refuse: every engine (or one) answers the cycle's transfer calls (its adapter loads for a
LoRA update) the way SGLang answers a load that failed, injected at the wire so the same fault works in front of
real engines; on vLLM the engine is made to fail the load itself (``Dialect.failing_load``)."""

from __future__ import annotations

from typing import Any

from fakes.facts import SGLANG

from ..history import LORA_LOAD_PATHS, Breakage, Injected
from .scene import Scene, Situation

TRANSFER_FAILURES: dict[str, tuple[str, dict[str, Any]]] = {
    "disk": ("/update_weights_from_disk", {
        "success": False, "num_paused_requests": 0,
        "message": SGLANG.answer("disk_load").text(error="CUDA out of memory (injected by the conformance suite)")}),
    "tensor": ("/update_weights_from_tensor", {
        "success": False, "message": "Failed to update weights: CUDA out of memory (injected by the conformance "
                                     "suite)."}),
    "distributed": ("/update_weights_from_distributed", {
        "success": False, "message": "Failed to update parameter online: CUDA out of memory (injected by the "
                                     "conformance suite)."}),
}
"""Per transport, the endpoint and the HTTP 400 body SGLang's handler answers when the load reports failure
(``python/sglang/srt/entrypoints/http_server.py``, 0.5.4–0.5.23: ``{"success": false, "message": …}``; the disk and
distributed messages are ``model_executor/model_runner.py``'s). Needed for the tensor and disk transports: SGLang
answers a load over them that raises by killing the server, not with a 400 (``SGLANG.load_failure_kills``)."""
LORA_FAILURE: tuple[tuple[str, ...], dict[str, Any]] = (
    tuple(sorted(LORA_LOAD_PATHS)),
    {"success": False, "error_message": "Failed to load LoRA adapter: CUDA out of memory (injected by the conformance "
                                        "suite).", "loaded_adapters": {}})
"""The LoRA loads and the HTTP 400 body SGLang answers when one fails (``LoRAUpdateOutput``,
``managers/tokenizer_communicator_mixin.py`` ``load_lora_adapter``, 0.5.10–0.5.23); both endpoints are refused, an
integration uses one of them."""

SITUATION = Situation("failed-cycle", "update cycle the engines refused",
                      lambda h: any(c.expect_failure for c in h.cycles))


def refuse(scene: Scene, engine: int, transport: str, lora: bool) -> list[tuple[int, str]]:
    """Make ``engine`` answer every transfer call of the coming cycle (its adapter loads for a LoRA update) as a load
    that failed; the (engine, path) refused."""
    if lora:
        paths, body = LORA_FAILURE
    else:
        path, body = TRANSFER_FAILURES[transport]
        paths = (path,)
    backend = scene.backend
    rewrites = {path: backend.dialect.failing_load(path) for path in paths}
    for path in paths:
        backend.control.refuse(engine, path, 400, body, times=None, rewrite=rewrites[path])
    how = (f"{' and '.join(paths)} sent on pointing at a missing path, which the engine fails itself"
           if all(rewrites.values()) else f"{' and '.join(paths)} answer 400 {body}")
    scene.history.injected.append(Injected(backend.wire.clock(), "refusal", engine, how))
    return [(engine, path) for path in paths]


def check_used(scene: Scene, refused: list[list[tuple[int, str]]], failed: bool) -> None:
    """After the cycle: a refusal no call used breaks the run (the integration did not call that endpoint on that
    engine during the cycle), unless the cycle ``failed`` (it may fail at the first refusal, leaving the others
    unused). An engine refused on several paths (LoRA) needs to have used one."""
    left = set(scene.backend.control.clear_refusals())
    unused = sorted(left - {key for keys in refused if not set(keys) <= left for key in keys})
    if unused and not failed:
        scene.history.breaks.append(Breakage("error", f"the injected refusal of {unused} was never used: the "
                                             "integration did not call that endpoint on that engine during the "
                                             "cycle", scene.backend.wire.clock()))

