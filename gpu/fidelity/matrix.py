"""The state matrix: each control route the fake's state model acts on, sent with a valid body from each engine
state (and every plain GET of its route table, at once from each state), compared between the fake and real SGLang
(a server lifetime of its own, ``state matrix``).

The script (:mod:`gpu.fidelity.script`) walks the surface in one order, so a route is compared in the states that
order happens to leave the engine in. Here the cases are generated: :func:`probes` (route → valid body, from the
routes the release serves; the LoRA routes too on a server started with LoRA) × :func:`states` (idle; a request
decoding; paused in each mode, the running request held where the mode keeps it; inside a weight-update session where
the release has them). Each case builds its state from scratch, sends the call (marked with :data:`STATE_HEADER`, so
the coverage report knows the state it was sent in), and records its answer, or that none came within
:data:`ANSWER_S` (SGLang's pause gate holds a ``/generate``); then it undoes the state (continue, end the session),
reads what the call's late answer was, what became of the held request once it ended (the state or the call ended
it, or it ran its budget out: never the teardown, so its end is the engine's doing, not the machine's timing), and
the label, and relabels back. A case whose held request was not running when the call was sent is built again (at
most :data:`TRIES` times), and is recorded as not built (``running_at_call`` false) when it never was: the diff fails
it, two engines that both missed the situation never agree.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import Any, Awaitable, Callable

import httpx

from fakes.app import HANDLERS
from fakes.facts import SGLANG
from fakes.structs import endpoints

from .script import (CALL_TIMEOUT_S, STATE_HEADER, Held, Observation, Steps, forking_pickle_b64, generation, lora_adapter_dir,
                     lora_tensors_body, normalise)

ANSWER_S = 4.0
"""How long a call is given before it is recorded as not answered yet (then the state is undone); in the state
``decoding``, counted again from the held request's end (:data:`HELD_TOKENS`), which a call may wait for."""
HELD_TOKENS = 600
"""The held request's budget: 1.7-2.5 s of decoding on real SGLang on 2 cores (longer than the one second SGLang's
health check waits before it answers: ``entrypoints/http_server.py`` ``health_generate``), 0.6 s on the fake at the
1000 tokens/s the differential gives it; a case waits for what is left of it once the state is left."""
TRIES = 3
QUIET_S = 0.5
"""How long a paused engine's held request must have sent nothing before the call (SGLang's health check answers on
any output newer than itself: ``entrypoints/http_server.py`` ``health_generate``)."""
HEALTH = frozenset({"/health", "/health_generate"})
"""Sent apart from the other GETs: SGLang's health check answers as soon as any message from the scheduler arrives
after it (``entrypoints/http_server.py`` ``health_generate``), and ``/server_info`` asks the scheduler for its state."""
PAUSED = {"paused abort": "abort", "paused retract": "retract", "paused in_place": "in_place"}
HOLDING = ("decoding", "paused retract", "paused in_place")
"""The states in which a request is running (or kept by the pause) when the call is sent."""
LABEL = "default"


def states(release: str) -> tuple[str, ...]:
    """The engine states of ``release`` (a weight-update session only where it has them)."""
    session = ("in a session",) if SGLANG.fact("weight_update_sessions", release) else ()
    return ("idle", "decoding", *PAUSED, *session)


@dataclass(frozen=True)
class Probe:
    """One route's valid call; what makes it meaningful (``before``, idle, before the state is built) and what undoes
    it (``after``, once the state is left and the call answered)."""

    route: str
    body: Callable[[Steps], Any] | None = None
    method: str = "POST"
    before: Callable[[Steps], Awaitable[Any]] | None = None
    after: Callable[[Steps], Awaitable[Any]] | None = None


def _first(steps: Steps) -> tuple[str, Any]:
    name = next(iter(steps.ckpt.weights["m0"]))
    return name, steps.ckpt.weights["m0"][name]


def _tensor_body(steps: Steps) -> dict[str, Any]:
    return {"serialized_named_tensors": [forking_pickle_b64([_first(steps)])], "flush_cache": False}


