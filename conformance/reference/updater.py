"""The trainer side of one trainer cell: the whole update cycle across every engine, then publish.

Cycle (P1): pause (retract | in_place) → flush unless in_place (C2) → begin session (full weights, 0.5.23) →
transfer → ``update_weight_version`` on every engine → end session → continue → publish. On any failure the
open sessions are ended and nothing is published (V2); every engine is continued before the error propagates (I6)
unless the cycle may have written its weights: SGLang loads parameter by parameter and restores nothing ("The full
weights of the ModelRunner are partially updated. Please discard the whole weights.",
``model_runner_components/weight_updater.py``, 0.5.23), so those engines stay paused, serving nothing, until a cycle
loads whole weights into them (P8; :meth:`after_failed_load`). LoRA updates are stamped with the same counter as
full updates (V1; the miles fully-async rollout review).

Override points: each step of the cycle is a public method with a working default (:meth:`pause_all`,
:meth:`flush_needed`, :meth:`begin_sessions`, :meth:`transfer`, :meth:`stamp`, :meth:`end_sessions`,
:meth:`resume_all`, :meth:`release_on_failure`, :meth:`after_failed_load`, :meth:`publish`). An adopter whose
cycle differs in one step subclasses :class:`ReferenceUpdater` and overrides that step
(``examples/override_one_step.py``); the cycle itself (:meth:`update`) stays the reference's. The engines are any
:class:`~conformance.reference.protocols.WeightSyncClient` (only the parts the cycle calls: see there).
"""

from __future__ import annotations

import asyncio
from typing import Any, Mapping, Sequence

from ..interface import LoraAdapter
from .releases import Release, release_of
from .concurrency import gather_all, settle_all
from .manager import ReferenceManager
from .protocols import WeightSyncClient
from .transports import LoraTransport, WeightTransport


