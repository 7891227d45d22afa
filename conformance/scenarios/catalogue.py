"""The scenario catalogue: each scenario's script, and the catalogue itself as data (:data:`SCENARIOS`)."""

from __future__ import annotations

from dataclasses import replace
from typing import Awaitable, Callable

from ..situations import drain, gate, prefix
from ..situations.aborted import abort_in_flight
from ..situations.producer import until_in_flight, until_next_call, until_producer_blocked
from ..situations.restarted import restart
from ..situations.versions import from_cell, mixed_group, resumed_across_an_update
from .capabilities import Needs
from .definition import DEFAULT_ROLLOUT, Scenario
from .run import Run


async def _steady(run: Run) -> None:
    await run.start()
    for _ in range(2):
        await run.drain(1)
        await run.update(resident=True)
    await run.drain(1)


async def _first_drain(run: Run) -> None:
    await run.start()
    await run.drain(2)
    await run.update(resident=True)
    await run.drain(2)


async def _mixed_versions(run: Run) -> None:
    """Update while multi-turn samples decode, until a consumed group was generated under two versions (when none ever
    is, S2 answers unknown with the reason and the other checks judge the run). Each update
    waits until every engine finished a call and has the next one in flight, so it lands on a later turn of a
    sample (releases without per-token spans label a whole call with the version current when it ends)."""
    rollout = run.rollout
    await run.start()
    for _ in range(8):
        await until_next_call(run)
        await run.update(resident=True)
        for _ in range((rollout.max_in_flight_groups + rollout.buffer_capacity) // rollout.batch_size + 1):
            await run.drain(1)
            if run.shows(mixed_group):
                return
    run.unmet(("S2",), "no group generated under more than one version was consumed in 8 updates (every group "
              "that spanned an update was dropped or recycled before training?): S2 is not shown on mixed groups")


async def _prefix_reuse(run: Run) -> None:
    """Two batches (every engine caches the prompts' shared preamble), an update, then batches until a prompt was
    served from the cache after the load (:mod:`~conformance.situations.prefix`); C3 then judges what computed it."""
    await run.start()
    await run.drain(2)
    await run.update(resident=True)
    for _ in range(4):
        await run.drain(1)
        if run.shows(prefix.SITUATION.shown):
            return
    run.unmet(("C3",), "no prompt was served from the prefix cache after the load in 4 batches (the engines' answers "
              "never said cached_tokens > 0): C3 is not shown")


async def _failover(run: Run) -> None:
    """Two updates, a fresh trainer cell, two more; then batches are consumed until a group sent under the new
    cell's versions was (what the integration recorded for them is what S2 judges under failover)."""
    await run.start()
    await run.drain(1)
    for _ in range(2):
        await run.update(resident=True)
    await run.drain(1)
    await run.failover()
    for _ in range(2):
        await run.update(resident=True)
        await run.drain(1)
    for _ in range(6):
        if run.shows(lambda h: from_cell(h, run.cell)):
            return
        await run.drain(1)
    run.unmet(("S2",), "no group generated after the failover cell's first update was consumed in 6 more batches: "
              "what the integration records for calls under the new cell's versions is not shown")


async def _failing_transfer(run: Run) -> None:
    """Distributed: weights every engine rejects (the last parameter has the wrong shape: SGLang answers 400).
    Tensor and disk: SGLang answers a load that raises by killing the server (``SGLANG.load_failure_kills``), so
    every engine's transfer is refused at the wire with the 400 SGLang's handler gives a load that reports failure
    (``conformance.situations.refused``)."""
    await run.start()
    await run.drain(1)
    if run.transport in ("tensor", "disk"):
        await run.update(refuse=range(len(run.backend.urls)), resident=True)
    else:
        await run.update(poison=True, resident=True)
    await run.update()
    await run.drain(1)


async def _one_engine_rejects(run: Run) -> None:
    await run.start()
    await run.drain(1)
    await run.update(refuse=[len(run.backend.urls) - 1], resident=True)
    await run.update()
    await run.drain(1)


def _slow_engine(lora: bool) -> Callable[[Run], Awaitable[None]]:
    """Three updates; in each the last engine is slow at one step (its pause, its transfer or adapter load, its
    continue), so what the integration does once the other engines are done happens while that one is not."""
    async def script(run: Run) -> None:
        await run.start()
        await run.drain(1)
        for step in ("pause", "transfer", "continue"):
            await run.update(lora=lora, resident=True, slow=step)
            await run.drain(1)
    return script


async def _long_drain(run: Run) -> None:
    """One update whose first pause, bump or transfer meets one of the integration's requests that goes on decoding
    for seconds (:mod:`conformance.situations.drain`): a pause that waits for the requests in flight drains that
    long, and one that gives up and aborts them is seen."""
    await run.start()
    await run.drain(1)
    await run.update(resident=True, stall=True)
    await run.drain(1)
    if not run.shows(drain.SITUATION.shown):
        run.unmet(("I1-I2",), f"no request of the integration's resident at the cycle's first pause, bump or transfer "
                  f"went on decoding {drain.DRAIN_S:g}s after it: what a drain that gives up early does is not shown")


async def _lora(run: Run) -> None:
    await run.start()
    await run.drain(1)
    for _ in range(2):
        await run.update(lora=True, resident=True)
        await run.drain(1)


async def _lora_refused(run: Run, refuse: list[int]) -> None:
    await run.start()
    await run.drain(1)
    await run.update(lora=True, refuse=refuse, resident=True)
    await run.update(lora=True)
    await run.drain(1)


async def _lora_refused_everywhere(run: Run) -> None:
    await _lora_refused(run, list(range(len(run.backend.urls))))


async def _lora_refused_by_one(run: Run) -> None:
    await _lora_refused(run, [len(run.backend.urls) - 1])


async def _partial_rollout(run: Run) -> None:
    """The engines hold requests under the current version when the suite freezes them and aborts everything they
    hold; an update cycle runs while they are frozen, so the integration resumes the aborted calls under the next
    version. Groups are drained (staleness bound 1) until one as old as such an aborted part is consumed (up to
    three rounds)."""
    await run.start()
    await run.update(resident=True)
    for _ in range(3):
        await abort_in_flight(run, then=run.update)
        for _ in range(run.rollout.buffer_capacity // run.rollout.batch_size + 2):
            await run.drain(1)
            if run.shows(resumed_across_an_update):
                return
    run.unmet(("S2", "S3"), "no consumed group was as old as the aborted part of a turn resumed under a newer "
              "version in three rounds")


async def _staleness(run: Run) -> None:
    """Groups at exactly the bound (1), then at bound + 1, reach consumption by construction."""
    rollout = run.rollout
    await run.start()
    await run.update()  # version 1
    await run.drain(rollout.buffer_capacity // rollout.batch_size + 1)  # what was buffered before version 1
    await until_producer_blocked(run)  # the buffer is full of groups generated under version 1
    await run.update()  # version 2: the buffered groups are exactly at the bound
    await run.drain(1)  # ... and must be admitted
    await until_producer_blocked(run)  # the room it made went to version-1 groups that were waiting to be put
    await run.update()  # version 3: the buffer holds version-1 groups at bound + 1, which must be rejected
    await run.drain(3)


async def _aborted_groups(run: Run) -> None:
    """An update, then every engine aborts what it holds; batches are drained until every group buffered or in flight
    at the abort can have been consumed (were the aborted ones kept, they would be among them)."""
    rollout = run.rollout
    await run.start()
    await run.update()
    await abort_in_flight(run)
    await run.drain((rollout.max_in_flight_groups + rollout.buffer_capacity) // rollout.batch_size + 2)


async def _engine_restarted(run: Run) -> None:
    """An update, then the last engine dies and comes back from its start-up weights; two batches are drained while
    it is out of sync (the integration may send it nothing, or everything), then an update syncs it and a batch is
    drained."""
    await run.start()
    await run.update()
    await restart(run, len(run.backend.urls) - 1)
    await run.drain(2)
    await run.update()
    await run.drain(1)


async def _answers_while_paused(run: Run) -> None:
    """Each update hands the integration answers while every engine is paused (held back at the wire since just
    before the cycle), so what it sends next meets SGLang's pause gate and runs entirely under the cycle's weights
    (or waits on the integration's own gate); batches are drained until all of it was consumed."""
    rollout = run.rollout
    await run.start()
    for _ in range(2):
        await until_in_flight(run, 1)
        await run.update(gate=True)
        await run.drain(1)
    for _ in range((rollout.max_in_flight_groups + rollout.buffer_capacity) // rollout.batch_size + 2):
        if run.shows(gate.consumed):
            return
        await run.drain(1)
    run.unmet(("S2",), "the groups the integration started while its engines were paused were not all consumed")


_SLOW = ("resident", "consumed-before-update", "window")
_REFUSED = ("resident", "consumed-before-update", "failed-cycle")
_REJECTED = {
    "disk": "a disk update the engines reject (every load refused at the wire with SGLang's 400 and its rollback "
            "message, as a disk load that raises kills the server: SGLANG.load_failure_kills), then a good one",
    "tensor": "a tensor update the engines reject (every transfer refused at the wire with SGLang's 400, as a tensor "
              "load that raises kills the server: SGLANG.load_failure_kills), then a good one",
    "distributed": "a distributed update the engines reject (the last parameter has the wrong shape: SGLang "
                   "answers 400), then a good one",
}

SCENARIOS: dict[str, Scenario] = {s.name: s for s in [
    *(Scenario(f"steady-{transport}-{mode}", f"multi-turn rollouts, two {transport} updates under pause {mode}",
               _steady, ("resident", "consumed-before-update"), transport=(transport,), pause_mode=mode)
      for transport in ("disk", "tensor", "distributed") for mode in ("retract", "in_place")),
    Scenario("first-drain", "batches drained before the first update, staleness bound on",
             _first_drain, ("resident", "consumed-before-update"), rollout=replace(DEFAULT_ROLLOUT, max_staleness=1),
             needs=Needs(staleness_filter=True)),
    Scenario("mixed-versions", "three-turn samples generating while updates land, until one spanning two versions "
             "is consumed",
             _mixed_versions, ("resident",), pause_mode="in_place", needs=Needs(multi_turn=True),
             rollout=replace(DEFAULT_ROLLOUT, batch_size=1, group_size=1, turns=3, max_new_tokens=64,
                             max_in_flight_groups=2, buffer_capacity=2), long=True),
    Scenario("failover", "two updates, failover to a fresh trainer cell, two more",
             _failover, ("resident", "consumed-before-update"), needs=Needs(failover=True)),
    *(Scenario(f"failing-transfer-{t}", _REJECTED[t], _failing_transfer, _REFUSED, transport=(t,))
      for t in ("disk", "tensor", "distributed")),
    Scenario("one-engine-rejects", "the last engine answers every transfer call with SGLang's failure (400, success: "
             "false; injected at the wire) while the others load the weights, then a good update",
             _one_engine_rejects, _REFUSED, transport=("disk",)),
    *(Scenario(f"slow-engine-{t}", f"three {t} updates, the last engine slow at one step of each (the answer to its "
               f"pause, its {'load' if t == 'disk' else 'transfer'}, its continue held until the others answered "
               f"theirs)", _slow_engine(False), _SLOW, transport=(t,))
      for t in ("disk", "tensor")),
    Scenario("slow-engine-lora", "three LoRA updates, the last engine slow at one step of each (the answer to its "
             "pause, its adapter load, its continue held until the others answered theirs)", _slow_engine(True),
             _SLOW, needs=Needs(lora=True), full_updates=False),
    Scenario("long-drain", "one disk update whose first pause meets requests of the integration's that go on "
             "decoding for seconds (the engines stalled; on real engines, turns that long), so a pause that waits for "
             "them drains that long", _long_drain, ("resident", "consumed-before-update", "long-drain"),
             transport=("disk",), turn_s=drain.turn_s),
    Scenario("lora", "two LoRA updates while rollouts run",
             _lora, ("resident", "consumed-before-update"), needs=Needs(lora=True), full_updates=False),
    Scenario("lora-refused", "a LoRA update every engine refuses to load (SGLang's 400, injected at the wire), then a "
             "good one", _lora_refused_everywhere, _REFUSED, needs=Needs(lora=True),
             full_updates=False),
    Scenario("lora-refused-by-one", "a LoRA update the last engine refuses to load while the others load it, then a "
             "good one", _lora_refused_by_one, _REFUSED, needs=Needs(lora=True),
             full_updates=False),
    Scenario("partial-rollout", "requests aborted under version 1 (by the suite, engines frozen) are resumed by the "
             "integration under version 2; groups made of them are consumed with the staleness bound at 1",
             _partial_rollout, ("resident", "aborted", "at-bound"), rollout=replace(DEFAULT_ROLLOUT, max_staleness=1),
             needs=Needs(partial_rollout=True, staleness_filter=True)),
    Scenario("staleness", "groups buffered while three updates land; bound 1 at consumption",
             _staleness, ("at-bound",), rollout=replace(DEFAULT_ROLLOUT, max_staleness=1, buffer_capacity=8),
             needs=Needs(staleness_filter=True), long=True),
    Scenario("answers-while-paused", "single-turn groups whose answers reach the integration while every engine is "
             "paused by its cycle, so it starts groups that SGLang's pause gate holds until the new weights are in",
             _answers_while_paused, (),
             rollout=replace(DEFAULT_ROLLOUT, batch_size=1, group_size=1, turns=1, max_in_flight_groups=2,
                             buffer_capacity=8), needs_pause=True),
    Scenario("engine-restarted", "the last engine dies mid-rollout and comes back from its start-up weights "
             "(injected), then an update", _engine_restarted, ("restarted",), transport=("tensor", "disk"),
             needs=Needs(engine_recovery=True)),
    Scenario("aborted-groups", "every engine aborts its requests mid-rollout (injected)", _aborted_groups,
             ("aborted",)),
    Scenario("prefix-reuse", "prompts that share a preamble of full cache blocks, an update between batches: what "
             "the prefix cache serves after the load", _prefix_reuse, ("prefix-after-load",),
             prompt_template=prefix.TEMPLATE),
]}
"""Scenario name → scenario."""
