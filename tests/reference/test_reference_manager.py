"""The reference rollout manager: filters, staleness accounting, backpressure and failure propagation.

Most tests script the engine's answers (labels, spans, aborts) to pin the accounting exactly; the V3 test
runs against a fake SGLang engine.
"""

from __future__ import annotations

import asyncio
import itertools
from pathlib import Path
from typing import Any, Callable, Mapping

import pytest

from conformance.interface import Batch, BuildEnv, RolloutConfig
from conformance.reference import NegativeStaleness, ReferenceManager, VersionRegression

from reference_rig import Rig, prompt_source, within

pytestmark = pytest.mark.cpu


class ScriptedEngine:
    """An EngineClient whose ``/generate`` answers come from ``answer(payload, call_index)``."""

    url = "http://scripted"

    def __init__(self, answer: Callable[[Mapping[str, Any], int], dict]) -> None:
        self.answer, self.payloads, self._calls = answer, [], itertools.count()
        self.in_flight = 0
        self.release = asyncio.Event()
        self.release.set()

    async def generate(self, payload: Mapping[str, Any]) -> Any:
        self.payloads.append(dict(payload))
        self.in_flight += 1
        try:
            await self.release.wait()
            return self.answer(payload, next(self._calls))
        finally:
            self.in_flight -= 1


def output(payload: Mapping[str, Any], label: str, spans: list[str] | None = None, reason: str = "length") -> dict:
    meta: dict[str, Any] = {"id": payload["rid"], "finish_reason": {"type": reason}, "completion_tokens": 3,
                            "weight_version": label}
    if spans is not None:
        meta["weight_versions"] = [{"version": v, "start": i, "end": i + 1} for i, v in enumerate(spans)]
    return {"text": " out", "meta_info": meta}


class ObservedManager(ReferenceManager):
    """Signals when the buffer holds ``buffer_capacity`` groups (the producer is then blocked)."""

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self.full = asyncio.Event()

    async def enqueue(self, group: Any) -> None:
        await super().enqueue(group)
        if self._buffer.full():
            self.full.set()


def manager_over(engine: ScriptedEngine, tmp_path: Path, cls: type[ReferenceManager] = ObservedManager,
                 **rollout: Any) -> ReferenceManager:
    config = RolloutConfig(**{"batch_size": 2, "group_size": 2, "max_in_flight_groups": 3, "buffer_capacity": 3,
                              **rollout})
    return cls([engine], BuildEnv(["http://scripted"], tmp_path, config, prompt_source()))


def assert_shape(batch: Batch, config: RolloutConfig) -> None:
    """S6: exactly batch_size groups of group_size, sorted by prompt index, no aborted turn (I4)."""
    assert len(batch.groups) == config.batch_size
    assert [g.prompt_index for g in batch.groups] == sorted(g.prompt_index for g in batch.groups)
    assert all(len(g.samples) == config.group_size for g in batch.groups)
    assert all(t.finish_reason != "abort" for g in batch.groups for s in g.samples for t in s.turns)


@pytest.mark.asyncio
async def test_oldest_version_is_the_minimum_over_every_sample_turn_and_span(tmp_path: Path) -> None:
    def answer(p: Mapping[str, Any], i: int) -> dict:
        if not p["text"].endswith(":"):
            return output(p, "6", ["6"])  # second turns: all new
        return output(p, "6", ["3", "6"] if i == 0 else ["5", "6"])  # first turns span an update

    engine = ScriptedEngine(answer)
    manager = manager_over(engine, tmp_path, turns=2, max_in_flight_groups=1)
    manager.set_weight_version(6)
    await within(manager.start())
    batch = await within(manager.next_batch())
    assert_shape(batch, manager.config)
    # a span of an earlier turn, not the last output label (S2/V6)
    assert [(g.prompt_index, g.oldest_version, g.staleness) for g in batch.groups] == [(0, 3, 3), (1, 5, 1)]
    assert batch.metrics["staleness_max"] == 3.0 and batch.metrics["staleness_mean"] == 2.0
    second_turns = [p for p in engine.payloads if p["text"].endswith(": out")]
    assert second_turns  # multi-turn: the next turn extends the previous text with the output
    assert len({p["rid"] for p in engine.payloads}) == len(engine.payloads)
    await within(manager.stop())


@pytest.mark.asyncio
@pytest.mark.parametrize(("stamps_engines", "expected"), [(False, [(0, 2, 0), (1, 2, 0)]),
                                                           (True, [(0, None, None), (1, None, None)])])