class ReferenceUpdater:
    """The reference :class:`~conformance.interface.Updater`.

    ``start_version`` is the version the cell continues from: a failover cell starts at the published version
    (F1/V4), so its first update publishes ``published + 1``.
    """

    def __init__(self, engines: Sequence[WeightSyncClient], manager: ReferenceManager, *,
                 transports: Mapping[str, WeightTransport], lora: LoraTransport | None = None,
                 pause_mode: str = "retract", start_version: int = 0) -> None:
        if pause_mode not in ("retract", "in_place"):
            raise ValueError(f"pause mode {pause_mode!r}: a fully-async updater pauses with retract or in_place; "
                             f"abort would kill every in-flight request (I3)")
        self.engines = list(engines)
        self.manager = manager
        self.transports = dict(transports)
        self.lora = lora or LoraTransport()
        self.pause_mode = pause_mode
        self._version = start_version
        self._open_sessions: list[WeightSyncClient] = []
        self._paused: list[WeightSyncClient] = []
        self._loads_before: list[int | None] | None = None
        self.out_of_service: list[WeightSyncClient] = []
        """The engines a failed cycle may have left holding unpublished weights, kept paused until a cycle loads
        whole weights into them (:meth:`after_failed_load`)."""
        self._retiring: asyncio.Task[None] | None = None
        self._superseded: list[str] = []
        self._cycle_lock = asyncio.Lock()
        self.releases: list[Release] = []
        """Each engine's SGLang release, learnt at the first cycle (the steps adapt to it)."""

    @property
    def version(self) -> int:
        return self._version

    async def update(self, weights: Mapping[str, Any] | None = None, *, transport: str = "distributed",
                     lora: LoraAdapter | None = None) -> int:
        """One whole update cycle on every engine; the new version once every engine has it and it is published."""
        if (weights is None) == (lora is None):
            raise ValueError("update() takes either full weights or a LoRA adapter")
        mover = None if lora is not None else self.transport_for(transport)
        async with self._cycle_lock:
            await self._await_retirement()
            if not self.releases:
                self.releases = list(await gather_all(*(release_of(e) for e in self.engines)))
            new = self._version + 1
            if mover is not None:
                await mover.prepare(self.engines, weights, new)  # while the engines still generate
            async with self.manager.updating():
                try:
                    await self.pause_all()
                    if self.flush_needed():
                        await gather_all(*(e.flush_cache() for e in self.engines))
                    if mover is not None and mover.needs_session:
                        await self.begin_sessions()
                    adapter = await self.transfer(new, mover, weights, lora)
                    await self.stamp(new)
                    await self.end_sessions()
                except BaseException as exc:
                    await self.release_on_failure(exc)
                    raise
                finally:
                    self._loads_before = None
                if mover is not None:  # whole weights everywhere: every engine serves a published version again
                    self.out_of_service = []
                await self.resume_all()
                self.publish(new, adapter)
                if mover is not None:  # an engine that died and came back serves the published version now (P9)
                    self.manager.engines_synced()
            return new

    def transport_for(self, name: str) -> WeightTransport:
        if name not in self.transports:
            raise ValueError(f"transport {name!r} is not configured (have {sorted(self.transports)})")
        return self.transports[name]

    # -- the steps of a cycle (override points) ------------------------------------------------------------

    async def pause_all(self) -> None:
        """Pause every engine in the cycle's mode. Not on a release whose every pause aborts (≤0.5.4): there the
        update itself waits for the requests in flight (SGLang's update lock), which the cycle then relies on."""
        if all(r.pause_modes for r in self.releases):
            await gather_all(*(e.pause(self.pause_mode) for e in self.engines))
            self._paused = list(self.engines)

    def flush_needed(self) -> bool:
        """C2: retract flushes (the radix cache holds old-weight KV); in_place never does (its resident requests
        make SGLang refuse, and their KV must survive); nor does an engine that was not paused, or one whose release
        cannot flush while paused in retract mode (0.5.10–0.5.22: its idle check counts the retracted requests,
        so the flush fails until the engine continues; the reference then keeps the prefix cache)."""
        return (self.pause_mode != "in_place" and bool(self._paused)
                and all(r.flush_while_retracted for r in self.releases))

    async def begin_sessions(self) -> None:
        async def begin(engine: WeightSyncClient) -> None:
            if await engine.begin_weight_update():
                self._open_sessions.append(engine)

        await gather_all(*(begin(e) for e in self.engines))

    async def transfer(self, new: int, mover: WeightTransport | None, weights: Mapping[str, Any] | None,
                        lora: LoraAdapter | None) -> str | None:
        """Move the weights; the versioned adapter name for a LoRA update."""
        if lora is not None:
            return await self.lora.load(self.engines, lora, new)
        assert mover is not None and weights is not None
        # a failure from here on may leave the engines sent weights holding part of them
        self._loads_before = [_loads_sent(e) for e in self.engines]
        await mover.transfer(self.engines, weights, new)
        return None

    async def stamp(self, new: int) -> None:
        """Relabel every engine, only after the transfer succeeded everywhere (V2)."""
        await gather_all(*(e.update_weight_version(str(new)) for e in self.engines))

    async def end_sessions(self) -> None:
        sessions, self._open_sessions = self._open_sessions, []
        await gather_all(*(e.end_weight_update() for e in sessions))

    async def resume_all(self) -> None:
        """Continue every engine this cycle paused, except those out of service (:meth:`after_failed_load`)."""
        paused, self._paused = self._paused, []
        errors = await settle_all(e.resume() for e in paused if e not in self.out_of_service)
        if errors:
            raise errors[0]

    async def release_on_failure(self, exc: BaseException) -> None:
        """I6: close every open session, then continue every engine whose weights the cycle left whole (all of them
        when it failed before its transfer; :meth:`after_failed_load` decides for the others); cleanup errors become
        notes on ``exc``."""
        sessions, self._open_sessions = self._open_sessions, []
        errors = await settle_all(e.end_weight_update() for e in sessions)
        if self._loads_before is not None:
            sent = [e for e, n in zip(self.engines, self._loads_before) if n is None or _loads_sent(e) != n]
            if sent:
                await self.after_failed_load(exc, sent)
        paused, self._paused = self._paused or list(self.engines), []  # a pause that failed halfway: all of them
        errors += await settle_all(e.resume() for e in paused if e not in self.out_of_service)
        for error in errors:
            exc.add_note(f"cleanup after the failed update also failed: {error}")

    async def after_failed_load(self, exc: BaseException, sent: list[WeightSyncClient]) -> None:
        """What to do with the engines a failed cycle sent weights to (``sent``: they may hold part of them, or all
        of a version that is not published; P8): by default they stay paused, out of service, until a cycle loads
        whole weights into them, and ``exc`` says so. An integration that can put published weights back (reload its
        last published checkpoint) overrides this and restores them: they are then continued."""
        self.out_of_service = list(dict.fromkeys([*self.out_of_service, *sent]))
        exc.add_note(f"{len(sent)} engine(s) ({', '.join(getattr(e, 'url', '?') for e in sent)}) may hold part of the "
                     f"failed cycle's weights: they stay paused until an update loads whole weights into them")

    def publish(self, new: int, adapter: str | None) -> None:
        """The cell's counter and the manager's version move together, after everything succeeded (V2)."""
        self._version = new
        self.manager.set_weight_version(new)
        if adapter is not None:
            previous = self.manager.switch_adapter(adapter)
            if previous is not None:
                self._superseded.append(previous)
        if self._superseded and not self.out_of_service:  # a paused engine's requests would keep the unload waiting
            superseded, self._superseded = self._superseded, []
            self._retiring = asyncio.create_task(self._retire(superseded))

    # -- LoRA adapter retirement ---------------------------------------------------------------------------

    async def _retire(self, names: list[str]) -> None:
        """Unload superseded adapters once no request of ours uses them (SGLang also waits for its users: not while
        an engine is out of service, paused with requests resident)."""
        for name in names:
            await self.manager.adapter_users.idle(name)
            await self.lora.unload(self.engines, name)

    async def _await_retirement(self) -> None:
        retiring, self._retiring = self._retiring, None
        if retiring is not None:
            await retiring

    async def close(self) -> None:
        """Finish retiring the previous adapter and release the transports' groups and files."""
        try:
            await self._await_retirement()
        finally:
            for transport in self.transports.values():
                await transport.close(self.engines)


def _loads_sent(engine: WeightSyncClient) -> int | None:
    """The full-weight loads ``engine``'s client sent so far, or None where it does not count them."""
    return getattr(engine, "weight_loads_sent", None)