PROBES = (
    Probe("/generate", lambda s: {"input_ids": [1, 2, 3], "sampling_params": {
        "max_new_tokens": 2, "temperature": 0, "ignore_eos": True}}),
    Probe("/pause_generation", lambda s: {"mode": "in_place"}),
    Probe("/continue_generation", lambda s: {}),
    Probe("/abort_request", lambda s: {"abort_all": True}),
    Probe("/update_weight_version", lambda s: {"new_version": "mx", "abort_all_requests": False}),
    Probe("/update_weights_from_disk", lambda s: {"model_path": str(s.ckpt.paths["m0"]), "flush_cache": False}),
    Probe("/update_weights_from_tensor", _tensor_body),
    Probe("/get_weights_by_name", lambda s: {"name": _first(s)[0], "truncate_size": 2}),
    Probe("/flush_cache"),
    Probe("/begin_weight_update", lambda s: {}),
    Probe("/end_weight_update", lambda s: {}),
)
"""The control routes, each with a valid body that leaves the served weights as they were (m0 loaded again)."""

ADAPTER = "matrix-adapter"
"""The LoRA adapter the LoRA probes load and unload."""


def _adapter_dir(steps: Steps) -> str:
    path = steps.work / "matrix-lora" / ADAPTER
    return str(path) if path.exists() else lora_adapter_dir(steps.ckpt, path.parent, ADAPTER)


async def _load_adapter(steps: Steps) -> None:
    await steps.client.post(steps.url + "/load_lora_adapter", json={"lora_name": ADAPTER,
                                                                    "lora_path": _adapter_dir(steps)})


async def _unload_adapter(steps: Steps) -> None:
    """Unload the probes' adapter (an error answer where it is not loaded, as the probe left it)."""
    await steps.client.post(steps.url + "/unload_lora_adapter", json={"lora_name": ADAPTER})


LORA_PROBES = (
    Probe("/load_lora_adapter", lambda s: {"lora_name": ADAPTER, "lora_path": _adapter_dir(s)},
          after=_unload_adapter),
    Probe("/load_lora_adapter_from_tensors", lambda s: lora_tensors_body(s.ckpt, s.release, ADAPTER),
          after=_unload_adapter),
    Probe("/unload_lora_adapter", lambda s: {"lora_name": ADAPTER}, before=_load_adapter, after=_unload_adapter),
)
"""The LoRA routes, on a server started with LoRA (each leaves no adapter loaded)."""


def probes(release: str, lora: bool = False) -> list[Probe]:
    """The probes of the routes the fake serves on ``release``: :data:`PROBES` (and :data:`LORA_PROBES` on a server
    started with ``lora``), and a GET of every route of its route table that takes a GET and no body or path
    parameter."""
    served = endpoints(release)
    gets = [Probe(route, method="GET") for route in HANDLERS if route in served and "{" not in route
            and served[route].get("methods") == ["GET"]]
    control = PROBES + (LORA_PROBES if lora else ())
    return [p for p in control if p.route in served] + gets


