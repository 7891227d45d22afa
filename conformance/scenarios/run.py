"""The run a scenario script drives: its roles, its trainer, update cycles with the faults the suite injects at the
wire (refused transfers, aborts of what the engines hold), drains, failover, and the waits for the situations a
scenario sets up. Backend-agnostic: only the roles, the backend's URLs and probes a real SGLang answers."""

from __future__ import annotations

import asyncio
import math
import os
import time
from dataclasses import dataclass, field, fields, replace
from typing import Any, Callable, Iterable, Sequence

from fakes.facts import SGLANG

from ..backends import SENTINEL_SECONDS, Backend, probe_labels, probe_post, trainer_digests
from ..checks import REGISTRY
from ..checks.labels import finish_type
from ..history import DISTURBING_PATHS, LORA_LOAD_PATHS, BatchRecord, Breakage, History, Injected, Unmet, UpdateCycle, WireCall
from ..interface import RolloutConfig, Roles, Updater
from ..sentinels import SETTLE_S, START_TIMEOUT_S as SENTINEL_START_TIMEOUT_S, Sentinels, adapters_in_use
from ..wire_control import AnswerHold
from .errors import Hang, ScenarioTimeout, UnexpectedUpdateFailure, bounded, wait_for_condition
from .trainer import Trainer


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
    teardown_s: float = 60.0
    """Beyond the script's deadline: building the roles and tearing down are bounded too, so past the script's
    deadline plus this last-resort margin the backend is stopped and the scenario reported as hung."""


    def scaled(self, factor: float) -> Deadlines:
        """Every deadline times ``factor``."""
        return Deadlines(*(getattr(self, f.name) * factor for f in fields(self)))

    def with_update_budget(self, budget_s: float | None) -> Deadlines:
        """These deadlines for an integration that declares ``Capabilities.update_budget_s``: an update may take the
        budget where it is longer than :attr:`update_s`, and a scenario two such updates more."""
        extra = 0.0 if budget_s is None else max(0.0, budget_s - self.update_s)
        return replace(self, update_s=self.update_s + extra, script_s=self.script_s + 2 * extra)


def _scale_from_env() -> float:
    raw = os.environ.get("WEIGHTSYNC_DEADLINE_SCALE", "1")
    try:
        factor = float(raw)
    except ValueError:
        factor = 0.0
    if not factor > 0:
        raise ValueError(f"WEIGHTSYNC_DEADLINE_SCALE={raw!r}: expected a positive number (e.g. 3 for slow engines)")
    return factor


DEADLINES = Deadlines().scaled(_scale_from_env())
"""The suite's deadlines; ``WEIGHTSYNC_DEADLINE_SCALE`` (read at import) multiplies them all (slow engines: 3)."""
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
distributed messages are ``model_executor/model_runner.py``'s). Injected at the wire, so the same fault works in
front of real SGLang. Needed for the tensor and disk transports: SGLang answers a load over them that raises by
killing the server, not with a 400 (``SGLANG.load_failure_kills``)."""
LORA_FAILURE: tuple[tuple[str, ...], dict[str, Any]] = (
    tuple(sorted(LORA_LOAD_PATHS)),
    {"success": False, "error_message": "Failed to load LoRA adapter: CUDA out of memory (injected by the conformance "
                                        "suite).", "loaded_adapters": {}})
"""The LoRA loads and the HTTP 400 body SGLang answers when one fails (``LoRAUpdateOutput``,
``managers/tokenizer_communicator_mixin.py`` ``load_lora_adapter``, 0.5.10–0.5.23); both endpoints are refused, an
integration uses one of them."""
STALL_S = 0.1
"""How long a wait for engine activity goes without it before consuming a batch to unblock the producer."""
SPARE = 0.25
"""The share of its decode time a request on another engine still has to go when a resident cycle's first disturbing
call goes on (:meth:`Run.holds_young`)."""
LINGER_S = 0.2
"""How long a slow engine's call stays in progress after every other engine answered its own (:meth:`Run.hold_slow`)."""
TURN_S = 0.15
"""How long one of the integration's turns decodes, at least (the scenarios raise ``max_new_tokens`` to that at the
backend's decode speed): a request sent at most half of it before a cycle starts is still decoding when the cycle
reaches its engine, whatever the cycle does first."""


