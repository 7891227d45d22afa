"""Scenarios: a workload plus a trainer script, run against an integration on a backend, producing a History.

Scenarios are backend-agnostic: they only use the roles, the backend's URLs and probes a real SGLang answers.
Every wait has a deadline; a hung integration fails the scenario with a message, never hangs the run.
"""

from __future__ import annotations

import asyncio
import itertools
import tempfile
import threading
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Awaitable, Callable, Mapping, Sequence, TypeVar

from .backends import Backend, digest_of, probe_labels, probe_post
from .checks.effective import pause_takes_mode
from .checks.labels import finish_type
from .checks.staleness import call_versions
from .fswatch import DirectoryWatch
from .history import BatchRecord, Breakage, History, Injected, OpenCall, UpdateCycle
from .interface import BuildEnv, Integration, LoraAdapter, Prompt, Roles, RolloutConfig, Updater
from .sentinels import Sentinels, adapters_in_use
from .wire import WireLog



@dataclass(frozen=True)
class Deadlines:
    """How long the suite waits on the integration and for the situations it sets up. A call into the integration
    past its deadline is a hang, a situation that never comes a timeout: either breaks the run."""

    update_s: float = 20.0
    """``Updater.update()``: one whole cycle."""
    drain_s: float = 15.0
    """``Manager.next_batch()``."""
    wait_s: float = 10.0
    """Building the roles, starting and stopping the manager, waiting for requests in flight."""
    script_s: float = 60.0
    """A whole scenario script."""


DEADLINES = Deadlines()
TRANSFER_FAILURES: dict[str, tuple[str, dict[str, Any]]] = {
    "disk": ("/update_weights_from_disk", {
        "success": False, "num_paused_requests": 0,
        "message": "Failed to update weights: CUDA out of memory (injected by the conformance suite).\n"
                   "Rolling back to original weights."}),
    "tensor": ("/update_weights_from_tensor", {
        "success": False, "message": "Failed to update weights: CUDA out of memory (injected by the conformance "
                                     "suite)."}),
    "distributed": ("/update_weights_from_distributed", {
        "success": False, "message": "Failed to update parameter online: CUDA out of memory (injected by the "
                                     "conformance suite)."}),
}
"""Per transport, the endpoint and the HTTP 400 body SGLang's handler answers when the load reports failure
(``sglang-api.md`` §3.2: ``{"success": false, "message": …}``; the disk and distributed messages are
``model_runner``'s). Injected at the wire, so the same fault works in front of real SGLang. Needed for the tensor
transport: SGLang answers a tensor load that raises (a wrong shape) by killing the server, not with a 400."""
PAUSE_CHECKS = frozenset({"I3", "I6", "C2"})
"""Checks about pausing: skipped, with the reason, for an integration that never pauses."""
STALL_S = 0.1
"""How long a wait for engine activity goes without it before consuming a batch to unblock the producer."""
CANCEL_GRACE_S = 2.0
T = TypeVar("T")


class Unsupported(Exception):
    """The integration lacks a capability the scenario needs (the test is skipped with this reason)."""


class RunBroken(Exception):
    """The run broke: the scenario stops there and every case of it fails (see :class:`Breakage`)."""

    kind = "error"

    def __init__(self, message: str, open_calls: list[OpenCall] | None = None) -> None:
        super().__init__(message)
        self.t = time.monotonic()
        self.open_calls = open_calls

    def breakage(self, wire: WireLog) -> Breakage:
        return Breakage(self.kind, str(self), self.t, self.open_calls if self.open_calls is not None
                        else open_calls(wire))


class UnexpectedUpdateFailure(RunBroken):
    """An update the scenario expected to succeed failed (the cycle is recorded)."""


class Hang(RunBroken):
    """A call into the integration did not return within its deadline."""

    kind = "hang"


class ScenarioTimeout(RunBroken):
    """The situation a scenario waited for did not come within its deadline."""

    kind = "timeout"


def open_calls(wire: WireLog) -> list[OpenCall]:
    """What is still waiting for an answer on the wire right now."""
    return [OpenCall(c.engine, c.method, c.path, c.t_start, c.origin) for c in wire.open_calls()]


