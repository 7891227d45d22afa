"""Bring a running vLLM engine back to the state it started in, through vLLM's own routes, and verify that it is.

The vLLM counterpart of :mod:`gpu.reset` (same :class:`~gpu.reset.InitialState`, same errors, the scenario's wire
read the same way: it is recorded in the suite's vocabulary). :func:`reset_vllm_engine` does, in order (routes of
vLLM 0.32.0 with ``VLLM_SERVER_DEV_MODE=1``, ``vllm/entrypoints/rl/online/api_router.py`` and
``vllm/entrypoints/serve/dev``):

1. ``/resume`` (a scenario may leave the engine paused), ``/abort_requests {}`` (every request);
2. wait until idle: ``/reset_prefix_cache`` answers ``success: false`` while running requests hold blocks, so it
   doubles as the probe;
3. unload every LoRA adapter ``/v1/models`` lists or the wire shows loaded (``/v1/unload_lora_adapter``);
4. reload the initial checkpoint (``/collective_rpc`` ``reload_weights`` with ``weights_path``: vLLM serves that
   path from then on) and put the initial label back (``/update_weight_version``, which never aborts);
5. one greedy token (``/inference/v1/generate``), then the prefix cache reset again.

Then it verifies: the label ``/weight_info`` reports, no adapter listed, and the checksums ``/weight_checker`` answers
for the parameters it shows as the checkpoint names them (:func:`gpu.weights.checkpoint_view`) against those read when
the engines started.
"""

from __future__ import annotations

from typing import Any, Sequence

from conformance.backends import probe_client
from conformance.history import WireCall

from .reset import STEP_TIMEOUT_S, InitialState, ResetCalls, left_open, until_idle
from .weights import checkpoint_view, read_checksums

ONE_TOKEN = {"token_ids": [1, 2, 3], "sampling_params": {"max_tokens": 1, "temperature": 0.0}}


async def reset_vllm_engine(index: int, url: str, initial: InitialState, calls: Sequence[WireCall]) -> dict[str, Any]:
    """Reset the vLLM engine at ``url`` (see the module docstring) given its scenario's ``calls``; what was done.
    Raises :class:`~gpu.reset.EngineResetError` when a step fails or the engine is not back in its initial state."""
    _, adapters, _ = left_open(calls)
    done: dict[str, Any] = {}
    async with probe_client(STEP_TIMEOUT_S) as client:
        e = ResetCalls(index, url, client)
        await e.call("resume", "POST", "/resume")
        await e.call("abort", "POST", "/abort_requests", {})
        done["idle_s"] = await _until_idle(e, "wait for idle")
        listed = await _adapters(e)
        for name in dict.fromkeys([*listed, *adapters]):
            r = await e.call(f"unload adapter {name!r}", "POST", "/v1/unload_lora_adapter", {"lora_name": name},
                             ok=(200, 400, 404))
            if r.status_code != 200 and name in listed:
                raise e.fail(f"unload adapter {name!r}", f"answered {r.status_code} {r.text[:300]!r}")
        done["adapters_unloaded"] = listed
        await e.call("reload the initial checkpoint", "POST", "/collective_rpc",
                     {"method": "reload_weights", "kwargs": {"weights_path": initial.model_path}})
        if initial.label is not None:
            await e.call("restore the label", "POST", "/update_weight_version", {"new_version": initial.label})
        await e.call("serve one token", "POST", "/inference/v1/generate", ONE_TOKEN)
        await _until_idle(e, "reset the prefix cache")
        await _verify(e, initial)
    return done


async def _until_idle(e: ResetCalls, step: str) -> float:
    """Seconds until ``/reset_prefix_cache`` succeeded (no running request holds a block; the cache reset)."""
    return await until_idle(e, step, "/reset_prefix_cache", lambda r: r.json().get("success", True) is not False)


async def _adapters(e: ResetCalls) -> list[str]:
    r = await e.call("list adapters", "GET", "/v1/models")
    return [m["id"] for m in r.json().get("data", []) if m.get("parent")]


async def _verify(e: ResetCalls, initial: InitialState) -> None:
    label = (await e.call("verify the label", "GET", "/weight_info")).json().get("weight_version")
    if label != initial.label:
        raise e.fail("verify the label", f"/weight_info reports weight_version {label!r}, not the initial "
                                         f"{initial.label!r}")
    if await _adapters(e):
        raise e.fail("verify no adapter is loaded", f"/v1/models still lists {await _adapters(e)}")
    checksums = checkpoint_view(await read_checksums(e.url), initial.params)
    differ = sorted(n for n in initial.digests if checksums.get(n) != initial.digests[n])
    if differ:
        raise e.fail("verify the weights", f"{len(differ)} of {len(initial.digests)} parameters differ from the "
                                           f"initial checkpoint after reloading it (first: {differ[0]}: "
                                           f"{checksums.get(differ[0])})")