def decode_rate(backend: Backend) -> float:
    """Tokens per second one request decodes at on ``backend`` (from its long-lived requests' budget when it does not
    say)."""
    rate = getattr(backend, "decode_tokens_per_s", None)
    return float(rate) if rate else backend.sentinel_tokens / SENTINEL_SECONDS


def _open_everywhere(calls: list[WireCall], engines: Iterable[int]) -> bool:
    """Whether each of ``engines`` has one of ``calls`` still open."""
    return all(any(c.engine == e and c.t_end is None for c in calls) for e in engines)


@dataclass
class Run:
    """What a scenario script drives: the roles, the trainer, and recording helpers."""

    backend: Backend
    roles: Roles
    history: History
    trainer: Trainer
    updater: Updater
    rollout: RolloutConfig
    """The workload the manager runs (the scenario's, resolved against the integration)."""
    pause_mode: str
    """The pause mode the integration was asked to run in (recorded with each cycle)."""
    transport: str = "tensor"
    """The scenario's transport, resolved against the integration's capabilities."""
    cell: int = 0
    step: int = 0
    deadlines: Deadlines = DEADLINES
    update_budget_s: float | None = None
    """The integration's declared ``Capabilities.update_budget_s`` (the deadlines already allow for it)."""
    _feeding: asyncio.Task[None] | None = field(default=None, init=False, repr=False)
    """A batch taken while a failed cycle's calls were held, still awaited: its engines may be out of service until
    a later cycle loads whole weights (P8), so it comes then (:meth:`_fed`)."""

    async def start(self) -> None:
        """Start the manager; record the version it publishes for the initial weights (None, or e.g. 0)."""
        await bounded(self.roles.manager.start(), self.deadlines.wait_s, "Manager.start()", self.backend.wire)
        if not self.history.cycles:
            self.history.initial_version = self.roles.manager.weight_version

    async def update(self, transport: str | None = None, *, lora: bool = False, poison: bool = False,
                     refuse: Sequence[int] = (), resident: bool = False, gate: bool = False,
                     slow: str | None = None) -> int | None:
        """One update cycle, recorded with the labels, versions and digests around it.

        Every engine holds a request from the cycle's pause to its continue: the suite's own long-lived request
        (:mod:`conformance.sentinels`), sent before the cycle and released once the integration continued that
        engine; the cycle's first pause, bump or transfer on each engine waits at the wire (at most
        :data:`~conformance.sentinels.START_TIMEOUT_S`) until some request has been open there for
        :data:`~conformance.sentinels.SETTLE_S` (one that ended on its own is being sent again: on a starved machine
        its end and the pause are seen in the same instant). With ``resident`` the cycle also starts only once every
        engine the integration sends requests to is decoding one of them (:meth:`until_resident`), and the cycle's first pause, bump or transfer on each engine
        is held at the wire (for at most two turns, at least 0.5 s, at most a quarter of the cycle's deadline) until
        that engine holds one sent less than half a turn ago and the others one still decoding for a while
        (:meth:`holds_young`; a cycle may take a while before its first pause: a process group to build, a
        checkpoint to write); while held, batches are consumed when the producer stalls. The cycle is expected
        to fail with ``poison`` (weights every engine rejects: the last parameter has the wrong shape, so an
        integration that sends buckets sees its early buckets land first)
        or ``refuse`` (those engines answer every transfer call of the cycle with SGLang's failure, injected at the
        wire, while the others load the weights; a cycle may fail fast, at the first refusal, leaving the others
        unused). With ``gate`` the integration gets answers while its engines are paused (:meth:`hold_answers`), so
        what it sends next meets SGLang's pause gate. With ``slow`` (``pause``, ``transfer`` or ``continue``) the last
        engine is slow at that step: the answer to its first such call is held until every other engine answered
        its own (:meth:`hold_slow`), so what the integration does once the others are done happens while that
        engine's call is still in progress (recorded as an injected ``window``; when it never opens, every check of
        the run answers unknown with the reason). A cycle that fails unexpectedly, or does not return within
        ``deadlines.update_s`` (a hang, even when a failure was expected), breaks the run."""
        if resident and gate or gate and slow:
            raise ValueError("update(): gate holds the cycle's calls and answers at the wire; not with resident or "
                             "slow")
        transport = transport or self.transport
        expect_failure = poison or bool(refuse)
        manager, urls, wire, control = self.roles.manager, self.backend.urls, self.backend.wire, self.backend.control
        step, index = self.step + 1, len(self.history.cycles)
        weights = None if lora else (self.trainer.poisoned(step) if poison else self.trainer.weights(step))
        adapter = self.trainer.lora(step) if lora else None
        labels_before, published_before, counter_before = await self.labels(), manager.weight_version, \
            self.updater.version
        digests_before = self.backend.digests() if expect_failure and not lora else None
        if resident:
            await self.until_resident(index)
        # the answers are held first (which waits for one): the long-lived requests then start as the cycle does
        answers, unfollow = await self.hold_answers() if gate else (None, lambda: None)
        sentinels = Sentinels(urls, wire, self.backend.sentinel_tokens, f"c{index}",
                              adapters_in_use(wire, len(urls)), self.history, dialect=self.backend.dialect)
        try:
            await sentinels.start()
        except TimeoutError as exc:
            control.release_holds()
            unfollow()
            raise ScenarioTimeout(str(exc)) from None
        refused = [self._refuse_transfer(engine, transport, lora) for engine in refuse]
        if resident:  # the cycle's first pause, bump or transfer reaches each engine while it holds such a request
            control.hold_first(DISTURBING_PATHS, self.holds_young,
                               min(max(0.5, 2 * self.turn_s()), self.deadlines.update_s / 4),
                               then=self.holds_any, then_timeout_s=SENTINEL_START_TIMEOUT_S)
        elif not gate:  # ... while it holds some request (a long-lived one that just ended is sent again meanwhile)
            control.hold_first(DISTURBING_PATHS, lambda engine, _: self.holds_any(engine), SENTINEL_START_TIMEOUT_S)
        window, unfollow_window = self.hold_slow(slow, transport, lora) if slow else (None, lambda: None)
        feeder = asyncio.create_task(self._feed_held()) if resident else None
        t0 = time.monotonic()
        returned, error, hang = None, None, None
        try:
            returned = await bounded(self.updater.update(weights, transport=transport, lora=adapter),
                                     self.deadlines.update_s, f"Updater.update() (cycle {index}, {transport}"
                                     f"{', LoRA' if lora else ''})", wire)
        except Hang as exc:
            budget = ("the integration's declared Capabilities.update_budget_s" if self.update_budget_s else
                      "the suite's update deadline: declare Capabilities.update_budget_s where an update may take "
                      "longer, retries included")
            hang = Hang(f"{exc} ({budget})", exc.open_calls)
            hang.t, error = exc.t, str(hang)
        except Exception as exc:  # the integration's failure is data for the checkers
            error = f"{type(exc).__name__}: {exc}"
        finally:
            t1 = time.monotonic()
            expired = control.release_holds()
            unfollow()
            unfollow_window()
            fed: list[BaseException | None] = [None]
            if feeder is not None and error is not None and not feeder.done():
                self._feeding = feeder  # do not wait here for engines a failed load may keep out of service
            elif feeder is not None:
                fed = await asyncio.gather(feeder, return_exceptions=True)
            await sentinels.release()
        held_until = ("the continue was held until the integration sent a request while paused" if gate else
                      "the first pause, bump or transfer was held until "
                      + ("one of the integration's requests was decoding there" if resident else
                         "a request was resident there"))
        for engine, how in sorted(expired.items()):  # a hold that went on at its bound built less than it aimed at
            waited = "" if how.then is None else (
                f", then until a request resident there had {SPARE:.0%} of its decode time left" if how.then else
                f", then {SENTINEL_START_TIMEOUT_S:.0f}s more: no request resident there had {SPARE:.0%} of its "
                f"decode time left")
            self.history.injected.append(Injected(how.at, "hold-expired", engine, (
                f"update cycle {index}: {held_until}; none was, it went on at the hold's bound (held "
                f"{how.held_s:.2f}s{waited})")))
        left = set(control.clear_refusals())  # an engine refused on several paths (LoRA) needs to have used one
        unused = sorted(left - {key for keys in refused if not set(keys) <= left for key in keys})
        if unused and error is None:  # a cycle that failed at the first refusal need not reach the others
            self.history.breaks.append(Breakage("error", f"the injected refusal of {unused} was never used: the "
                                                "integration did not call that endpoint on that engine during the "
                                                "cycle", time.monotonic()))
        if error is None and not poison:
            self.step = step
        try:
            digests_after, gone = self.backend.digests(), None
        except Exception as exc:  # an engine gone by the cycle's end: the cycle is recorded, then the run breaks
            digests_after, gone = None, exc
        if digests_after is not None and self.history.initial_digest is None:  # the backend reads weights
            self.history.initial_digest = trainer_digests(self.backend, self.trainer.initial)
        self.history.cycles.append(UpdateCycle(
            index=index, cell=self.cell, transport=transport, lora=lora,
            pause_mode=self.pause_mode, t_start=t0, t_end=t1, ok=error is None, error=error,
            counter_before=counter_before, counter_after=self.updater.version, returned=returned,
            published_before=published_before, published_after=manager.weight_version,
            labels_before=labels_before, labels_after=await self.labels(), expect_failure=expect_failure,
            trainer_digest=trainer_digests(self.backend, weights) if weights is not None else None,
            digests_after=digests_after, digests_before=digests_before))
        if answers is not None and answers.released_by != "ready":
            why = "its cycle ended first" if answers.released_by == "end" else f"not within {answers.timeout_s:.1f}s"
            self.unmet(("S2",), f"update cycle {index}: the answers held back from the integration went on before "
                       f"every engine was paused ({why}): what it sends while its engines are paused (SGLang's pause "
                       f"gate holds it) is not shown")
        if window is not None and slow:
            self._record_window(window, slow, index)
        if hang is not None:
            raise hang
        if gone is not None:
            raise gone
        if isinstance(fed[0], BaseException):  # consuming a batch while the cycle's calls were held failed
            raise fed[0]
        if error is None:
            await self._fed()
        if error is not None and not expect_failure:
            raise UnexpectedUpdateFailure(f"update cycle {index} ({transport}{', LoRA' if lora else ''}) failed: "
                                          f"{error}")
        return returned

    def _refuse_transfer(self, engine: int, transport: str, lora: bool) -> list[tuple[int, str]]:
        """Make ``engine`` answer every transfer call of this cycle (its adapter loads for a LoRA update) the way
        SGLang answers a load that failed (on vLLM: make the engine fail it itself, ``Dialect.failing_load``); the
        (engine, path) refused."""
        if lora:
            paths, body = LORA_FAILURE
        else:
            path, body = TRANSFER_FAILURES[transport]
            paths = (path,)
        rewrites = {path: self.backend.dialect.failing_load(path) for path in paths}
        for path in paths:
            self.backend.control.refuse(engine, path, 400, body, times=None, rewrite=rewrites[path])
        how = (f"{' and '.join(paths)} sent on pointing at a missing path, which the engine fails itself"
               if all(rewrites.values()) else f"{' and '.join(paths)} answer 400 {body}")
        self.history.injected.append(Injected(time.monotonic(), "refusal", engine, how))
        return [(engine, path) for path in paths]

    def hold_slow(self, step: str, transport: str, lora: bool) -> tuple[AnswerHold, Callable[[], None]]:
        """Make the last engine slow at ``step`` of the coming cycle: the answer to its first pause, transfer (the
        transport's endpoint, or an adapter load) or continue is held until every other engine answered its own and
        had none open for :data:`LINGER_S` (at most a quarter of the cycle's deadline). Returns the hold and the
        function that stops following the wire."""
        if step == "transfer" and transport == "distributed" and not lora:
            raise ValueError("update(slow='transfer'): a distributed transfer is one collective, every engine "
                             "finishes it together")
        paths = {"pause": frozenset({"/pause_generation"}), "continue": frozenset({"/continue_generation"}),
                 "transfer": LORA_LOAD_PATHS if lora else frozenset({TRANSFER_FAILURES[transport][0]})}[step]
        wire, slow = self.backend.wire, len(self.backend.urls) - 1
        others = set(range(len(self.backend.urls))) - {slow}
        open_: dict[int, int] = dict.fromkeys(others, 0)
        answered: set[int] = set()
        quiet: list[float | None] = [None]

        def follow(call: WireCall, done: bool) -> None:
            if call.origin == "integration" and call.path in paths and call.engine in others:
                open_[call.engine] += -1 if done else 1
                answered.update([call.engine] if done else [])

        def others_done() -> bool:
            now, done = time.monotonic(), answered == others and not any(open_.values())
            quiet[0] = (quiet[0] or now) if done else None
            return quiet[0] is not None and now - quiet[0] >= LINGER_S
        stop = wire.listen(follow)
        hold = self.backend.control.hold_answers(others_done, self.deadlines.update_s / 4, paths, engine=slow,
                                                 first_only=True)
        return hold, stop

    def _record_window(self, window: AnswerHold, step: str, cycle: int) -> None:
        """Record the window :meth:`hold_slow` held open, or that it never opened (every check answers unknown; a
        pause or continue the integration never sends is no window to open)."""
        engine, paths = window.engine, " or ".join(sorted(window.paths))
        if window.released_by == "ready" and window.held_at is not None:
            self.history.injected.append(Injected(
                window.held_at, "window", engine, f"update cycle {cycle}: the answer to engine {engine}'s first "
                f"{paths} was held until every other engine had answered its own (a slow {step})",
                t_end=window.released_at))
            return
        if not window.held and step != "transfer":  # an integration that never pauses: nothing to be slow at
            return
        why = ("the integration sent it no such call" if not window.held else
               "its cycle ended first" if window.released_by == "end" else
               f"the other engines had not all answered theirs within {window.timeout_s:.1f}s")
        self.unmet(tuple(REGISTRY), f"update cycle {cycle}: engine {engine}'s {paths} was not kept in progress "
                   f"while the other engines had finished theirs ({why}): a slow {step} is not shown")

    async def labels(self) -> list[str | None]:
        """Each engine's version label, probed in the engines' dialect."""
        return await probe_labels(self.backend.urls, dialect=self.backend.dialect)

    async def post_all(self, path: str, body: Any) -> None:
        """A call of the suite's own (not recorded) to every engine, in their dialect."""
        await asyncio.gather(*(probe_post(url, path, body, dialect=self.backend.dialect) for url in self.backend.urls))

    def turn_s(self) -> float:
        """How long one of the integration's turns decodes: its ``max_new_tokens`` at :func:`decode_rate`, at least
        :data:`TURN_S`."""
        return max(TURN_S, self.rollout.max_new_tokens / decode_rate(self.backend))

    async def hold_answers(self) -> tuple[AnswerHold, Callable[[], None]]:
        """Before a cycle: hold back the answers to the integration's ``/generate`` calls (once one is held) until
        every engine is paused by it, then hand them over; each engine's continue waits (at most two turns) until the
        integration sent that engine a call after that. A call sent then is held at SGLang's pause gate and runs
        entirely under the weights the cycle installs; an integration may also wait before sending (its own gate).
        While no answer is held and none of its calls is open, batches are consumed (:meth:`_unstall`): its producer
        may be blocked on a full buffer. Returns the hold and the function that stops following the wire (once the
        cycle is over)."""
        wire, engines = self.backend.wire, len(self.backend.urls)
        paused: set[int] = set()
        sent: set[int] = set()  # engines sent a /generate once the answers went on
        decoding: dict[int, tuple[int, int]] = {}  # the suite's long-lived requests open: seq -> (seq, engine)

        def follow(call: WireCall, answered: bool) -> None:
            if call.origin == "sentinel" and call.path == "/generate":
                if answered:
                    decoding.pop(call.seq, None)
                else:
                    decoding[call.seq] = (call.seq, call.engine)
                return
            if call.origin != "integration":
                return
            if call.path == "/pause_generation" and answered and call.ok:
                paused.add(call.engine)
            elif call.path == "/continue_generation":
                paused.discard(call.engine)
            elif call.path == "/generate" and not answered and hold.released_at is not None:
                sent.add(call.engine)
        # a pause that drains before it answers (vLLM's wait, recorded as retract) answers once the suite's long-lived
        # request ended: the bound runs only while no engine left unpaused still decodes one
        hold = self.backend.control.hold_answers(
            lambda: len(paused) == engines, max(2.0, 4 * self.turn_s()),
            waiting=lambda: any(engine not in paused for _, engine in list(decoding.values())))
        stop = wire.listen(follow)
        stalled_since = time.monotonic()

        async def unstall() -> None:  # a producer blocked on a full buffer sends nothing more until a batch is taken
            nonlocal stalled_since
            stalled_since = await self._unstall(stalled_since, bool(wire.in_flight()), 1)

        await wait_for_condition(lambda: hold.held > 0, self.deadlines.wait_s,
                                 "an answer to one of the integration's /generate calls (to hand it over while every "
                                 "engine is paused)", between=unstall)
        self.backend.control.hold_first(frozenset({"/continue_generation"}), lambda engine, _: engine in sent,
                                        2 * self.turn_s())
        return hold, stop

    async def _fed(self) -> None:
        """Wait for the batch a failed cycle's feeder was still taking (bounded by its own drain deadline)."""
        feeding, self._feeding = self._feeding, None
        if feeding is not None:
            await feeding

    async def drain(self, n: int = 1) -> None:
        """Consume ``n`` batches, recording the truth at consumption."""
        await self._fed()
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

    def shows(self, situation: Callable[[History], bool]) -> bool:
        """Whether the run's history so far (the wire as recorded now) shows ``situation``: how a script asks
        whether what it sets out to build has happened."""
        self.history.wire = self.backend.wire.snapshot()
        return situation(self.history)

    def unmet(self, checks: tuple[str, ...], reason: str) -> None:
        """Record a situation this run could not build: ``checks``, which needed it, answer unknown with ``reason``
        (the others judge the run as it went)."""
        self.history.unmet.append(Unmet(checks, reason, time.monotonic()))

    def used_engines(self) -> list[int]:
        """The engines the integration has sent ``/generate`` calls to so far (a sticky or least-loaded router may
        use only some of them)."""
        return sorted({c.engine for c in self.generates()})

    def generates(self) -> list[WireCall]:
        """The integration's ``/generate`` calls on the wire so far (live: open ones close as they are answered)."""
        return [c for c in self.backend.wire.snapshot() if c.path == "/generate" and c.origin == "integration"]

    async def until_resident(self, cycle: int) -> None:
        """Wait until every engine the integration uses holds one of its ``/generate`` calls sent less than half its
        decode time ago (its ``max_new_tokens`` at :func:`decode_rate`; at least :data:`TURN_S`), so it is still
        decoding when the cycle reaches that engine, whatever the cycle does first. After six turns without that
        moment (engines whose samples chain turns out of phase are never all that young at once), a call still
        decoding on each engine is enough: the cycle's first disturbing call on each engine is held at the wire until
        that engine holds a call sent less than half a turn ago (:meth:`holds_young`). Batches are consumed only while
        an engine the integration uses has none of its requests open (the producer stalls on a full buffer); while
        each has one, the next turns are waited for. When that does not happen within ``deadlines.wait_s`` the
        cycle runs all the same and I1-I2 answers unknown for it (an integration whose own requests never overlap
        an update is not shown to spare them)."""
        start, before = time.monotonic(), len(self.history.batches)
        deadline, stalled_since = start + self.deadlines.wait_s, start
        while True:
            now, calls = time.monotonic(), self.generates()
            used = sorted({c.engine for c in calls})
            young = 0.5 if now - start < 6 * self.turn_s() else 1.0  # half a turn young, or still decoding
            missing = [e for e in used if not any(c.engine == e and self._young(c, now, young) for c in calls)]
            if used and not missing:
                return
            if now > deadline:
                self.unmet(("I1-I2",), f"before update cycle {cycle}, engine(s) {missing or 'all'} held none of the "
                           f"integration's requests still decoding within {self.deadlines.wait_s:.0f}s "
                           f"({len(self.history.batches) - before} batch(es) consumed meanwhile): what its cycles do "
                           f"to its own requests in flight is not shown")
                return
            # every engine decoding: its next turn will be young
            stalled_since = await self._unstall(stalled_since, bool(used) and _open_everywhere(calls, used),
                                                max(1, len(used)))
            await asyncio.sleep(0.002)

    def holds_any(self, engine: int) -> bool:
        """Whether ``engine`` holds a request (the integration's or the suite's long-lived one) that has been open
        at its recorder for :data:`~conformance.sentinels.SETTLE_S` and has at least :data:`SPARE` of its decode time
        left (:meth:`_young`): what a held first pause, bump or transfer waits for once no young request of the
        integration came. A long-lived request near its budget's end is waited out: it is sent again as it ends, so
        the call never goes on in the instant a request there ends on its own (real vLLM 0.32.0 in CI: a sentinel
        ended with its budget in the millisecond its engine's held pause went on, and I1-I2 answered unknown)."""
        now = time.monotonic()
        return any(c.engine == engine and c.path == "/generate" and c.t_start <= now - SETTLE_S
                   and self._young(c, now, 1.0 - SPARE) for c in self.backend.wire.open_calls())

    def _young(self, call: WireCall, now: float, fraction: float = 0.5) -> bool:
        """Whether ``call`` is open and was sent less than ``fraction`` of its decode time ago (its ``max_new_tokens``
        at :func:`decode_rate`), counting only the time the engines decoded (``WireControl.decode_time``)."""
        params = call.payload.get("sampling_params") if isinstance(call.payload, dict) else None
        budget = params.get("max_new_tokens") if isinstance(params, dict) else None
        lasts = (budget if isinstance(budget, int) else self.rollout.max_new_tokens) / decode_rate(self.backend)
        return call.t_end is None and self.backend.control.decode_time(call.t_start, now) <= lasts * fraction

    def holds_young(self, engine: int, another_went: bool = False) -> bool:
        """Whether the cycle's first pause, bump or transfer may go on to ``engine`` (or it is not one the
        integration uses, so none of its requests will come): the engine holds one of the integration's requests
        sent less than half its decode time ago, while every other engine it uses holds one with at least
        :data:`SPARE` of its decode time left (a cycle that goes from engine to engine reaches them soon after; two
        engines whose samples chain turns out of phase always meet such a moment). Once another engine's call went on,
        any request still open is enough: a cycle that pauses engine after engine can leave every group waiting on
        the paused one, so no younger request comes."""
        now, calls = time.monotonic(), self.generates()
        used = {c.engine for c in calls}

        def holds(e: int, fraction: float) -> bool:
            return any(c.engine == e and self._young(c, now, fraction) for c in calls)
        if engine not in used:
            return True
        if another_went:
            return holds(engine, math.inf)
        return holds(engine, 0.5) and all(holds(e, 1.0 - SPARE) for e in used - {engine})

    async def _feed_held(self) -> None:
        """While the cycle's first disturbing calls are held and none went on yet, consume a batch whenever an engine
        the integration uses has had none of its requests open for :data:`STALL_S` (a producer blocked on a full
        buffer), as a trainer would, so the requests the hold waits for come."""
        control, stalled_since = self.backend.control, time.monotonic()
        while (state := control.holding()) is not None and not state[1]:
            calls = self.generates()
            busy = not state[0] or _open_everywhere(calls, {c.engine for c in calls})
            stalled_since = await self._unstall(stalled_since, busy, 1)
            await asyncio.sleep(STALL_S / 10)

    async def _unstall(self, since: float, busy: bool, n: int) -> float:
        """One poll of a wait that keeps the producer going: while ``busy`` the stall clock restarts; once it was not
        for :data:`STALL_S`, ``n`` batches are consumed (a producer blocked on a full buffer restarts one group per
        consumed batch). Returns when the current stall began."""
        if busy:
            return time.monotonic()
        if time.monotonic() - since > STALL_S:
            await self.drain(n)
            return time.monotonic()
        return since

    async def until_in_flight(self, per_engine: int = 1, min_age_s: float = 0.0) -> None:
        """Wait until every engine the integration uses has ``per_engine`` generates in flight (open for at least ``min_age_s``, i.e.
        decoding by then). While that does not happen, one batch per engine is consumed every ``STALL_S``, as a
        trainer would: a producer blocked on a full buffer restarts one group per consumed batch, so consuming one
        at a time (or only once it went idle) can leave the engines taking turns forever, never decoding at once."""
        wire, start, before = self.backend.wire, time.monotonic(), len(self.history.batches)
        deadline, stalled_since = start + self.deadlines.wait_s, start
        while not (engines := self.used_engines()) or not all(
                wire.in_flight(min_age_s=min_age_s).get(e, 0) >= per_engine for e in engines):
            if time.monotonic() > deadline:
                raise ScenarioTimeout(f"timed out after {self.deadlines.wait_s:.0f}s waiting for {per_engine} "
                                      f"/generate call(s) in flight on every engine (in flight: {wire.in_flight()}; "
                                      f"{len(self.history.batches) - before} batch(es) consumed meanwhile to unblock "
                                      f"the producer)")
            stalled_since = await self._unstall(stalled_since, False, max(1, len(engines)))
            await asyncio.sleep(0.002)

    async def until_next_call(self) -> None:
        """Wait until every engine the integration uses finished one more of its ``/generate`` calls and has a call
        in flight that was sent after it (the next turn of a multi-turn sample, for a producer that keeps its
        samples on one engine). Batches are consumed while an engine it uses has none of its calls open (a producer
        blocked on a full buffer: one engine slower than the other can let the other fill it first)."""
        since = time.monotonic()
        stalled_since = [since]

        async def unstall() -> None:
            calls = self.generates()
            used = {c.engine for c in calls}
            stalled_since[0] = await self._unstall(stalled_since[0], bool(used) and _open_everywhere(calls, used),
                                                   max(1, len(used)))

        def progressed() -> bool:
            calls = self.generates()
            engines = sorted({c.engine for c in calls})
            if not engines:
                return False
            for engine in engines:
                done = [c.t_end for c in calls if c.engine == engine and c.t_end is not None and c.t_end >= since]
                if not done or not any(c.engine == engine and c.t_end is None and c.t_start >= min(done)
                                       for c in calls):
                    return False
            return True
        await wait_for_condition(progressed, self.deadlines.wait_s, "a finished /generate call followed by the next "
                                 "one in flight on every engine", between=unstall)

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

    async def abort_in_flight(self, then_update: bool = False) -> int | None:
        """Abort the requests every engine holds, as an operator or a crash would (not the integration's doing).
        So that some are held, the suite freezes the engines first (``pause`` in place, its own call; on ≤0.5.4
        that pause already aborts everything), checks on the wire that each engine the integration uses held one of
        its requests sent before, aborts everything (SGLang answers frozen requests once they continue) and
        continues the engines; it retries while an engine held nothing. With ``then_update`` the engines are not
        continued by the suite: an update cycle runs while they are frozen, and its own continue releases the
        aborted answers, so whatever the integration resumes of them runs under the cycle's new weights (returns
        what the cycle returned)."""
        urls = self.backend.urls
        deadline = time.monotonic() + self.deadlines.wait_s
        while True:
            await self.until_in_flight(1)
            used = set(self.used_engines())
            mark = time.monotonic()
            injected = [Injected(mark, "abort", engine, "the suite froze the engine (pause in_place) and aborted "
                                 "every request it held (abort_all)") for engine in range(len(urls))]
            self.history.injected += injected
            await self.post_all("/pause_generation", {"mode": "in_place"})
            held = {c.engine for c in self.generates() if c.t_start < mark and (
                c.t_end is None or any(finish_type(o) == "abort" for o in c.generate_outputs()))}
            await self.post_all("/abort_request", {"abort_all": True})
            for item in injected:
                item.t_end = time.monotonic()
            if then_update and used <= held:
                return await self.update()
            await self.post_all("/continue_generation", {})
            if used <= held:
                return None
            if time.monotonic() > deadline:
                raise ScenarioTimeout(f"no request was held by every engine the integration uses ({sorted(used)}) to "
                                      f"abort within {self.deadlines.wait_s:.0f}s (engines holding one: "
                                      f"{sorted(held)})")