class _Case:
    """One state on one engine, and the probes sent from it (one control call, or every GET at once)."""

    def __init__(self, steps: Steps, probes: list[Probe], state: str) -> None:
        self.steps, self.probes, self.state = steps, probes, state
        self.held: Held | None = None

    def step(self, probe: Probe) -> str:
        return f"{probe.method} {probe.route} in state {self.state}"

    async def post(self, path: str, body: Any = None) -> httpx.Response:
        return await self.steps.client.post(self.steps.url + path, json=body)

    async def build(self, attempt: int) -> bool:
        """Put the engine in the state; whether the held request (where the state has one) is running."""
        running = True
        if self.state in HOLDING or self.state == "paused abort":
            self.held = Held(self.steps.client, self.steps.url, budget=HELD_TOKENS,
                             rid=f"matrix-{len(self.steps.out)}-{attempt}")
            running = await self.held.started()
        if self.state in PAUSED:
            await self.post("/pause_generation", {"mode": PAUSED[self.state]})
            if self.held is not None:  # what the engine had decoded before the pause has reached the client
                await self._quiet(self.held)
        if self.state == "in a session":
            await self.post("/begin_weight_update", {})
        if self.state == "paused abort" and self.held is not None:
            # the pause ended the held request: built only if it had not run its budget out first (the fake decodes
            # it in 0.6 s: a loaded CI machine once sent the pause after that, and all GETs of the state diverged)
            return running and not (await self.held.result()).get("full budget")
        return running and (self.held is None or not self.held.task.done())

    @staticmethod
    async def _quiet(held: Held) -> None:
        """Wait (at most :data:`ANSWER_S`) until ``held`` sent no chunk for :data:`QUIET_S`: SGLang's health check
        answers on any output that arrives after it was sent, and the last tokens decoded before a pause are still
        on their way when the pause answers."""
        deadline = time.monotonic() + ANSWER_S
        while time.monotonic() - held.last_chunk < QUIET_S and not held.task.done() and time.monotonic() < deadline:
            await asyncio.sleep(0.05)

    async def undo(self) -> None:
        """Leave the state: continue, end a session. The held request runs on to its end: aborting it here would
        race the call's own effect on it (an abort reaches the client after the call's answer, sooner or later)."""
        await self.post("/continue_generation", {})
        if self.state == "in a session" or any(p.route == "/begin_weight_update" for p in self.probes):
            await self.post("/end_weight_update", {})

    async def run(self) -> dict[str, Observation]:
        """Each probe's observation, by step."""
        client, url = self.steps.client, self.steps.url
        for probe in self.probes:
            if probe.before is not None:
                await probe.before(self.steps)
        for attempt in range(TRIES):
            running = await self.build(attempt)
            if running or attempt == TRIES - 1:
                break
            await self.undo()
            if self.held is not None:
                await self.held.result()
        calls = []
        for probe in self.probes:
            body = probe.body(self.steps) if probe.body else None
            calls.append(asyncio.ensure_future(client.request(
                probe.method, url + probe.route, headers={STATE_HEADER: self.state},
                **({"json": body} if body is not None else {}))))
        done, _ = await asyncio.wait(calls, timeout=ANSWER_S)
        if self.state == "decoding" and self.held is not None and len(done) < len(calls):
            # a call that waits for the request in flight answers once it ran its budget out, as slowly as the machine
            # decodes: counted from the call alone, 4 s missed it on real 0.5.23 (4 update calls of 4, one slow run)
            await asyncio.wait([self.held.task], timeout=CALL_TIMEOUT_S)
            done, _ = await asyncio.wait(calls, timeout=ANSWER_S)
        seen: list[Observation] = [{"answered before the state was left": call in done} for call in calls]
        await self.undo()
        after: Observation = {"running_at_call": running} if self.state in HOLDING else {}
        answers = [_answer(await call) for call in calls]
        for probe in self.probes:
            if probe.after is not None:
                await probe.after(self.steps)
        if self.held is not None:
            held = await self.held.result()
            after["held request"] = {k: held.get(k) for k in ("finish_reason.type", "full budget", "error")
                                     if k in held}
        info = (await client.get(url + "/model_info")).json()
        after["label after"] = info.get("weight_version")
        if info.get("weight_version") != LABEL:
            await self.post("/update_weight_version", {"new_version": LABEL, "abort_all_requests": False})
        return {self.step(p): {**s, **a, **after} for p, s, a in zip(self.probes, seen, answers)}


def _answer(response: httpx.Response) -> Observation:
    """A matrix call's answer: normalised, with what a ``/generate`` says of how it ended."""
    seen = normalise(response)
    if response.status_code == 200 and response.request.url.path == "/generate":
        seen.update({k: v for k, v in generation(response.json().get("meta_info"), 2).items()
                     if k in ("finish_reason.type", "full budget")})
    return seen


async def matrix_steps(steps: Steps, lora: bool = False) -> None:
    """Every probe of the routes the release serves (the LoRA routes on a server started with ``lora``), from every
    state of the release, into ``steps.out``. First a
    tensor update of the served weights, outside the cases: the fake imports torch at its first tensor payload
    (seconds on a busy machine), which would otherwise show as a call not answered in time."""
    if steps.sessions:
        await steps.call("matrix warm-up: begin_weight_update", "/begin_weight_update", {})
    await steps.call("matrix warm-up: tensor update", "/update_weights_from_tensor", _tensor_body(steps))
    if steps.sessions:
        await steps.call("matrix warm-up: end_weight_update", "/end_weight_update", {})
    every = probes(steps.release, lora)
    gets = [[p for p in every if p.method == "GET" and (p.route in HEALTH) == health] for health in (True, False)]
    idle_keys: dict[str, Any] = {}
    for state in states(steps.release):
        for group in [[p] for p in every if p.method != "GET"] + gets:  # GETs at once: none changes the state
            for step, seen in (await _Case(steps, group, state).run()).items():
                steps.out[step] = seen
                if step.startswith("GET "):  # what a GET answers idle is compared field by field in the main lifetime
                    keys = seen.pop("keys", None)
                    if state == "idle":
                        idle_keys[step.split()[1]] = keys
                    else:
                        seen["keys as in idle"] = keys == idle_keys[step.split()[1]]