async def bounded(coro: Awaitable[T], timeout_s: float, what: str, wire: WireLog,
                  broken: type[RunBroken] | None = None) -> T:
    """Await ``coro`` for at most ``timeout_s``; past it, raise ``broken`` (:class:`Hang` by default) naming
    ``what`` and the calls open on the wire at that moment (taken before the call is cancelled, which closes
    them)."""
    task = asyncio.ensure_future(coro)
    done, _ = await asyncio.wait({task}, timeout=timeout_s)
    if not done:
        stuck = open_calls(wire)
        task.cancel()
        await asyncio.wait({task}, timeout=CANCEL_GRACE_S)  # an integration may swallow the cancellation
        raise (broken or Hang)(f"{what} did not return within {timeout_s:g}s", stuck)
    return task.result()


class Trainer:
    """A stand-in trainer: deterministic new weights per step, over the engines' own parameter names."""

    def __init__(self, initial: Mapping[str, Any], seed: int) -> None:
        self.initial, self.seed = dict(initial), seed

    def weights(self, step: int) -> dict[str, Any]:
        import torch

        gen = torch.Generator().manual_seed(self.seed * 1000 + step)
        return {n: (t.float() + 0.01 * step * torch.randn(t.shape, generator=gen)).to(t.dtype)
                for n, t in self.initial.items()}

    def poisoned(self, step: int) -> dict[str, Any]:
        """Weights the engines must reject: the last parameter has the wrong shape (a transfer in buckets lands
        its early buckets before the failure)."""
        import torch

        weights = self.weights(step)
        name = list(weights)[-1]
        weights[name] = torch.zeros(*(d + 1 for d in weights[name].shape), dtype=weights[name].dtype)
        return weights

    def lora(self, step: int, rank: int = 2) -> LoraAdapter:
        import torch

        gen = torch.Generator().manual_seed(self.seed * 1000 + step)
        q_proj = next(n for n in self.initial if "q_proj" in n)
        out_dim, in_dim = self.initial[q_proj].shape
        prefix = "base_model.model." + q_proj.removesuffix(".weight")
        return LoraAdapter(name="policy", config={"r": rank, "lora_alpha": 2 * rank, "target_modules": ["q_proj"],
                                                  "peft_type": "LORA"},
                           tensors={f"{prefix}.lora_A.weight": torch.randn(rank, in_dim, generator=gen),
                                    f"{prefix}.lora_B.weight": torch.randn(out_dim, rank, generator=gen)})


async def wait_for_condition(predicate: Callable[[], bool], timeout_s: float, what: str) -> None:
    """Poll ``predicate`` until true; raise ScenarioTimeout naming ``what`` at the deadline."""
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise ScenarioTimeout(f"timed out after {timeout_s:.0f}s waiting for {what}")
        await asyncio.sleep(0.005)


