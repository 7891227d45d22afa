"""The run a scenario script drives: its roles, its trainer, update cycles (with the situations the suite builds
around them: :mod:`conformance.situations`), drains and failover. Backend-agnostic: only the roles, the backend's
URLs and probes a real SGLang answers."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Callable, Sequence

from ..backends import Backend, probe_labels, trainer_digests
from ..breaks import Hang, RunBroken, ScenarioTimeout, UnexpectedUpdateFailure, bounded
from ..history import BatchRecord, History, Unmet, UpdateCycle
from ..interface import RolloutConfig, Roles, Updater
from ..situations.drain import stall as stall_drain
from ..situations.gate import hold as hold_answers, record as record_gate
from ..situations.producer import feed_held
from ..situations.refused import check_used, refuse as refuse_transfer
from ..situations.resident import hold as hold_disturbing, keep_resident, record_expired, until_resident
from ..situations.slow import hold as hold_slow, record as record_window
from ..situations.sentinels import Sentinels, adapters_in_use
from ..situations.timing import DEADLINES, DRAIN_S, Deadlines
from .trainer import Trainer


@dataclass
class Run:
    """What a scenario script drives: the roles, the trainer, and recording helpers (a
    :class:`~conformance.situations.scene.Scene` for the situations' builders)."""

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

    def now(self) -> float:
        """The wire's clock (every stamp of the history is read off it)."""
        return self.backend.wire.clock()

    async def start(self) -> None:
        """Start the manager; record the version it publishes for the initial weights (None, or e.g. 0)."""
        await bounded(self.roles.manager.start(), self.deadlines.wait_s, "Manager.start()", self.backend.wire)
        if not self.history.cycles:
            self.history.initial_version = self.roles.manager.weight_version

    async def update(self, transport: str | None = None, *, lora: bool = False, poison: bool = False,
                     refuse: Sequence[int] = (), resident: bool = False, gate: bool = False,
                     slow: str | None = None, stall: bool = False) -> int | None:
        """One update cycle, recorded with the labels, versions and digests around it.

        Every engine holds a request from the cycle's pause to its continue: the suite's own long-lived request
        (:mod:`conformance.situations.sentinels`), and the cycle's first pause, bump or transfer on each engine waits
        at the wire until a request is resident there (:func:`conformance.situations.resident.hold`). With
        ``resident`` the cycle also starts only once every engine the integration sends requests to is decoding one
        of them, and its first disturbing call on each engine is held until one of them is young there
        (:func:`~conformance.situations.resident.until_resident`; batches are consumed meanwhile when the producer
        stalls). The cycle is expected to fail with ``poison`` (weights every engine rejects: the last parameter has
        the wrong shape, so an integration that sends buckets sees its early buckets land first) or ``refuse``
        (those engines answer every transfer call of the cycle as a failed load:
        :mod:`conformance.situations.refused`). With ``gate`` the integration gets answers while its engines are
        paused (:mod:`conformance.situations.gate`); with ``slow`` (``pause``, ``transfer`` or ``continue``) the last
        engine is slow at that step (:mod:`conformance.situations.slow`); with ``stall`` the engines stop decoding for a
        while as the cycle's first disturbing call goes on (:mod:`conformance.situations.drain`). A cycle that fails unexpectedly, or does not
        return within ``deadlines.update_s`` (a hang, even when a failure was expected), breaks the run."""
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
            await until_resident(self, index)
        # the answers are held first (which waits for one): the long-lived requests then start as the cycle does
        answers, unfollow = await hold_answers(self) if gate else (None, lambda: None)
        sentinels = Sentinels(urls, wire, self.backend.sentinel_tokens, f"c{index}", adapters_in_use(wire, len(urls)),
                              self.history, dialect=self.backend.dialect)
        try:
            await sentinels.start()
        except TimeoutError as exc:
            control.release_holds()
            unfollow()
            raise ScenarioTimeout(str(exc)) from None
        refused = [refuse_transfer(self, engine, transport, lora) for engine in refuse]
        if not gate:
            hold_disturbing(self, resident, DRAIN_S if stall else 0.0)
        window, unfollow_window = hold_slow(self, slow, transport, lora) if slow else (None, lambda: None)
        unstall = stall_drain(self) if stall else (lambda: None)
        feeder = asyncio.create_task(feed_held(self)) if resident else None
        unkeep = keep_resident(self) if resident else (lambda: None)
        t0 = self.now()
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
            t1 = self.now()
            expired = control.release_holds()
            unfollow()
            unfollow_window()
            unstall()
            unkeep()
            fed: list[BaseException | None] = [None]
            if feeder is not None and error is not None and not feeder.done():
                self._feeding = feeder  # do not wait here for engines a failed load may keep out of service
            elif feeder is not None:
                fed = await asyncio.gather(feeder, return_exceptions=True)
            await sentinels.release()
        record_expired(self, expired, index, "the continue was held until the integration sent a request while "
                       "paused" if gate else "the first pause, bump or transfer was held until " + (
                           "one of the integration's requests was decoding there" if resident else
                           "a request was resident there"))
        check_used(self, refused, error is not None)
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
        if answers is not None:
            record_gate(self, answers, index)
        if window is not None and slow:
            record_window(self, window, slow, index)
        if hang is not None:
            raise hang
        if gone is not None:
            raise gone
        if control.left_paused is not None:
            raise RunBroken(f"update cycle {index}: {control.left_paused}: an engine may be left paused by the suite, "
                            f"so nothing after it is the integration's doing")
        if isinstance(fed[0], BaseException):  # consuming a batch while the cycle's calls were held failed
            raise fed[0]
        if error is None:
            await self._fed()
        if error is not None and not expect_failure:
            raise UnexpectedUpdateFailure(f"update cycle {index} ({transport}{', LoRA' if lora else ''}) failed: "
                                          f"{error}")
        return returned

    async def _fed(self) -> None:
        """Wait for the batch a failed cycle's feeder was still taking (bounded by its own drain deadline); the feeder
        itself draining waits for nothing (it awaited itself when the cycle failed before its drain began)."""
        feeding = self._feeding
        if feeding is None or feeding is asyncio.current_task():
            return
        self._feeding = None
        await feeding

    async def drain(self, n: int = 1) -> None:
        """Consume ``n`` batches, recording the truth at consumption."""
        await self._fed()
        for _ in range(n):
            batch = await bounded(self.roles.manager.next_batch(), self.deadlines.drain_s, "Manager.next_batch()",
                                  self.backend.wire)
            now = self.now()
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
        self.history.unmet.append(Unmet(checks, reason, self.now()))

    async def labels(self) -> list[str | None]:
        """Each engine's version label, probed in the engines' dialect."""
        return await probe_labels(self.backend.urls, dialect=self.backend.dialect)
