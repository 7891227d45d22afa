"""The reference rollout manager: a fully-async producer over the engines and a consumer with its filters.

Producer: keeps at most ``max_in_flight_groups`` groups generating (round-robin over engines, one engine per
sample); a finished group waits for room in a bounded buffer (``buffer_capacity``), so a full buffer stops
submission (S4). A group with any aborted turn is recycled as its pristine prompt (I4/I5). A failing group
kills the producer and the next :meth:`next_batch` raises the original exception (S5).

Consumer (:meth:`next_batch`): pops groups FIFO and measures each against the published version *at
consumption* (S3): oldest = min numeric label over every sample, turn and span (S2/V5) — or, for an integration
that keeps its versions on the client side (``stamps_engines=False``), min ``policy_version`` (the version published
when each turn was sent) — staleness = current − oldest, or None before the first update (V3). Negative staleness
raises (S1); over the bound → recycled.

Override points: the version handling (:meth:`set_weight_version`, :meth:`on_version_regression`,
:meth:`current_version`, :meth:`label_value`), the accounting (:meth:`turn_versions`, :meth:`oldest_version`,
:meth:`staleness`, :meth:`too_stale`, :meth:`rejected_at_consumption`), the data path (:meth:`enqueue`, :meth:`handle_aborted`,
:meth:`recycle`) and the wire (:meth:`request_payload`, :meth:`turn_record`) are public methods with working
defaults; override the one that differs.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import itertools
import uuid
from dataclasses import dataclass
from typing import Any, AsyncIterator, Iterator, Sequence

from ..interface import Batch, BuildEnv, Group, Prompt, Sample, Turn
from .client import EngineError
from .concurrency import gather_or_cancel
from .protocols import GenerateClient


class VersionRegression(RuntimeError):
    """A published version lower than the current one (V4): a failover cell that did not continue it."""


class NegativeStaleness(RuntimeError):
    """A group newer than the published version (S1): the version went backwards somewhere."""


class ProtocolError(RuntimeError):
    """An engine answer the manager cannot read."""


def numeric_label(label: Any) -> int | None:
    """An engine version label as an int; None for ``"default"`` and other non-numeric labels (V5)."""
    return int(label) if isinstance(label, str) and label.isdigit() else None


@dataclass
class FinishedGroup:
    """A group as the producer finished it, before the consumer's filters."""

    prompt: Prompt
    samples: list[Sample]


class AdapterUsers:
    """``/generate`` calls in flight per LoRA adapter name, so an old adapter is unloaded only once unused."""

    def __init__(self) -> None:
        self._count: collections.Counter[str] = collections.Counter()
        self._waiters: dict[str, list[asyncio.Future[None]]] = collections.defaultdict(list)

    @contextlib.contextmanager
    def using(self, name: str | None) -> Iterator[None]:
        if name is None:
            yield
            return
        self._count[name] += 1
        try:
            yield
        finally:
            self._count[name] -= 1
            if self._count[name] == 0:
                del self._count[name]
                for waiter in self._waiters.pop(name, []):
                    if not waiter.done():
                        waiter.set_result(None)

    async def idle(self, name: str) -> None:
        """Returns once no request uses ``name``."""
        if self._count[name] == 0:
            return
        waiter = asyncio.get_running_loop().create_future()
        self._waiters[name].append(waiter)
        await waiter