@dataclass
class Run:
    """What a scenario script drives: the roles, the trainer, and recording helpers."""

    scenario: "Scenario"
    backend: Backend
    roles: Roles
    history: History
    trainer: Trainer
    updater: Updater
    transport: str = "tensor"
    """The scenario's transport, resolved against the integration's capabilities."""
    cell: int = 0
    step: int = 0
    deadlines: Deadlines = DEADLINES

    async def start(self) -> None:
        await bounded(self.roles.manager.start(), self.deadlines.wait_s, "Manager.start()", self.backend.wire)

    async def update(self, transport: str | None = None, *, lora: bool = False, poison: bool = False,
                     refuse: Sequence[int] = (), in_flight: float | None = None) -> int | None:
        """One update cycle, recorded with the labels, versions and digests around it.

        Every engine holds a request from the cycle's pause to its continue: the suite's own long-lived request
        (:mod:`conformance.sentinels`), sent before the cycle and released once the integration continued that
        engine. With ``in_flight`` the cycle also waits until every engine has one of the integration's generates
        open for that many seconds. The cycle is expected to fail with ``poison`` (weights every engine rejects: the
        last parameter has the wrong shape, so an integration that sends buckets sees its early buckets land first)
        or ``refuse`` (those engines answer every transfer call of the cycle with SGLang's failure, injected at the
        wire, while the others load the weights). A cycle that fails unexpectedly, or does not return within
        ``deadlines.update_s`` (a hang, even when a failure was expected), breaks the run."""
        transport = transport or self.transport
        expect_failure = poison or bool(refuse)
        manager, urls, wire = self.roles.manager, self.backend.urls, self.backend.wire
        step, index = self.step + 1, len(self.history.cycles)
        weights = None if lora else (self.trainer.poisoned(step) if poison else self.trainer.weights(step))
        adapter = self.trainer.lora(step) if lora else None
        labels_before, published_before, counter_before = await probe_labels(urls), manager.weight_version, \
            self.updater.version
        if in_flight is not None:
            await self.until_in_flight(1, min_age_s=in_flight)
        sentinels = Sentinels(urls, wire, self.backend.sentinel_tokens, f"c{index}",
                              adapters_in_use(wire, len(urls)), self.history)
        try:
            await sentinels.start()
        except TimeoutError as exc:
            raise ScenarioTimeout(str(exc)) from None
        for engine in refuse:
            self._refuse_transfer(engine, transport)
        t0 = time.monotonic()
        returned, error, hang = None, None, None
        try:
            returned = await bounded(self.updater.update(weights, transport=transport, lora=adapter),
                                     self.deadlines.update_s, f"Updater.update() (cycle {index}, {transport}"
                                     f"{', LoRA' if lora else ''})", wire)
        except Hang as exc:
            error, hang = str(exc), exc
        except Exception as exc:  # the integration's failure is data for the checkers
            error = f"{type(exc).__name__}: {exc}"
        finally:
            t1 = time.monotonic()
            await sentinels.release()
        unused = wire.clear_refusals()
        if unused:
            self.history.breaks.append(Breakage("error", f"the injected refusal of {unused} was never used: the "
                                                "integration did not call that endpoint on that engine during the "
                                                "cycle", time.monotonic()))
        if error is None and not poison:
            self.step = step
        self.history.cycles.append(UpdateCycle(
            index=index, cell=self.cell, transport=transport, lora=lora,
            pause_mode=self.scenario.pause_mode, t_start=t0, t_end=t1, ok=error is None, error=error,
            counter_before=counter_before, counter_after=self.updater.version, returned=returned,
            published_before=published_before, published_after=manager.weight_version,
            labels_before=labels_before, labels_after=await probe_labels(urls), expect_failure=expect_failure,
            trainer_digest=digest_of(weights) if weights is not None and not poison else None,
            digests_after=self.backend.digests()))
        if hang is not None:
            raise hang
        if error is not None and not expect_failure:
            raise UnexpectedUpdateFailure(f"update cycle {index} ({transport}{', LoRA' if lora else ''}) failed: "
                                          f"{error}")
        return returned

    def _refuse_transfer(self, engine: int, transport: str) -> None:
        """Make ``engine`` answer every transfer call of this cycle the way SGLang answers a load that failed."""
        path, body = TRANSFER_FAILURES[transport]
        self.backend.wire.refuse(engine, path, 400, body, times=None)
        self.history.injected.append(Injected(time.monotonic(), "refusal", engine, f"{path} answers 400 {body}"))

    async def drain(self, n: int = 1) -> None:
        """Consume ``n`` batches, recording the truth at consumption."""
        for _ in range(n):
            batch = await bounded(self.roles.manager.next_batch(), self.deadlines.drain_s, "Manager.next_batch()",
                                  self.backend.wire)
            now = time.monotonic()
            self.history.batches.append(BatchRecord(len(self.history.batches), now, batch,
                                                    self.history.published_truth_at(now)))

    async def failover(self) -> None:
        """Replace the trainer cell with a fresh one over the same engines and manager."""
        self.updater = self.roles.new_updater()
        self.cell += 1

    async def until_in_flight(self, per_engine: int = 1, min_age_s: float = 0.0) -> None:
        """Wait until every engine has ``per_engine`` generates in flight (open for at least ``min_age_s``, i.e.
        decoding by then). While that does not happen, one batch per engine is consumed every ``STALL_S``, as a
        trainer would: a producer blocked on a full buffer restarts one group per consumed batch, so consuming one
        at a time (or only once it went idle) can leave the engines taking turns forever, never decoding at once."""
        wire, engines = self.backend.wire, len(self.backend.urls)
        start = time.monotonic()
        deadline, stalled_since, consumed = start + self.deadlines.wait_s, start, 0
        while not all(wire.in_flight(min_age_s=min_age_s).get(e, 0) >= per_engine for e in range(engines)):
            now = time.monotonic()
            if now > deadline:
                raise ScenarioTimeout(f"timed out after {self.deadlines.wait_s:.0f}s waiting for {per_engine} "
                                      f"/generate "
                                      f"call(s) in flight on every engine (in flight: {wire.in_flight()}; "
                                      f"{consumed} batch(es) consumed meanwhile to unblock the producer)")
            if now - stalled_since > STALL_S:
                await self.drain(engines)
                consumed += engines
                stalled_since = time.monotonic()
            await asyncio.sleep(0.002)

    async def until_next_call(self) -> None:
        """Wait until every engine finished one more of the integration's ``/generate`` calls and has a call in
        flight that was sent after it (the next turn of a multi-turn sample, for a producer that keeps its
        samples on one engine)."""
        wire, engines = self.backend.wire, len(self.backend.urls)
        since = time.monotonic()

        def progressed() -> bool:
            calls = [c for c in wire.snapshot() if c.path == "/generate" and c.origin == "integration"]
            for engine in range(engines):
                done = [c.t_end for c in calls if c.engine == engine and c.t_end is not None and c.t_end >= since]
                if not done or not any(c.engine == engine and c.t_end is None and c.t_start >= min(done)
                                       for c in calls):
                    return False
            return True
        await wait_for_condition(progressed, self.deadlines.wait_s, "a finished /generate call followed by the next "
                                 "one in flight on every engine")

    async def until_producer_blocked(self, quiet_s: float = 0.1) -> None:
        """Wait until no /generate has been in flight for ``quiet_s``: the producer is blocked on a full buffer."""
        wire = self.backend.wire
        quiet_since: list[float | None] = [None]

        def blocked() -> bool:
            now = time.monotonic()
            quiet_since[0] = (quiet_since[0] or now) if not wire.in_flight() else None
            return quiet_since[0] is not None and now - quiet_since[0] >= quiet_s
        await wait_for_condition(blocked, self.deadlines.wait_s,
                                 "the producer to fill its buffer (no /generate in flight)")

    async def abort_in_flight(self) -> None:
        """Abort the requests every engine holds, as an operator or a crash would (not the integration's doing).
        So that some are held, the suite freezes the engines first (``pause`` in place, its own call; on ≤0.5.4
        that pause already aborts everything), checks on the wire that each held an integration request sent
        before, aborts everything (SGLang answers frozen requests once they continue) and continues the engines;
        it retries while an engine held nothing."""
        wire, urls = self.backend.wire, self.backend.urls
        deadline = time.monotonic() + self.deadlines.wait_s
        while True:
            await self.until_in_flight(1)
            mark = time.monotonic()
            injected = [Injected(mark, "abort", engine, "the suite froze the engine (pause in_place) and aborted "
                                 "every request it held (abort_all)") for engine in range(len(urls))]
            self.history.injected += injected
            await asyncio.gather(*(probe_post(url, "/pause_generation", {"mode": "in_place"}) for url in urls))
            held = {e for e in range(len(urls)) if any(
                c.engine == e and c.path == "/generate" and c.origin == "integration" and c.t_start < mark
                and (c.t_end is None or any(finish_type(o) == "abort" for o in c.generate_outputs()))
                for c in wire.snapshot())}
            await asyncio.gather(*(probe_post(url, "/abort_request", {"abort_all": True}) for url in urls))
            for item in injected:
                item.t_end = time.monotonic()
            await asyncio.gather(*(probe_post(url, "/continue_generation", {}) for url in urls))
            if len(held) == len(urls):
                return
            if time.monotonic() > deadline:
                raise ScenarioTimeout(f"no request was held by every engine to abort within "
                                      f"{self.deadlines.wait_s:.0f}s (engines holding one: {sorted(held)})")


