"""Bring a running engine back to the state it started in, through SGLang's own routes, and verify that it is.

Engines shared across scenarios (:mod:`gpu.pool`) are reset between scenarios. :func:`reset_engine` does, in order
(each step a route every SGLang release the suite runs has, so the same reset works on real SGLang and the fake):

1. ``/continue_generation`` (a scenario may leave an engine paused), ``/abort_request {"abort_all": true}``;
2. wait until the engine is idle: ``/flush_cache`` answers 200 only when no request is running or waiting
   (``Scheduler.flush_cache``, ``python/sglang/srt/managers/scheduler.py``, 0.5.x), so it doubles as the probe;
3. close what the scenario left open, as its wire log shows it: a weight-update session (0.5.23
   ``/end_weight_update``; a 404 there is a release without sessions), every custom group it initialised and did
   not destroy, every LoRA adapter loaded (``/v1/models`` lists them on 0.5.10+; the wire shows them too);
4. reload the initial checkpoint (``/update_weights_from_disk``, ``flush_cache`` true: idle by step 2) and put the
   initial label back (``/update_weight_version``, ``abort_all_requests`` false);
5. one greedy token through ``/generate`` (the engine serves, it is not paused), then ``/flush_cache`` again.

Then it *verifies*: the label ``/model_info`` reports, the digest of every parameter read through
``/get_weights_by_name`` (:mod:`gpu.weights`) against the initial digests, no adapter listed, and the cache
flushed. Any step that fails or any difference raises :class:`EngineResetError` naming the engine, the step and
the engine's answer: an engine that cannot be cleaned is never reused silently.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence

import httpx

from conformance.backends import probe_client
from conformance.history import WireCall

from .weights import read_engine_digests

IDLE_TIMEOUT_S = 30.0
"""How long an engine may take to finish its aborted requests (an aborted request ends at its next decode step)."""
STEP_TIMEOUT_S = 60.0
NO_SESSION = "no weight-update session is open"
"""0.5.23's answer to ``/end_weight_update`` outside a session (``scheduler_components/weight_updater.py``)."""


class EngineResetError(RuntimeError):
    """An engine could not be brought back to its initial state (the message says which step, and its answer)."""


@dataclass(frozen=True)
class InitialState:
    """What an engine held when it started, measured then: the reset brings it back and checks it."""

    model_path: str
    label: str | None
    digests: Mapping[str, str]
    params: Mapping[str, tuple[str, tuple[int, ...]]]
    """Name → (dtype, shape), to read the digests back."""


def left_open(calls: Sequence[WireCall]) -> tuple[list[str], list[str], bool]:
    """From one engine's calls in a scenario: the custom groups initialised and not destroyed, the LoRA adapters
    loaded and not unloaded (by name), and whether a weight-update session may be open."""
    groups: dict[str, None] = {}
    adapters: dict[str, None] = {}
    session = False
    for c in calls:
        body = c.payload if isinstance(c.payload, dict) else {}
        if c.path == "/init_weights_update_group" and body.get("group_name"):
            groups[body["group_name"]] = None  # a failed init may still have joined some ranks: destroy is safe
        elif c.path == "/destroy_weights_update_group" and c.ok:
            groups.pop(body.get("group_name"), None)
        elif c.path.startswith("/load_lora_adapter") and body.get("lora_name"):
            adapters[body["lora_name"]] = None
        elif c.path == "/unload_lora_adapter" and c.ok:
            adapters.pop(body.get("lora_name"), None)
        elif c.path == "/begin_weight_update":
            session = True
        elif c.path == "/end_weight_update" and c.ok:
            session = False
    return list(groups), list(adapters), session


class ResetCalls:
    """The reset's HTTP calls to one engine, each failure an :class:`EngineResetError` naming the engine and step."""

    def __init__(self, index: int, url: str, client: httpx.AsyncClient) -> None:
        self.index, self.url, self.client = index, url, client

    def fail(self, step: str, detail: str) -> EngineResetError:
        return EngineResetError(f"engine {self.index} at {self.url} could not be reset: {step}: {detail}")

    async def call(self, step: str, method: str, path: str, body: Any = None, ok: Sequence[int] = (200,),
                   timeout_s: float = STEP_TIMEOUT_S) -> httpx.Response:
        try:
            r = await self.client.request(method, self.url + path, json=body, timeout=timeout_s)
        except httpx.HTTPError as exc:
            raise self.fail(step, f"{method} {path}: {type(exc).__name__}: {exc}") from None
        if r.status_code not in ok:
            raise self.fail(step, f"{method} {path} answered {r.status_code} {r.text[:300]!r}")
        return r