class ReferenceManager:
    """The reference :class:`~conformance.interface.Manager`.

    ``stamps_engines`` is the integration's ``Capabilities.stamps_engines``: True reads each turn's version from the
    engine's label (``meta_info.weight_version`` and its spans), False from the turn's ``policy_version``.
    ``engines`` need only ``url`` and ``generate`` (:class:`~conformance.reference.protocols.GenerateClient`)."""

    def __init__(self, engines: Sequence[GenerateClient], env: BuildEnv, *, stamps_engines: bool = True) -> None:
        if not engines:
            raise ValueError("ReferenceManager needs at least one engine")
        self.engines = list(engines)
        self.stamps_engines = stamps_engines
        self.config = env.rollout
        self._prompts = env.prompts
        self._version: int | None = None
        self._adapter: str | None = None
        self.adapter_users = AdapterUsers()
        self._buffer: asyncio.Queue[FinishedGroup] | None = None
        self._producer: asyncio.Task[None] | None = None
        self._recycled: collections.deque[Prompt] = collections.deque()
        self._next_engine = itertools.count()
        self._counters: collections.Counter[str] = collections.Counter()
        self.lost: list[GenerateClient] = []
        """Engines that died under a request: out of the rotation until an update loads whole weights into them
        (:meth:`engines_synced`). A restarted engine serves its start-up weights under ``default`` (P9)."""
        self._any_live = asyncio.Event()
        self._any_live.set()
        self._dispatch = asyncio.Event()
        self._dispatch.set()

    # -- versions and adapters --------------------------------------------------------------------------

    @property
    def weight_version(self) -> int | None:
        return self._version

    def set_weight_version(self, version: int) -> None:
        """Store a published version; a lower one goes through :meth:`on_version_regression` first (V4)."""
        if self._version is not None and version < self._version:
            version = self.on_version_regression(self._version, version)
        self._version = version

    def on_version_regression(self, current: int, published: int) -> int:
        """Override point: what to store when a lower version is published. The reference raises
        :class:`VersionRegression` (never stored); a manager may instead re-base (return ``current``)."""
        raise VersionRegression(f"published version went backwards: {current} -> {published} (a failover cell "
                                f"must continue the published version)")

    def current_version(self) -> int | None:
        """The version staleness is measured against: the published one, None before the first update."""
        return self._version

    def label_value(self, label: Any) -> int | None:
        return numeric_label(label)

    @contextlib.asynccontextmanager
    async def updating(self) -> AsyncIterator[None]:
        """Held by the updater from its first pause to its publish. With client-side versions no new call goes out
        meanwhile: SGLang parks a call sent to a paused engine at its pause gate and runs it entirely under the
        weights the cycle installs, a version not published yet, so the call waits and goes out under it. With
        engine stamps the engine's labels say which weights produced each token: calls go out as usual."""
        if self.stamps_engines:
            yield
            return
        self._dispatch.clear()
        try:
            yield
        finally:
            self._dispatch.set()

    @property
    def lora_adapter(self) -> str | None:
        """The adapter name new ``/generate`` calls use (None: base model)."""
        return self._adapter

    def switch_adapter(self, name: str | None) -> str | None:
        """New requests use ``name`` from now on; the previous name (for the updater to unload)."""
        previous, self._adapter = self._adapter, name
        return previous if previous != name else None

    @property
    def buffered_groups(self) -> int:
        """Finished groups waiting for consumption."""
        return self._buffer.qsize() if self._buffer is not None else 0

    # -- producer --------------------------------------------------------------------------------------

    async def start(self) -> None:
        if self._producer is None:
            self._buffer = asyncio.Queue(maxsize=self.config.buffer_capacity)
            self._producer = asyncio.create_task(self._produce(), name="reference-rollout-producer")

    def _next_prompt(self) -> Prompt:
        return self._recycled.popleft() if self._recycled else self._prompts()

    def recycle(self, prompt: Prompt) -> None:
        """Resubmit the prompt from scratch: the pristine prompt the data source handed out (I4/I5)."""
        self._recycled.append(prompt)

    async def _produce(self) -> None:
        active: set[asyncio.Task[None]] = set()
        try:
            while True:
                while len(active) < self.config.max_in_flight_groups:
                    active.add(asyncio.create_task(self._run_group(self._next_prompt())))
                done, active = await asyncio.wait(active, return_when=asyncio.FIRST_COMPLETED)
                for task in done:
                    task.result()  # a failed group kills the producer with its own exception (S5)
        finally:
            for task in active:
                task.cancel()
            await asyncio.gather(*active, return_exceptions=True)

    async def _run_group(self, prompt: Prompt) -> None:
        samples = await gather_or_cancel(*(self._run_sample(prompt, i) for i in range(self.config.group_size)))
        if any(s.aborted for s in samples):
            await self.handle_aborted(prompt, samples)
        else:
            await self.enqueue(FinishedGroup(prompt, samples))

    async def handle_aborted(self, prompt: Prompt, samples: list[Sample]) -> None:
        """A group with an aborted turn never reaches training: its prompt is resubmitted pristine (I4)."""
        self._counters["aborted_groups_recycled"] += 1
        self.recycle(prompt)

    async def enqueue(self, group: FinishedGroup) -> None:
        assert self._buffer is not None
        await self._buffer.put(group)  # blocks while the buffer is full (S4)

    async def next_engine(self) -> GenerateClient:
        """The engine a new sample goes to: round robin over those not :attr:`lost` (waits while all are)."""
        while True:
            live = [e for e in self.engines if e not in self.lost]
            if live:
                return live[next(self._next_engine) % len(live)]
            self._any_live.clear()
            await self._any_live.wait()

    @staticmethod
    def died(error: EngineError) -> bool:
        """Whether ``error`` says the engine died under the call: unreachable, or a server error."""
        return error.status is None or error.status >= 500

    def engine_lost(self, engine: GenerateClient, error: EngineError) -> bool:
        """Whether ``engine`` :meth:`died` under the call; if so it leaves the rotation until an update syncs it
        (:meth:`engines_synced`)."""
        if not self.died(error):
            return False
        if engine not in self.lost:
            self.lost.append(engine)
            self._counters["engines_lost"] += 1
        return True

    def engines_synced(self) -> None:
        """An update loaded whole weights into every engine: the lost ones serve the published version again."""
        self.lost.clear()
        self._any_live.set()

    async def _run_sample(self, prompt: Prompt, i: int) -> Sample:
        engine = await self.next_engine()
        sample = Sample(index=prompt.index * self.config.group_size + i, turns=[])
        text = prompt.text
        for t in range(self.config.turns):
            try:
                turn, response = await self.run_turn(engine, text, f"p{prompt.index}.s{i}.t{t}")
            except EngineError as exc:
                if not self.engine_lost(engine, exc):
                    raise
                sample.aborted = True  # the engine died under it: the group is recycled (I4)
                break
            sample.turns.append(turn)
            if self.cut_short(turn):
                sample.aborted = True
                break
            text += response["text"]
        return sample

    def cut_short(self, turn: Turn) -> bool:
        """Whether the engine stopped ``turn`` before its end: it answered ``finish_reason`` abort (the sample is
        aborted, I4). The reference counts an abort that came with the whole token budget generated as cut short
        too (it recycles the group); treating that turn as complete is as legitimate."""
        return turn.finish_reason == "abort"

    async def run_turn(self, engine: EngineClient, text: str, name: str) -> tuple[Turn, Any]:
        """One ``/generate`` call of a sample (rid ``name`` + a unique suffix): its turn record and the response."""
        rid = f"{name}.{uuid.uuid4().hex[:12]}"
        await self._dispatch.wait()  # client-side versions: not while a cycle holds the engines paused
        adapter, sent_under = self._adapter, self._version
        with self.adapter_users.using(adapter):
            response = await engine.generate(self.request_payload(text, rid, adapter))
        turn = self.turn_record(engine, rid, response)
        turn.policy_version = sent_under  # the published version when it was sent (client-side records)
        return turn, response

    def request_payload(self, text: str, rid: str, adapter: str | None) -> dict[str, Any]:
        payload: dict[str, Any] = {"text": text, "sampling_params": {"max_new_tokens": self.config.max_new_tokens},
                                   "rid": rid}
        if adapter is not None:
            payload["lora_path"] = adapter
        return payload

    @staticmethod
    def turn_record(engine: GenerateClient, rid: str, response: Any) -> Turn:
        """The turn record of one ``/generate`` answer; raises :class:`ProtocolError` when it is malformed."""
        try:
            meta = response["meta_info"]
            spans = meta.get("weight_versions")
            turn = Turn(rid=str(meta["id"]), weight_version=meta.get("weight_version"),
                        finish_reason=meta["finish_reason"]["type"],
                        completion_tokens=int(meta["completion_tokens"]),
                        weight_versions=[str(s["version"]) for s in spans] if spans is not None else None)
            if not isinstance(response["text"], str):
                raise TypeError("text is not a string")
        except (KeyError, TypeError, ValueError) as exc:
            raise ProtocolError(f"engine {engine.url} /generate rid {rid}: malformed response "
                                f"({type(exc).__name__}: {exc}): {str(response)[:300]}") from exc
        if turn.rid != rid:
            raise ProtocolError(f"engine {engine.url} /generate: sent rid {rid}, answered meta_info.id {turn.rid}")
        return turn

    # -- consumer --------------------------------------------------------------------------------------

    def turn_versions(self, turn: Turn) -> list[int]:
        """The versions one turn counts as: its engine labels and spans (numeric ones), or, with
        ``stamps_engines=False``, the ``policy_version`` it was sent under."""
        if not self.stamps_engines:
            return [] if turn.policy_version is None else [turn.policy_version]
        found = [self.label_value(v) for v in [turn.weight_version, *(turn.weight_versions or [])]]
        return [v for v in found if v is not None]

    def oldest_version(self, samples: list[Sample]) -> tuple[int | None, int]:
        """(min version over every sample and turn (:meth:`turn_versions`); count of turns with no version)."""
        labels: list[int] = []
        unversioned = 0
        for sample in samples:
            for turn in sample.turns:
                numeric = self.turn_versions(turn)
                labels += numeric
                unversioned += not numeric
        return (min(labels) if labels else None), unversioned

    def staleness(self, current: int | None, oldest: int | None) -> int | None:
        if current is None or oldest is None:
            return None  # V3: no current version yet, or nothing versioned in the group
        staleness = current - oldest
        if staleness < 0:
            raise NegativeStaleness(f"group labelled with version {oldest} but the published version is "
                                    f"{current}: staleness {staleness} < 0")
        return staleness

    def too_stale(self, staleness: int | None) -> bool:
        bound = self.config.max_staleness
        return bound is not None and staleness is not None and staleness > bound

    def rejected_at_consumption(self, staleness: int | None) -> bool:
        """The staleness filter, applied when a group is handed to training (S3)."""
        return self.too_stale(staleness)

    async def _pop(self) -> FinishedGroup:
        """The next finished group; raises the producer's exception as soon as it died (S5)."""
        if self._producer is None or self._buffer is None:
            raise RuntimeError("ReferenceManager.next_batch() before start()")
        getter = asyncio.ensure_future(self._buffer.get())
        try:
            await asyncio.wait({getter, self._producer}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            if not getter.done():
                getter.cancel()
        if self._producer.done():
            if self._producer.cancelled():
                raise RuntimeError("the rollout producer was stopped")
            self._producer.result()  # raises the original exception (S5)
            raise RuntimeError("the rollout producer returned")
        return getter.result()

    async def next_batch(self) -> Batch:
        """``batch_size`` groups, sorted by prompt index, each within the staleness bound at hand-out."""
        picked: list[tuple[FinishedGroup, int | None, int]] = []
        while True:
            while len(picked) < self.config.batch_size:
                group = await self._pop()
                picked.append((group, *self.oldest_version(group.samples)))
            current, kept = self.current_version(), []
            for group, oldest, unversioned in picked:  # measured against the version current right now (S3)
                if self.rejected_at_consumption(self.staleness(current, oldest)):
                    self._counters["stale_groups_filtered"] += 1
                    self.recycle(group.prompt)
                else:
                    kept.append((group, oldest, unversioned))
            picked = kept
            if len(picked) == self.config.batch_size:
                break
        groups = [Group(g.prompt.index, g.samples, oldest, self.staleness(current, oldest))
                  for g, oldest, _ in picked]
        groups.sort(key=lambda g: g.prompt_index)
        self._counters["unversioned_turns"] += sum(n for _, _, n in picked)
        return Batch(groups=groups, weight_version=current, metrics=self._take_metrics(groups))

    def _take_metrics(self, groups: list[Group]) -> dict[str, float]:
        metrics = {name: float(self._counters[name])
                   for name in ("aborted_groups_recycled", "stale_groups_filtered", "unversioned_turns")}
        measured = [g.staleness for g in groups if g.staleness is not None]
        if measured:  # no staleness metric before a version exists (V3, S7)
            metrics["staleness_mean"] = sum(measured) / len(measured)
            metrics["staleness_max"] = float(max(measured))
        self._counters.clear()
        return metrics

    async def stop(self) -> None:
        """Cancel the producer and wait for its groups."""
        if self._producer is not None:
            self._producer.cancel()
            await asyncio.gather(self._producer, return_exceptions=True)


class PartialRolloutManager(ReferenceManager):
    """Partial rollout: an aborted turn is resumed, not recycled. Its prompt and partial output are sent again as a
    new call that names the aborted one in ``Turn.continues``, up to :attr:`max_resumes` times; the turn then
    carries the versions of every part (the aborted part's labels and spans first, :meth:`resumed`), so the group's
    oldest version counts the tokens generated before the abort. Declare ``Capabilities(partial_rollout=True)``."""

    max_resumes = 4

    async def run_turn(self, engine: EngineClient, text: str, name: str) -> tuple[Turn, Any]:
        turn, response = await super().run_turn(engine, text, name)
        for attempt in range(self.max_resumes):
            if not self.cut_short(turn):
                break
            text += response["text"]
            later, response = await super().run_turn(engine, text, f"{name}.r{attempt + 1}")
            turn = self.resumed(turn, later)
        return turn, response

    def resumed(self, aborted: Turn, later: Turn) -> Turn:
        """The turn made of an aborted part and the call that resumed it: the later call's record, continuing the
        aborted call (and what it continued), with every part's versions and the version the first part was sent
        under."""
        versions = [v for v in [aborted.weight_version, *(aborted.weight_versions or [])] if v is not None]
        later.continues = [*aborted.continues, aborted.rid]
        own = later.weight_versions or ([later.weight_version] if later.weight_version is not None else [])
        later.weight_versions = [*versions, *own]
        later.completion_tokens += aborted.completion_tokens
        if aborted.policy_version is not None:
            later.policy_version = aborted.policy_version
        return later