Script = Callable[[Run], Awaitable[None]]


@dataclass(frozen=True)
class Scenario:
    """A named workload + trainer script, the capabilities it needs and the invariants it is checked for."""

    name: str
    doc: str
    script: Script
    checks: tuple[str, ...]
    transport: tuple[str, ...] = ("tensor", "disk", "distributed")
    """Transports the scenario's full updates may use, preferred first; the first the integration has is used."""
    pause_mode: str = "retract"
    rollout: RolloutConfig = RolloutConfig(batch_size=2, group_size=2, turns=2, max_new_tokens=16,
                                           max_in_flight_groups=3, buffer_capacity=4)
    needs: Mapping[str, Any] = field(default_factory=dict)

    full_updates: bool = True
    """False when the scenario only pushes LoRA adapters (no full-weight transport needed)."""

    def transport_for(self, integration: Integration) -> str | None:
        """The transport this scenario uses with ``integration`` (None when it has none of them)."""
        return next((t for t in self.transport if t in integration.capabilities.transports), None)

    def resolve(self, integration: Integration) -> "Scenario":
        """This scenario as it runs against ``integration``; raises :class:`Unsupported` with the reason.

        An abort-only integration runs every scenario in abort mode (and fails I2/I3 with the cost measured); one
        that never pauses runs in the scenario's mode, which it ignores; otherwise a mode it lacks skips. Without
        ``multi_turn`` the samples are single-turn, unless the scenario needs several turns."""
        caps = integration.capabilities
        if self.full_updates and self.transport_for(integration) is None:
            raise Unsupported(f"integration supports none of the transports this scenario needs "
                              f"{list(self.transport)} (declares {sorted(caps.transports)})")
        mode = self.pause_mode
        if caps.pause_modes == {"abort"}:
            mode = "abort"
        elif caps.pause_modes and mode not in caps.pause_modes:
            raise Unsupported(f"integration does not support pause mode {mode!r} "
                              f"(declares {sorted(caps.pause_modes)})")
        reason = caps.missing(**self.needs)
        if reason:
            raise Unsupported(reason)
        turns = self.rollout.turns if caps.multi_turn else 1
        return replace(self, pause_mode=mode, rollout=replace(self.rollout, turns=turns))

    def skipped_checks(self, integration: Integration, profile: str) -> dict[str, str]:
        """Checks of this scenario that cannot apply to ``integration`` on SGLang ``profile``, with the reason."""
        if not integration.capabilities.pause_modes:
            reason = "the integration never pauses (declares no pause mode)"
        elif not pause_takes_mode(profile):
            reason = (f"SGLang {profile} has no pause modes (every pause aborts), so a fully-async integration does "
                      f"not pause there; I1-I2 judges what its cycles do to the requests in flight")
        else:
            return {}
        return {c: reason for c in self.checks if c in PAUSE_CHECKS}