async def test_client_side_versions_are_read_from_policy_version(tmp_path: Path, stamps_engines: bool,
                                                                 expected: list) -> None:
    """``stamps_engines=False``: a turn counts as the version published when it was sent, not the engine's label
    (which an integration that never stamps leaves at "default")."""
    engine = ScriptedEngine(lambda p, i: output(p, "default"))
    config = RolloutConfig(batch_size=2, group_size=2, max_in_flight_groups=2, buffer_capacity=2)
    manager = ReferenceManager([engine], BuildEnv(["http://scripted"], tmp_path, config, prompt_source()),
                               stamps_engines=stamps_engines)
    manager.set_weight_version(2)
    await within(manager.start())
    batch = await within(manager.next_batch())
    manager.set_weight_version(4)
    later = await within(manager.next_batch())
    assert [(g.prompt_index, g.oldest_version, g.staleness) for g in batch.groups] == expected
    assert all(t.policy_version == 2 for g in batch.groups for s in g.samples for t in s.turns)
    if not stamps_engines:  # groups sent under 2, buffered, consumed at 4
        assert 2 in {g.staleness for g in later.groups} and later.weight_version == 4
    await within(manager.stop())


@pytest.mark.asyncio
async def test_staleness_filter_is_applied_at_consumption(tmp_path: Path) -> None:
    label = "1"
    engine = ScriptedEngine(lambda p, i: output(p, label))
    manager = manager_over(engine, tmp_path, max_staleness=1)
    manager.set_weight_version(1)
    await within(manager.start())
    await within(manager.full.wait())  # groups labelled 1 wait in the buffer
    label = "3"
    manager.set_weight_version(3)  # two updates land while they wait

    batch = await within(manager.next_batch())

    assert_shape(batch, manager.config)
    assert batch.weight_version == 3 and all(g.staleness == 0 for g in batch.groups)
    assert batch.metrics["stale_groups_filtered"] >= 3  # every buffered group, recycled (S3)
    await within(manager.stop())


@pytest.mark.asyncio
async def test_filter_is_off_and_no_staleness_metric_before_the_first_update(rig: Rig) -> None:
    rig.start_engines()
    roles = await rig.build(max_staleness=0)
    await within(roles.manager.start())
    batch = await within(roles.manager.next_batch())
    assert batch.weight_version is None
    assert all(g.oldest_version is None and g.staleness is None for g in batch.groups)  # "default" is not 0
    assert not any("staleness" in name for name in batch.metrics)  # V3/S7
    assert batch.metrics["unversioned_turns"] == 4.0  # V5: counted, not silently dropped


@pytest.mark.asyncio
async def test_aborted_group_is_recycled_as_its_pristine_prompt(tmp_path: Path) -> None:
    engine = ScriptedEngine(lambda p, i: output(p, "default", reason="abort" if i == 0 else "length"))
    manager = manager_over(engine, tmp_path, max_in_flight_groups=1, turns=2)
    await within(manager.start())
    batch = await within(manager.next_batch())
    assert_shape(batch, manager.config)
    assert batch.metrics["aborted_groups_recycled"] == 1.0
    assert batch.groups[0].prompt_index == 0  # resubmitted from scratch, complete
    first_prompt_texts = [p["text"] for p in engine.payloads if p["rid"].startswith("p0.")]
    assert first_prompt_texts.count("prompt number 0:") == 4  # 2 samples, submitted twice (I4/I5)
    await within(manager.stop())


@pytest.mark.asyncio
async def test_negative_staleness_fails_loudly(tmp_path: Path) -> None:
    manager = manager_over(ScriptedEngine(lambda p, i: output(p, "5")), tmp_path)
    manager.set_weight_version(3)
    await within(manager.start())
    with pytest.raises(NegativeStaleness):  # S1
        await within(manager.next_batch())
    await within(manager.stop())


def test_a_lower_published_version_is_refused(tmp_path: Path) -> None:
    manager = manager_over(ScriptedEngine(lambda p, i: output(p, "1")), tmp_path)
    manager.set_weight_version(57)
    manager.set_weight_version(57)
    with pytest.raises(VersionRegression, match="57 -> 1"):  # V4
        manager.set_weight_version(1)
    assert manager.weight_version == 57


@pytest.mark.asyncio
async def test_a_dead_producer_fails_the_next_batch_with_its_own_exception(tmp_path: Path) -> None:
    boom = RuntimeError("engine exploded")

    def answer(p: Mapping[str, Any], i: int) -> dict:
        if i == 2:
            raise boom
        return output(p, "1")

    manager = manager_over(ScriptedEngine(answer), tmp_path, batch_size=8, buffer_capacity=8)
    await within(manager.start())
    with pytest.raises(RuntimeError) as failure:
        await within(manager.next_batch())
    assert failure.value is boom  # S5: the original exception, not a hang or a wrapper
    await within(manager.stop())


@pytest.mark.asyncio
async def test_in_flight_groups_and_buffer_are_bounded(tmp_path: Path) -> None:
    engine = ScriptedEngine(lambda p, i: output(p, "1"))
    manager = manager_over(engine, tmp_path)
    await within(manager.start())
    await within(manager.full.wait())
    for _ in range(50):  # let the producer run as far as it can (no clock involved)
        await asyncio.sleep(0)
    # 3 groups buffered + 3 finished groups blocked on the full buffer (the in-flight cap), 2 samples each
    assert len(engine.payloads) == (3 + 3) * 2  # S4
    assert manager.buffered_groups == 3
    await within(manager.stop())