async def reset_engine(index: int, url: str, initial: InitialState, calls: Sequence[WireCall]) -> dict[str, Any]:
    """Reset the engine at ``url`` (see the module docstring) given its scenario's ``calls``; what was done.
    Raises :class:`EngineResetError` when a step fails or the engine is not back in its initial state."""
    groups, adapters, session = left_open(calls)
    done: dict[str, Any] = {}
    async with probe_client(STEP_TIMEOUT_S) as client:
        e = ResetCalls(index, url, client)
        await e.call("continue", "POST", "/continue_generation", {})
        await e.call("abort", "POST", "/abort_request", {"abort_all": True})
        done["idle_s"] = await _until_idle(e, "wait for idle")
        if session:  # 404: a release without sessions (before 0.5.23)
            r = await e.call("end the weight-update session", "POST", "/end_weight_update", {}, ok=(200, 400, 404))
            if r.status_code == 400 and NO_SESSION not in r.text:
                raise e.fail("end the weight-update session", f"answered 400 {r.text[:300]!r}")
            done["session_closed"] = r.status_code == 200
        for group in groups:
            r = await e.call(f"destroy group {group!r}", "POST", "/destroy_weights_update_group",
                             {"group_name": group}, ok=(200, 400))
            if r.status_code == 400 and "does not exist" not in r.text:
                raise e.fail(f"destroy group {group!r}", f"answered 400 {r.text[:300]!r}")
        done["groups_destroyed"] = groups
        listed = await _adapters(e)
        for name in dict.fromkeys([*listed, *adapters]):
            r = await e.call(f"unload adapter {name!r}", "POST", "/unload_lora_adapter", {"lora_name": name},
                             ok=(200, 400))
            if r.status_code == 400 and name in listed:
                raise e.fail(f"unload adapter {name!r}", f"answered 400 {r.text[:300]!r}")
        done["adapters_unloaded"] = listed
        r = await e.call("reload the initial checkpoint", "POST", "/update_weights_from_disk",
                         {"model_path": initial.model_path, "flush_cache": True, "abort_all_requests": False})
        if not _success(r):
            raise e.fail("reload the initial checkpoint", f"answered {r.text[:300]!r}")
        if initial.label is not None:
            await e.call("restore the label", "POST", "/update_weight_version",
                         {"new_version": initial.label, "abort_all_requests": False})
        await e.call("serve one token", "POST", "/generate", {
            "input_ids": [1, 2, 3], "sampling_params": {"max_new_tokens": 1, "temperature": 0.0}})
        await _until_idle(e, "flush the cache")
        await _verify(e, initial)
    return done


def _success(r: httpx.Response) -> bool:
    try:
        body = r.json()
    except ValueError:
        return False
    return not isinstance(body, dict) or body.get("success", True) is not False


async def _until_idle(e: ResetCalls, step: str) -> float:
    """Seconds until ``/flush_cache`` answered 200 (no request running or waiting, cache flushed)."""
    return await until_idle(e, step, "/flush_cache", lambda r: r.status_code == 200, ok=(200, 400))


async def until_idle(e: ResetCalls, step: str, path: str, idle: Callable[[httpx.Response], bool],
                     ok: Sequence[int] = (200,)) -> float:
    """Seconds until ``POST path`` (a cache reset the engine refuses while requests hold it) answered as ``idle``
    says; :class:`EngineResetError` after :data:`IDLE_TIMEOUT_S`."""
    t0 = time.monotonic()
    last = ""
    while time.monotonic() - t0 < IDLE_TIMEOUT_S:
        r = await e.call(step, "POST", path, None, ok=ok)
        if idle(r):
            return time.monotonic() - t0
        last = r.text[:200]
        await asyncio.sleep(0.05)  # poll: the engine says nothing when it becomes idle
    raise e.fail(step, f"{path} still refused after {IDLE_TIMEOUT_S:.0f}s (requests still running or waiting): "
                       f"{last!r}")


async def _adapters(e: ResetCalls) -> list[str]:
    r = await e.call("list adapters", "GET", "/v1/models")
    return [m["id"] for m in r.json().get("data", []) if m.get("parent")]


async def _verify(e: ResetCalls, initial: InitialState) -> None:
    r = await e.call("verify the label", "GET", "/model_info")
    label = r.json().get("weight_version")
    if label != initial.label:
        raise e.fail("verify the label", f"/model_info reports weight_version {label!r}, not the initial "
                                         f"{initial.label!r}")
    if await _adapters(e):
        raise e.fail("verify no adapter is loaded", f"/v1/models still lists {await _adapters(e)}")
    digests = await read_engine_digests(e.url, initial.params, STEP_TIMEOUT_S)
    differ = sorted(n for n in initial.digests if digests.get(n) != initial.digests[n])
    if differ:
        raise e.fail("verify the weights", f"{len(differ)} of {len(initial.digests)} parameters differ from the "
                                           f"initial checkpoint after reloading it (first: {differ[0]}: "
                                           f"{digests.get(differ[0])})")