def prompt_source(seed: int, template: str = "Prompt {i} (seed {seed}): solve the task and explain.") \
        -> Callable[[], Prompt]:
    """A thread-safe data source: prompt ``i`` is ``template`` formatted with ``i`` and ``seed``."""
    counter, lock = itertools.count(), threading.Lock()

    def next_prompt() -> Prompt:
        with lock:
            i = next(counter)
        return Prompt(i, template.format(i=i, seed=seed))
    return next_prompt


async def run_scenario(scenario: Scenario, integration: Integration, backend: Backend, seed: int = 0,
                       deadlines: Deadlines = DEADLINES) -> History:
    """Run ``scenario`` against ``integration`` on a started ``backend``; never raises for integration bugs."""
    scenario = scenario.resolve(integration)
    caps = integration.capabilities
    history = History(scenario.name, integration.name, backend.name, backend.profile, seed,
                      max_staleness=scenario.rollout.max_staleness,
                      pause_mode=scenario.pause_mode if caps.pause_modes else None,
                      stamps_engines=caps.stamps_engines)
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory(prefix=f"conformance-{scenario.name}-") as tmp:
        env = BuildEnv(list(backend.urls), Path(tmp), scenario.rollout, prompt_source(seed), scenario.pause_mode, seed)
        env.checkpoint_dir.mkdir()
        watch = DirectoryWatch(env.checkpoint_dir).start()
        roles: Roles | None = None
        try:
            roles = await bounded(integration.build(env), deadlines.wait_s, "Integration.build()", backend.wire)
            run = Run(scenario, backend, roles, history, Trainer(backend.initial_weights(), seed), roles.new_updater(),
                      transport=scenario.transport_for(integration) or "tensor", deadlines=deadlines)
            await bounded(scenario.script(run), deadlines.script_s, f"scenario {scenario.name}", backend.wire,
                          ScenarioTimeout)
        except RunBroken as exc:
            history.breaks.append(exc.breakage(backend.wire))
        except Exception as exc:
            history.breaks.append(Breakage("error", f"{type(exc).__name__}: {exc}", time.monotonic(),
                                           open_calls(backend.wire)))
        finally:
            if roles is not None:
                for name, closer in (("Manager.stop()", roles.manager.stop), ("Roles.close()", roles.close)):
                    if closer is None:
                        continue
                    try:
                        await bounded(closer(), deadlines.wait_s, name, backend.wire)
                    except RunBroken as exc:
                        history.breaks.append(exc.breakage(backend.wire))
                    except Exception as exc:
                        history.breaks.append(Breakage("error", f"{name} failed: {type(exc).__name__}: {exc}",
                                                       time.monotonic(), open_calls(backend.wire)))
            history.fs = watch.stop()
    history.wire = backend.wire.snapshot()
    history.final_labels = await probe_labels(list(backend.urls))
    history.engine_truth = backend.truth()
    history.rebase(t0)
    return history


# -- the scenarios ------------------------------------------------------------------------------------------

async def _steady(run: Run) -> None:
    await run.start()
    for _ in range(2):
        await run.drain(1)
        await run.update(in_flight=0.0)
    await run.drain(1)


async def _first_drain(run: Run) -> None:
    await run.start()
    await run.drain(2)
    await run.update(in_flight=0.0)
    await run.drain(2)


def _consumed_mixed_group(history: History) -> bool:
    """Whether a consumed group was generated under more than one version (per turn and span, or with
    client-side versions per the version each call was sent under), as S2 reads it."""
    outputs = history.outputs_by_rid()
    for rec in history.batches:
        for group in rec.batch.groups:
            versions = {v for s in group.samples for t in s.turns if t.rid in outputs
                        for v in call_versions(history, *outputs[t.rid])}
            if len(versions) > 1:
                return True
    return False


async def _mixed_versions(run: Run) -> None:
    """Update while multi-turn samples decode, until a consumed group was generated under two versions. Each update
    waits until every engine finished a call and has the next one in flight, so it lands on a later turn of a
    sample (releases without per-token spans label a whole call with the version current when it ends)."""
    rollout = run.scenario.rollout
    await run.start()
    for _ in range(8):
        await run.until_next_call()
        await run.update(in_flight=0.0)
        for _ in range((rollout.max_in_flight_groups + rollout.buffer_capacity) // rollout.batch_size + 1):
            await run.drain(1)
            run.history.wire = run.backend.wire.snapshot()
            if _consumed_mixed_group(run.history):
                return
    raise ScenarioTimeout("no group generated under more than one version was consumed in 8 updates")


async def _failover(run: Run) -> None:
    await run.start()
    await run.drain(1)
    for _ in range(2):
        await run.update(in_flight=0.0)
    await run.drain(1)
    await run.failover()
    for _ in range(2):
        await run.update(in_flight=0.0)
        await run.drain(1)


async def _failing_transfer(run: Run) -> None:
    """Disk and distributed: weights every engine rejects (the last parameter has the wrong shape: SGLang answers
    400; disk rolls back). Tensor: SGLang answers a tensor load that raises by killing the server, so every
    engine's transfer is refused at the wire with the 400 SGLang's handler gives a load that reports failure."""
    await run.start()
    await run.drain(1)
    if run.transport == "tensor":
        await run.update(refuse=range(len(run.backend.urls)), in_flight=0.0)
    else:
        await run.update(poison=True, in_flight=0.0)
    await run.update()
    await run.drain(1)


async def _one_engine_rejects(run: Run) -> None:
    await run.start()
    await run.drain(1)
    await run.update(refuse=[len(run.backend.urls) - 1], in_flight=0.0)
    await run.update()
    await run.drain(1)


async def _lora(run: Run) -> None:
    await run.start()
    await run.drain(1)
    for _ in range(2):
        await run.update(lora=True, in_flight=0.0)
        await run.drain(1)


async def _staleness(run: Run) -> None:
    """Groups at exactly the bound (1), then at bound + 1, reach consumption by construction."""
    rollout = run.scenario.rollout
    await run.start()
    await run.update()  # version 1
    await run.drain(rollout.buffer_capacity // rollout.batch_size + 1)  # what was buffered before version 1
    await run.until_producer_blocked()  # the buffer is full of groups generated under version 1
    await run.update()  # version 2: the buffered groups are exactly at the bound
    await run.drain(1)  # ... and must be admitted
    await run.until_producer_blocked()  # the room it made went to version-1 groups that were waiting to be put
    await run.update()  # version 3: the buffer holds version-1 groups at bound + 1, which must be rejected
    await run.drain(3)


async def _aborted_groups(run: Run) -> None:
    await run.start()
    await run.update()
    await run.abort_in_flight()
    await run.drain(run.scenario.rollout.buffer_capacity // run.scenario.rollout.batch_size + 2)


_STEADY_CHECKS = ("I1-I2", "I3", "I6", "V1", "V2", "P1", "P6", "S2", "V4-S1")


def _steady_scenarios() -> list[Scenario]:
    out = []
    for transport in ("disk", "tensor", "distributed"):
        for mode in ("retract", "in_place"):
            checks = _STEADY_CHECKS + (("C2",) if mode == "in_place" else ()) + (("F3",) if transport == "disk" else ())
            out.append(Scenario(f"steady-{transport}-{mode}",
                                f"multi-turn rollouts, two {transport} updates under pause {mode}",
                                _steady, checks, transport=(transport,), pause_mode=mode))
    return out


_BASE = Scenario("base", "", _steady, ())
SCENARIOS: dict[str, Scenario] = {s.name: s for s in [
    *_steady_scenarios(),
    replace(_BASE, name="first-drain", doc="batches drained before the first update, staleness bound on",
            script=_first_drain, checks=("V3", "S2"),
            rollout=replace(_BASE.rollout, max_staleness=1), needs={"staleness_filter": True}),
    replace(_BASE, name="mixed-versions", doc="three-turn samples generating while updates land, until one spanning "
            "two versions is consumed",
            script=_mixed_versions, checks=("S2", "I1-I2", "I3", "V1"), pause_mode="in_place",
            needs={"multi_turn": True},
            rollout=replace(_BASE.rollout, batch_size=1, group_size=1, turns=3, max_new_tokens=64,
                            max_in_flight_groups=2,
                            buffer_capacity=2)),
    replace(_BASE, name="failover", doc="two updates, failover to a fresh trainer cell, two more",
            script=_failover, checks=("V4-S1", "V1", "I1-I2", "I3"), needs={"failover": True}),
    *(replace(_BASE, name=f"failing-transfer-{t}", doc=f"a {t} update the engines reject ("
              + ("every transfer refused at the wire with SGLang's 400: a tensor load that raises kills the server"
                 if t == "tensor" else "the last parameter has the wrong shape: SGLang answers 400"
                 + (", rolled back" if t == "disk" else "")) + "), then a good one",
              script=_failing_transfer, checks=("V2", "P5", "I6", "V1"), transport=(t,))
      for t in ("disk", "tensor", "distributed")),
    replace(_BASE, name="one-engine-rejects", doc="the last engine answers every transfer call with SGLang's failure "
            "(400, success: false; injected at the wire) while the others load the weights, then a good update",
            script=_one_engine_rejects, checks=("P5", "V2", "I6", "V1", "P6"), transport=("disk",)),
    replace(_BASE, name="lora", doc="two LoRA updates while rollouts run",
            script=_lora, checks=("V1", "I1-I2", "I3", "I6", "P7"), needs={"lora": True}, full_updates=False),
    replace(_BASE, name="staleness", doc="groups buffered while three updates land; bound 1 at consumption",
            script=_staleness, checks=("S3", "S2", "V4-S1"),
            rollout=replace(_BASE.rollout, max_staleness=1, buffer_capacity=8), needs={"staleness_filter": True}),
    replace(_BASE, name="aborted-groups", doc="every engine aborts its requests mid-rollout (injected)",
            script=_aborted_groups, checks=("I4",)),
]}
"""Scenario name → scenario."""
