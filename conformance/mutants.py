"""The suite's own proof: the reference integration with one real bug put back, per mutant.

Each mutant is a subclass of one reference piece overriding one small method (or a different checkpoint
writer), reproducing a bug found in a real framework (``source`` names where: the framework, its issue or pull
request). The
suite must fail every mutant on the invariants listed in ``kills``. Select one with
``--integration conformance.mutants:<name>``.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import json
import logging
import shutil
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, AsyncIterator, Mapping, Sequence

import httpx

from .checks import invariants, known_invariants
from .interface import BuildEnv, Integration, LoraAdapter, Sample, Turn
from .reference import EngineError, HttpEngineClient, ReferenceIntegration, ReferenceManager, ReferenceUpdater, \
    VllmEngineClient, VllmSleepingClient
from .reference import vllm as reference_vllm
from .reference.concurrency import gather_all
from .reference.integration import default_capabilities
from .reference.manager import FinishedGroup, PartialRolloutManager, numeric_label
from .reference.protocols import WeightSyncClient
from .reference.transports import (DiskTransport, DistributedTransport, LoraTransport, Tensor, WeightTransport,
                                   safetensors_bytes, write_checkpoint_atomic)
from .scenarios import SCENARIOS

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Mutant:
    """One reintroduced bug."""

    name: str
    bug: str
    """One line: what the mutant gets wrong."""
    source: str
    """Where the bug was found (seed, issue)."""
    kills: tuple[str, ...]
    """Invariant ids expected to catch it."""
    integration: Integration
    shows_in: tuple[str, ...]
    """The scenarios built to expose this bug: the quick proof CI runs (the determinism benchmark runs every
    scenario checked for the invariants it breaks)."""

    def __post_init__(self) -> None:
        unknown = sorted(set(self.kills) - known_invariants()) + sorted(set(self.shows_in) - set(SCENARIOS))
        if unknown or not self.kills:
            raise ValueError(f"mutant {self.name!r}: unknown invariant(s) or scenario(s) {unknown} (kills "
                             f"{list(self.kills)}, shows_in {list(self.shows_in)})")

    def scenarios(self) -> list[str]:
        """The scenarios checked for an invariant this mutant breaks (the others cannot kill it as expected)."""
        return [s.name for s in SCENARIOS.values() if any(invariants(c) & set(self.kills) for c in s.checks)]

    def killers(self, results: Mapping[str, Any]) -> dict[str, list[str]]:
        """Expected invariant → the cases whose checker itself failed on it (``run_cases`` results). A case that
        fails only because the run broke does not count: the checker must see the bug."""
        found: dict[str, list[str]] = {}
        for scenario, result in results.items():
            for check, v in result.verdicts.items():
                if v.checker_status == "fail":
                    for inv in invariants(check) & set(self.kills):
                        found.setdefault(inv, []).append(f"{check}-{scenario}")
        return found


# -- engine client -----------------------------------------------------------------------------------------

class BareVersionBumpClient(HttpEngineClient):
    def version_payload(self, version: str) -> dict[str, Any]:
        return {"new_version": version}  # SGLang then defaults abort_all_requests=True


class UncheckedTransferClient(HttpEngineClient):
    def check_response(self, endpoint: str, response: httpx.Response) -> Any:
        if endpoint.startswith(("/update_weights_from_", "/load_lora_adapter")):
            if response.status_code != 200:  # logged, not raised (minimind's update_policy)
                log.warning("weight update %s failed: %s %s", endpoint, response.status_code, response.text)
            return None
        return super().check_response(endpoint, response)


class AbortPauseClient(HttpEngineClient):
    def request_body(self, endpoint: str, payload: Any) -> Any:
        return {} if endpoint == "/pause_generation" else payload  # SGLang's default mode for {} is abort


class LoadsIntoReleasedClient(AbortPauseClient):
    """Frees the engines' memory for each update (colocated trainers) and takes it back only with the continue."""

    async def pause(self, mode: str) -> None:
        await super().pause(mode)  # abort: SGLang 0.5.10+ releases memory only when the scheduler is idle
        await self._call("/release_memory_occupation", {"tags": ["kv_cache", "weights"]})

    async def resume(self) -> None:
        await self._call("/resume_memory_occupation", {"tags": ["kv_cache", "weights"]})  # after the load: too late
        await super().resume()


class NeverPausesUpdater(ReferenceUpdater):
    async def pause_all(self) -> None:
        return None  # declares pause modes, loads while the engines generate


class ImplicitFlushClient(HttpEngineClient):
    def request_body(self, endpoint: str, payload: Any) -> Any:
        if endpoint == "/update_weights_from_disk":  # flush_cache left out: SGLang's default (true) applies
            return {k: v for k, v in payload.items() if k != "flush_cache"}
        return payload


class RetryThenIgnoreClient(HttpEngineClient):
    async def update_weights_from_disk(self, path: str | Path, weight_version: str | None = None,
                                       flush_cache: bool = False) -> None:
        for attempt in (1, 2):
            try:
                return await super().update_weights_from_disk(path, weight_version, flush_cache)
            except EngineError as exc:  # retried once, then logged and carried on
                log.warning("disk update attempt %d failed: %s", attempt, exc)



class BareBumpAfterRefusalClient(HttpEngineClient):
    """Once this engine refused a transfer, the version bumps of the updates that follow post only ``new_version``
    (the retry path builds its own payload), so SGLang aborts every request the engine holds."""

    _refused = False

    def check_response(self, endpoint: str, response: httpx.Response) -> Any:
        try:
            return super().check_response(endpoint, response)
        except EngineError:
            if endpoint.startswith(("/update_weights_from", "/load_lora_adapter")):
                self._refused = True
            raise

    def version_payload(self, version: str) -> dict[str, Any]:
        return {"new_version": version} if self._refused else super().version_payload(version)

# -- updater -------------------------------------------------------------------------------------------------

class LoraUnstampedUpdater(ReferenceUpdater):
    _stamp_due = True

    async def transfer(self, new: int, mover: WeightTransport | None, weights: Mapping[str, Any] | None,
                        lora: LoraAdapter | None) -> str | None:
        self._stamp_due = lora is None  # the bump lives in the full-weight path only
        return await super().transfer(new, mover, weights, lora)

    async def stamp(self, new: int) -> None:
        if self._stamp_due:
            await super().stamp(new)


class LoraStampFirstUpdater(ReferenceUpdater):
    async def transfer(self, new: int, mover: WeightTransport | None, weights: Mapping[str, Any] | None,
                       lora: LoraAdapter | None) -> str | None:
        if lora is not None:  # the adapter path relabels the engines first, then loads the adapter
            await self.stamp(new)
        return await super().transfer(new, mover, weights, lora)


class NoResumeOnFailureUpdater(ReferenceUpdater):
    async def release_on_failure(self, exc: BaseException) -> None:
        return None  # continue_generation only on the success path, as in the miles mixin


class ResumesOnPartialWeightsUpdater(ReferenceUpdater):
    async def after_failed_load(self, exc: BaseException, sent: list[WeightSyncClient]) -> None:
        return None  # every engine is continued after a failed load, whatever part of the weights it holds


class AlwaysFlushUpdater(ReferenceUpdater):
    def flush_needed(self) -> bool:
        return True  # flushes even under in_place


class UnconvertedNamesUpdater(ReferenceUpdater):
    async def update(self, weights: Mapping[str, Any] | None = None, *, transport: str = "distributed",
                     lora: LoraAdapter | None = None) -> int:
        if weights is not None:  # the trainer's FSDP-wrapped names, never converted to the engine's
            weights = {f"_fsdp_wrapped_module.{name}": tensor for name, tensor in weights.items()}
        return await super().update(weights, transport=transport, lora=lora)


class PublishFirstUpdater(ReferenceUpdater):
    async def transfer(self, new: int, mover: WeightTransport | None, weights: Mapping[str, Any] | None,
                        lora: LoraAdapter | None) -> str | None:
        await self.stamp(new)  # bump and publish first, then push the weights
        self.publish(new, None)
        return await super().transfer(new, mover, weights, lora)


class StampEveryBucket(DistributedTransport):
    """Broadcasts in buckets and puts ``weight_version`` in every bucket's call, as miles does."""

    async def transfer(self, engines: Sequence[WeightSyncClient], weights: Mapping[str, Tensor],
                       version: int) -> None:
        names = list(weights)
        for bucket in (names[: len(names) // 2], names[len(names) // 2:]):
            await super().transfer(engines, {n: weights[n] for n in bucket}, version)

    async def _receive(self, engine: WeightSyncClient, names: Sequence[str], dtypes: Sequence[str],
                       shapes: Sequence[Sequence[int]], version: int) -> None:
        await engine.update_weights_from_distributed(names, dtypes, shapes, self.group_name,
                                                     weight_version=str(version))


class ReloadSameNameLora(LoraTransport):
    """Refreshes the adapter under one fixed name: unload the old one, then load the new one, inside the cycle."""

    _loaded = False

    @staticmethod
    def versioned_name(adapter: LoraAdapter, version: int) -> str:
        return adapter.name

    async def load(self, engines: Sequence[WeightSyncClient], adapter: LoraAdapter, version: int) -> str:
        if self._loaded:  # while paused: SGLang's unload waits for the paused requests that use it
            await self.unload(engines, adapter.name)
        name = await super().load(engines, adapter, version)
        self._loaded = True
        return name


# -- manager -------------------------------------------------------------------------------------------------

class SilentRegressionManager(ReferenceManager):
    def on_version_regression(self, current: int, published: int) -> int:
        log.warning("weight version went backwards: %s -> %s", current, published)  # warn, then store
        return published


class NoneAsZeroManager(ReferenceManager):
    def current_version(self) -> int | None:
        return self._version or 0  # "no update yet" measured as version 0

    def label_value(self, label: Any) -> int | None:
        return numeric_label(label) or 0  # "default" counted as version 0


class LastTurnLabelManager(ReferenceManager):
    def oldest_version(self, samples: list[Sample]) -> tuple[int | None, int]:
        last = [self.label_value(s.turns[-1].weight_version) for s in samples if s.turns]
        numeric = [v for v in last if v is not None]  # earlier turns and per-token spans ignored
        return (min(numeric) if numeric else None), super().oldest_version(samples)[1]


class BoundPlusOneManager(ReferenceManager):
    def too_stale(self, staleness: int | None) -> bool:
        bound = self.config.max_staleness  # off by one: a group at bound + 1 is still admitted
        return bound is not None and staleness is not None and staleness > bound + 1


class StrictBoundManager(ReferenceManager):
    def too_stale(self, staleness: int | None) -> bool:
        bound = self.config.max_staleness  # off by one the strict way: a group at the bound is rejected too
        return bound is not None and staleness is not None and staleness >= bound


class ProductionTimeFilterManager(ReferenceManager):
    async def enqueue(self, group: FinishedGroup) -> None:
        oldest, _ = self.oldest_version(group.samples)
        if self.too_stale(self.staleness(self.current_version(), oldest)):  # judged when it finishes
            self._counters["stale_groups_filtered"] += 1
            self.recycle(group.prompt)
            return
        await super().enqueue(group)

    def rejected_at_consumption(self, staleness: int | None) -> bool:
        return False


class KeepsAbortedManager(ReferenceManager):
    async def handle_aborted(self, prompt: Any, samples: list[Sample]) -> None:
        self._counters["aborted_groups_recycled"] += 1
        await self.enqueue(FinishedGroup(prompt, samples))  # re-queued with its partial turns


class RejoinsUnsyncedManager(ReferenceManager):
    def engine_lost(self, engine: Any, error: Any) -> bool:
        return self.died(error)  # the group is recycled, the engine kept in the rotation


class ForgetsAbortedPartManager(PartialRolloutManager):
    def resumed(self, aborted: Turn, later: Turn) -> Turn:
        later.continues = [*aborted.continues, aborted.rid]  # resumed, but only the last part's versions kept
        return later


class SendsIntoPauseGateManager(ReferenceManager):
    @contextlib.asynccontextmanager
    async def updating(self) -> AsyncIterator[None]:
        yield  # calls go out while the engines are paused, stamped with the version published so far


class TrainerHandleManager(ReferenceManager):
    """Client-side versions read, when each call goes out, off the trainer cell it was wired to at start-up (its
    handle), not off the version published: the same while that cell trains."""

    trainer: Any = None
    _read: dict[str, int]

    def request_payload(self, text: str, rid: str, adapter: str | None) -> dict[str, Any]:
        if not hasattr(self, "_read"):
            self._read = {}
        if self.trainer is not None:
            self._read[rid] = self.trainer.published
        return super().request_payload(text, rid, adapter)

    async def run_turn(self, engine: Any, text: str, name: str) -> tuple[Any, Any]:
        turn, response = await super().run_turn(engine, text, name)
        if turn.rid in getattr(self, "_read", {}):
            turn.policy_version = self._read.pop(turn.rid)
        return turn, response


class WiresFirstCellUpdater(ReferenceUpdater):
    """Hands itself to the manager, once: the first trainer cell (a failover cell is never wired). ``published``: the
    version it last published (None before its first)."""

    published: int | None = None

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if getattr(self.manager, "trainer", None) is None:
            self.manager.trainer = self

    def publish(self, new: int, adapter: str | None) -> None:
        super().publish(new, adapter)
        self.published = new


class InFlightRidsManager(ReferenceManager):
    """Knows the rids of its requests in flight, for an updater that clears them before each update."""

    in_flight: set[str]

    def request_payload(self, text: str, rid: str, adapter: str | None) -> dict[str, Any]:
        if not hasattr(self, "in_flight"):
            self.in_flight = set()
        self.in_flight.add(rid)
        return super().request_payload(text, rid, adapter)

    def turn_record(self, engine: Any, rid: str, response: Any) -> Any:  # type: ignore[override]
        getattr(self, "in_flight", set()).discard(rid)
        return ReferenceManager.turn_record(engine, rid, response)


class AbortsOwnRequestsUpdater(ReferenceUpdater):
    async def pause_all(self) -> None:
        rids = sorted(getattr(self.manager, "in_flight", ()))  # its own requests, aborted by rid before each update
        await asyncio.gather(*(engine._call("/abort_request", {"rid": rid}) for rid in rids for engine in self.engines))
        await super().pause_all()


class DropsOnNewVersionManager(ReferenceManager):
    """Closes its requests in flight when a new version is published and regenerates their prompts under it."""

    _generating: set[asyncio.Task[None]]

    async def _run_group(self, prompt: Any) -> None:
        if not hasattr(self, "_generating"):
            self._generating = set()
        task = asyncio.ensure_future(super()._run_group(prompt))
        self._generating.add(task)
        try:
            await asyncio.wait({task})
        except asyncio.CancelledError:
            task.cancel()
            raise
        finally:
            self._generating.discard(task)
        if task.cancelled():  # dropped for the new version: the connection closed, the prompt starts over
            self.recycle(prompt)
            return
        task.result()

    def set_weight_version(self, version: int) -> None:
        super().set_weight_version(version)
        for task in list(getattr(self, "_generating", ())):
            task.cancel()


# -- integration ---------------------------------------------------------------------------------------------

@dataclass(frozen=True, eq=False)
class FreshCounterIntegration(ReferenceIntegration):
    def start_version(self, manager: ReferenceManager) -> int:
        return 0  # each trainer cell's counter starts at 0


@dataclass(frozen=True, eq=False)
class BucketStampIntegration(ReferenceIntegration):
    def make_transports(self, env: BuildEnv) -> dict[str, WeightTransport]:
        transports = super().make_transports(env)
        transports["distributed"] = StampEveryBucket(self.backend, timeout_s=self.timeout_s)
        return transports


def write_checkpoint_in_place(root: Path, name: str, tensors: Mapping[str, Tensor],
                              config: Mapping[str, Any]) -> Path:
    """Writes straight into the final directory: readers can see it half-written."""
    final = root / name
    final.mkdir(parents=True, exist_ok=True)
    (final / "model.safetensors").write_bytes(safetensors_bytes(tensors))
    (final / "config.json").write_text(json.dumps(dict(config)))
    return final


def write_checkpoint_reused_in_place(root: Path, name: str, tensors: Mapping[str, Tensor],
                                     config: Mapping[str, Any]) -> Path:
    """One path for every version: the first checkpoint renamed into place, each later one written over it."""
    final = root / "latest"
    if not final.exists():
        return write_checkpoint_atomic(root, "latest", tensors, config)
    (final / "model.safetensors").write_bytes(safetensors_bytes(tensors))
    (final / "config.json").write_text(json.dumps(dict(config)))
    return final


class SaveNotAwaitedTransport(DiskTransport):
    """Saves each checkpoint in place, and its last file (the trainer's state) lands after the engines were told to
    load it: the save is not awaited before the load, so the engines read a checkpoint still being written."""

    async def transfer(self, engines: Sequence[WeightSyncClient], weights: Mapping[str, Tensor],
                       version: int) -> None:
        path = await self._staged_for(weights, version)
        await gather_all(*(engine.update_weights_from_disk(path) for engine in engines))
        await asyncio.to_thread((Path(path) / "trainer_state.json").write_text, json.dumps({"version": version}))
        self._staged = None
        await asyncio.to_thread(self._remove_older_than, version)


class FreedByFirstLoadTransport(DiskTransport):
    """Each checkpoint is freed when its reference count falls to 0, but the count starts at 1 (not at the number
    of engines told to load it), so the first engine to finish frees it while the others still read it."""

    async def transfer(self, engines: Sequence[WeightSyncClient], weights: Mapping[str, Tensor],
                       version: int) -> None:
        path = await self._staged_for(weights, version)
        readers = [1]

        async def load(engine: WeightSyncClient) -> None:
            try:
                await engine.update_weights_from_disk(path)
            finally:
                readers[0] -= 1
                if readers[0] == 0:
                    await asyncio.to_thread(shutil.rmtree, path, True)
        await gather_all(*(load(engine) for engine in engines))
        self._staged = None


def _mutant(name: str, bug: str, source: str, kills: tuple[str, ...], *, shows_in: tuple[str, ...],
            **pieces: Any) -> Mutant:
    cls = pieces.pop("integration_cls", ReferenceIntegration)
    return Mutant(name, bug, source, kills, cls(name=name, **pieces), shows_in)


MUTANTS: dict[str, Mutant] = {m.name: m for m in [
    _mutant("version_bump_aborts", "update_weight_version posts only new_version, so SGLang aborts every request",
            "miles #2589", ("I1", "I2"),
            shows_in=("steady-tensor-retract",), client_cls=BareVersionBumpClient),
    _mutant("lora_unstamped", "a LoRA update bumps the trainer counter but never the engines' label",
            "miles fully-async rollout review [P1]; rl-frameworks c.3", ("V1",),
            shows_in=("lora",), updater_cls=LoraUnstampedUpdater),
    _mutant("failover_regression_stored", "a failover cell restarts at 0 and the manager stores the lower version",
            "miles fully-async rollout review [P2]; miles #2244 review", ("V4",),
            shows_in=("failover",), integration_cls=FreshCounterIntegration,
            manager_cls=SilentRegressionManager),
    _mutant("none_as_zero", "no version yet and 'default' labels count as version 0",
            "rl-frameworks c.4; miles test_staleness_filter_off_before_the_first_weight_update", ("V3",),
            
            shows_in=("first-drain",), manager_cls=NoneAsZeroManager),
    _mutant("oldest_wrong", "a group's oldest version is the last turn's output-time label only",
            "rl-frameworks S2/V6; rllm #622", ("S2",),
            shows_in=("mixed-versions",), manager_cls=LastTurnLabelManager),
    _mutant("filter_at_production", "staleness is judged when a group finishes, not when it is consumed",
            "rl-frameworks S3; miles test_buffer_get_skips_groups_stale_at_consumption_time", ("S3",),
            
            shows_in=("staleness",), manager_cls=ProductionTimeFilterManager),
    _mutant("recycle_partial", "an aborted group is re-queued with its partial turns",
            "slime #2092", ("I4",),
            shows_in=("aborted-groups",), manager_cls=KeepsAbortedManager),
    _mutant("rejoins_unsynced", "an engine that died under a request is used again as soon as it answers: a "
            "restarted engine serves its start-up weights, labelled default, until the next update", "miles #1724, "
            "#1805 (a recovered engine joined the router before the weight sync); issue 42", ("P9",),
            shows_in=("engine-restarted",), manager_cls=RejoinsUnsyncedManager),
    _mutant("resume_not_finally", "a failed update leaves the engines paused with the session open, also where it "
            "sent them no weights", "rl-frameworks I6; AReaL #1181; miles mixin; NeMo-RL #3612", ("I6",),
            shows_in=("lora-refused",), updater_cls=NoResumeOnFailureUpdater),
    _mutant("resumes_on_partial_weights", "after a failed load every engine is continued on whatever part of the "
            "weights it holds (SGLang restores nothing: 'partially updated, discard the whole weights')",
            "SGLang's model_runner_components/weight_updater.py; miles test_dist_weight_update_lifecycle; "
            "vllm #57854", ("P8",),
            shows_in=("failing-transfer-distributed",), updater_cls=ResumesOnPartialWeightsUpdater),
    _mutant("success_false_ignored", "an engine's success:false / non-200 transfer answer is logged, not raised",
            "miles #684; minimind update_policy", ("P5",),
            shows_in=("one-engine-rejects",), client_cls=UncheckedTransferClient),
    _mutant("non_atomic_checkpoint", "the checkpoint is saved in place at its final path and the save is not "
            "awaited: its last file is written after the engines were told to load it",
            "minimind (update_policy: saved in place); async checkpoint saves not awaited before the load", ("F3",),
            shows_in=("steady-disk-retract",), disk_writer=write_checkpoint_in_place,
            disk_cls=SaveNotAwaitedTransport),
    _mutant("flush_under_in_place", "the cache is flushed under in_place too",
            "rl-frameworks C2; ray #63769 review", ("C2",),
            shows_in=("steady-tensor-in_place",), updater_cls=AlwaysFlushUpdater),
    _mutant("lora_reload_in_place", "a LoRA refresh unloads the adapter and loads the new one under the same name "
            "while the engines are paused, so the unload waits forever for the paused requests that use it",
            "miles #2780; rl-frameworks P7", ("P7",),
            shows_in=("lora",), lora_cls=ReloadSameNameLora),
    _mutant("pause_abort", "pauses with an empty body, which SGLang reads as mode abort: every request in flight "
            "is aborted", "rl-frameworks I3; a framework that posts {} to /pause_generation", ("I3",),
            
            shows_in=("steady-tensor-retract",), client_cls=AbortPauseClient),
    _mutant("loads_into_released", "frees the engines' memory for each update (/release_memory_occupation of the "
            "weights and the KV cache) and loads the new weights before taking the memory back, which it does only "
            "with the continue", "SGLang's memory saver (the load meets memory the engine gave back); verl/slime "
            "colocated sync (resume the weights, load, then resume the KV cache); the twin of "
            "vllm_loads_while_asleep; issue 42", ("P1",),
            shows_in=("steady-tensor-retract",), client_cls=LoadsIntoReleasedClient),
    _mutant("implicit_flush_in_place", "the disk update leaves flush_cache out, so SGLang flushes (its default) "
            "while the engines are paused in place", "rl-frameworks C2; a framework's disk load", ("C2",),
            
            shows_in=("steady-disk-in_place",), client_cls=ImplicitFlushClient),
    _mutant("bucket_stamped", "every bucket of a distributed update carries weight_version, so the engines are "
            "relabelled when the first bucket lands, before the whole update did", "rl-frameworks V2 (miles)",
            ("V2",),
            
            shows_in=("failing-transfer-distributed",), integration_cls=BucketStampIntegration),
    _mutant("filter_admits_bound_plus_one", "the staleness filter is off by one: a group at bound + 1 is trained",
            "rl-frameworks S3", ("S3",),
            shows_in=("staleness",), manager_cls=BoundPlusOneManager),
    _mutant("lora_stamped_before_load", "a LoRA update relabels the engines before the adapter is loaded, so a "
            "refused load leaves them labelled with a version they do not serve", "rl-frameworks V2 (LoRA path)",
            ("V2",), shows_in=("lora-refused-by-one",), updater_cls=LoraStampFirstUpdater),
    _mutant("resumed_turn_forgets_aborted_part", "partial rollout resumes an aborted call but records only the "
            "resumed part's versions, so a group generated partly under an older version is measured as newer",
            "rl-frameworks S2 (partial rollout, slime/AReaL)", ("S2",),
            shows_in=("partial-rollout",), manager_cls=ForgetsAbortedPartManager,
            capabilities=default_capabilities(partial_rollout=True)),
    _mutant("filter_rejects_at_bound", "the staleness filter is off by one the strict way: a group at exactly the "
            "bound is rejected, so admissible groups are regenerated", "rl-frameworks S3", ("S3",),
            shows_in=("staleness",), manager_cls=StrictBoundManager),
    _mutant("refusal_ignored_after_retry", "a refused disk load is retried once, then logged and ignored",
            "rl-frameworks P5; miles #684", ("P5",),
            shows_in=("one-engine-rejects",), client_cls=RetryThenIgnoreClient),
    _mutant("unconverted_names", "full updates send the trainer's FSDP-wrapped parameter names; SGLang skips names "
            "its model does not have (with a warning) and answers success, so the engines keep their old weights",
            # read in SGLang 0.5.23's source
            "SGLang load_weights (python/sglang/srt/models/llama.py); rl-frameworks P6", ("P6",),
            shows_in=("steady-disk-retract",), updater_cls=UnconvertedNamesUpdater),
    _mutant("aborts_own_requests", "before each update the integration aborts its own requests in flight by rid "
            "(/abort_request), to start the new version clean", "rl-frameworks I1/I2; a framework clearing its "
            "engines before a sync", ("I1", "I2"),
            shows_in=("steady-tensor-retract",), updater_cls=AbortsOwnRequestsUpdater, manager_cls=InFlightRidsManager),
    _mutant("drops_requests_on_update", "when a new version is published the manager closes its requests in flight "
            "and regenerates their prompts: no abort on the wire, the work is lost all the same",
            "rl-frameworks I1/I2; a rollout manager that restarts stale generations", ("I1", "I2"),
            shows_in=("steady-tensor-retract",), manager_cls=DropsOnNewVersionManager),
    _mutant("checkpoint_rewritten_in_place", "every version goes to one checkpoint path; the first is renamed into "
            "place, later ones are written over it, where engines loaded it and read it", "minimind (update_policy); "
            "rl-frameworks F3", ("F3",),
            shows_in=("steady-disk-retract",), disk_writer=write_checkpoint_reused_in_place),
    _mutant("gated_call_stamped_at_send", "versions kept client-side; a call sent while the engines are paused is "
            "recorded under the version published when it was sent, though SGLang's pause gate holds it until the "
            "cycle's weights are in", "rl-frameworks V6 (miles #2296: measure staleness from submit); SGLang "
            "TokenizerManager.generate_request parks new requests while paused", ("S2",),
            shows_in=("answers-while-paused",), manager_cls=SendsIntoPauseGateManager,
            capabilities=default_capabilities(stamps_engines=False)),
    _mutant("versions_from_first_trainer", "versions kept client-side and read off the handle of the trainer cell "
            "the rollout side was wired to at start-up; after a failover that cell is gone, so every later call is "
            "recorded under its last version", "rl-frameworks V4/S2 (trainer failover); a rollout worker that "
            "keeps the actor handle of the trainer it started with", ("S2",),
            shows_in=("failover",), manager_cls=TrainerHandleManager, updater_cls=WiresFirstCellUpdater,
            capabilities=default_capabilities(stamps_engines=False)),
    _mutant("bare_bump_after_refusal", "after an engine refused a transfer, the next updates' version bumps post "
            "only new_version, so SGLang aborts every request it holds", "rl-frameworks I1/I2 (miles #2589) on a "
            "retry path", ("I1", "I2"),
            shows_in=("one-engine-rejects",), client_cls=BareBumpAfterRefusalClient),
    _mutant("checkpoint_freed_by_first_load", "a checkpoint's reference count starts at 1, not at the number of "
            "engines, so the first engine to load it frees it while the others are still loading it",
            "rl-frameworks F3 (checkpoints kept until every engine loaded them); a trainer reclaiming disk between "
            "syncs", ("F3",),
            shows_in=("slow-engine-disk",), disk_cls=FreedByFirstLoadTransport),
    _mutant("publish_before_transfer", "the version is bumped and published before the weights are pushed",
            "rl-frameworks V2; tokenspeed #672, trl #5932 reviews", ("V2",),
            shows_in=("steady-tensor-retract",), updater_cls=PublishFirstUpdater),
    _mutant("never_pauses", "declares pause modes but never pauses: the weights change under the requests in "
            "flight", "issue 41 (an integration that declares a mode and never sends it passed with unknown); "
            "a pause call lost in a refactor", ("I3",),
            shows_in=("steady-tensor-retract",), updater_cls=NeverPausesUpdater),
]}


# -- on vLLM (``--engine vllm``) ----------------------------------------------------------------------------------

class VllmDefaultPauseClient(VllmEngineClient):
    async def pause(self, mode: str) -> None:
        await self._call("/pause")  # no mode: vLLM's default, abort, ends every request in flight


class VllmDrainGivesUpClient(VllmEngineClient):
    GIVE_UP_S = 1.0

    async def pause(self, mode: str) -> None:
        if mode != "retract":
            return await super().pause(mode)
        try:  # a wait pause with a deadline shorter than the turns in flight, then abort the stragglers
            await asyncio.wait_for(self._call("/pause?mode=wait"), self.GIVE_UP_S)
        except TimeoutError:
            log.warning("drain did not finish within %.1fs: aborting the requests in flight", self.GIVE_UP_S)
            await self._call("/pause?mode=abort")


class VllmSglangModePauseClient(VllmEngineClient):
    async def pause(self, mode: str) -> None:
        await self._call(f"/pause?mode={mode}")  # SGLang's mode name: vLLM knows abort, wait, keep; 400

    def check_response(self, endpoint: str, response: httpx.Response) -> Any:
        if endpoint.startswith("/pause?") and response.status_code != 200:  # logged, not raised
            log.warning("pause refused: %s %s", response.status_code, response.text)
            return None
        return super().check_response(endpoint, response)


class VllmNativeNotReopenedClient(VllmEngineClient):
    async def update_weights_from_distributed(self, names: Sequence[str], dtypes: Sequence[str],
                                              shapes: Sequence[Sequence[int]], group_name: str,
                                              weight_version: str | None = None, flush_cache: bool = False) -> None:
        await self._call("/update_weights", {"update_info": {  # a failure raises as it is: no session reopened
            "names": list(names), "dtype_names": list(dtypes), "shapes": [list(s) for s in shapes]}})


class VllmLoadsAsleepClient(VllmSleepingClient):
    async def wake_weights(self) -> None:
        pass  # the weights are loaded into sleeping memory; the continue's /wake_up wakes them afterwards


class VllmSleepAbortClient(VllmSleepingClient):
    async def pause(self, mode: str) -> None:
        await self._call("/sleep?level=1")  # no mode: vLLM's default, abort, ends every request in flight


class VllmUncheckedReloadClient(VllmEngineClient):
    UNCHECKED = "/collective_rpc"  # reload_weights

    def check_response(self, endpoint: str, response: httpx.Response) -> Any:
        if endpoint == self.UNCHECKED and response.status_code != 200:  # logged, not raised
            log.warning("%s failed: %s %s", endpoint, response.status_code, response.text)
            return None
        return super().check_response(endpoint, response)


class VllmNativeFailureIgnoredClient(VllmUncheckedReloadClient):
    UNCHECKED = "/update_weights"


class VllmNoRestoreClient(VllmEngineClient):
    async def restore(self, failure: EngineError) -> None:
        return None  # a failed reload is reported, and the engine resumed as it is: without weights


class VllmKeepsPrefixClient(VllmEngineClient):
    async def pause(self, mode: str) -> None:
        path = self._dialect.outgoing("/pause_generation", {"mode": mode})[0]
        await self._call(path if "clear_cache" in path else path + "&clear_cache=false")  # a faster resume

    async def flush_cache(self) -> None:
        return None  # the prefix cache outlives every load


ON_VLLM = {"steady-tensor-retract": "steady-disk-retract", "steady-tensor-in_place": "steady-disk-in_place",
           "slow-engine-tensor": "slow-engine-disk"}
"""A scenario the reference cannot run on vLLM (a tensor update) → the one showing the same bug with disk reloads."""
CARRIED_TO_VLLM = (
    "lora_unstamped", "failover_regression_stored", "none_as_zero", "oldest_wrong", "filter_at_production",
    "recycle_partial", "resume_not_finally", "non_atomic_checkpoint", "flush_under_in_place", "lora_reload_in_place",
    "filter_admits_bound_plus_one", "lora_stamped_before_load", "filter_rejects_at_bound",
    "checkpoint_rewritten_in_place", "gated_call_stamped_at_send", "versions_from_first_trainer",
    "checkpoint_freed_by_first_load", "publish_before_transfer", "rejoins_unsynced")
"""The mutants whose bug lives outside the SGLang client and the tensor transports: the same bug, on vLLM. Not
carried: the SGLang client's own (their vLLM twins are below), ``bucket_stamped`` (distributed buckets),
``aborts_own_requests`` (it posts SGLang's ``/abort_request``), ``unconverted_names`` (vLLM refuses a name its model
lacks, loudly: ``AutoWeightsLoader`` raises, so the bug cannot hide there), ``resumed_turn_forgets_aborted_part``
(partial rollout on vLLM is not built: on the fake vLLM its scenario built its situation in one run of three, so the
verdict is ``unknown`` as often as not)."""


def on_vllm(mutant: Mutant, name: str | None = None, bug: str | None = None, source: str | None = None,
            kills: tuple[str, ...] | None = None, client_cls: type[VllmEngineClient] = VllmEngineClient,
            shows_in: tuple[str, ...] | None = None) -> Mutant:
    """``mutant``'s bug in the reference on vLLM (``conformance.reference:vllm``): its pieces over ``client_cls``,
    its capabilities less the transports vLLM lacks, shown in :data:`ON_VLLM`'s counterparts (or ``shows_in``)."""
    base, own = reference_vllm.capabilities, mutant.integration.capabilities
    capabilities = replace(own, transports=base.transports, absent_because=base.absent_because)
    integration = replace(mutant.integration, name=name or f"vllm_{mutant.name}", client_cls=client_cls,
                          capabilities=capabilities)
    return Mutant(integration.name, bug or mutant.bug, source or mutant.source, kills or mutant.kills, integration,
                  shows_in or tuple(ON_VLLM.get(s, s) for s in mutant.shows_in))


VLLM_MUTANTS: dict[str, Mutant] = {m.name: m for m in [
    *(on_vllm(MUTANTS[name]) for name in CARRIED_TO_VLLM),
    on_vllm(MUTANTS["drops_requests_on_update"], shows_in=("steady-disk-in_place",)),  # a wait pause drains them
    on_vllm(MUTANTS["pause_abort"], "vllm_pause_default_abort", "pauses with /pause and no mode: vLLM's default, "
            "abort, ends every request in flight", "vllm-api.md (measured on CPU: /pause aborts what is in flight); "
            "a framework that calls the route as documented", ("I3",), client_cls=VllmDefaultPauseClient),
    on_vllm(MUTANTS["pause_abort"], "vllm_pause_sglang_mode", "pauses with SGLang's mode name "
            "(/pause?mode=in_place), which vLLM refuses with 400, and goes on: the engines load while they generate",
            "vllm-api.md (an invalid mode is a 400 and changes nothing); issue 41 (the suite recorded such a pause "
            "as a valid one)", ("I3",), client_cls=VllmSglangModePauseClient, shows_in=("steady-disk-in_place",)),
    on_vllm(MUTANTS["pause_abort"], "vllm_drain_gives_up", "pauses with /pause?mode=wait but gives the "
            "drain 1 s, then pauses with abort: every turn still decoding is aborted by the update", "issue 41 (a "
            "wait drain with a short deadline that then aborts the stragglers survived: no drain outlasted one)",
            ("I1", "I2"), client_cls=VllmDrainGivesUpClient, shows_in=("long-drain",)),
    on_vllm(MUTANTS["resumes_on_partial_weights"], shows_in=("one-engine-rejects",)),  # the others loaded them
    on_vllm(MUTANTS["resume_not_finally"], "vllm_native_session_not_reopened", "a native update that fails is raised "
            "as it is: vLLM ended the session with the layers reset, and the cycle's finish finds no session to "
            "finish, so the engine is left without weights", "vLLM gpu_worker.update_weights (0.32.0: a failed update ends "
            "the session); issue 41 (native weight transfer)", ("P6",), client_cls=VllmNativeNotReopenedClient,
            shows_in=("failing-transfer-distributed",)),
    on_vllm(MUTANTS["success_false_ignored"], "vllm_native_failure_ignored", "a native /update_weights that vLLM "
            "answers 500 is logged, not raised: the cycle goes on and relabels the engines, whose session vLLM ended "
            "with the layers reset", "miles #684 on vLLM's native transfer; issue 41 (a cycle's failure judged from "
            "the wire)", ("V2",),
            client_cls=VllmNativeFailureIgnoredClient, shows_in=("failing-transfer-distributed",)),
    on_vllm(MUTANTS["pause_abort"], "vllm_loads_while_asleep", "puts the engines to sleep for each update and "
            "reloads before waking the weights (the continue's /wake_up wakes them after)", "vllm#57853 (an update "
            "while asleep crashes the engine core on GPUs; CPU ignores the sleep); issue 42", ("P1",),
            client_cls=VllmLoadsAsleepClient, shows_in=("steady-disk-in_place",)),
    on_vllm(MUTANTS["pause_abort"], "vllm_sleep_default_abort", "puts the engines to sleep for each update with "
            "/sleep?level=1 and no mode: its pause is vLLM's default, abort, which ends every request in flight",
            "vLLM EngineCore.sleep (0.32.0: sleep pauses in mode, abort by default); issue 41 (/sleep was not "
            "recorded as a pause)", ("I3",), client_cls=VllmSleepAbortClient, shows_in=("steady-disk-in_place",)),
    on_vllm(MUTANTS["success_false_ignored"], "vllm_reload_failure_ignored", "a reload_weights that vLLM answers "
            "500 is logged, not raised, and the cycle goes on", "miles #684 on vLLM's disk path", ("P5",),
            client_cls=VllmUncheckedReloadClient),
    on_vllm(MUTANTS["resume_not_finally"], "vllm_failed_reload_not_restored", "a reload that failed is reported and "
            "the engines are resumed as they are; vLLM then holds no weights (its layers on the meta device) and the "
            "next forward pass kills the engine", "measured on vLLM 0.32.0 CPU (gpu/fidelity/vllm.py: a reload from "
            "a missing path, then a completion: 500, /health 503); the SGLang habit of relying on its rollback",
            ("P6",), client_cls=VllmNoRestoreClient, shows_in=("failing-transfer-disk",)),
    on_vllm(MUTANTS["pause_abort"], "vllm_prefix_cache_kept", "pauses with clear_cache=false (to resume faster) and "
            "never resets the prefix cache: every prompt after a load that shares a prefix with one before is answered "
            "over the old weights' KV", "NeMo-RL#4018 (the prefix cache never reset across refits); prime-rl's "
            "/pause?mode=keep&clear_cache=false without its per-version cache salt; issue 41", ("C3",),
            client_cls=VllmKeepsPrefixClient, shows_in=("prefix-reuse",)),
]}
"""Mutants of the reference on vLLM, each killed on the fake vLLM by the same invariant as its SGLang twin."""


def __getattr__(name: str) -> Integration:
    """``conformance.mutants:<name>`` is that mutant's integration (SGLang's table, then vLLM's)."""
    found = MUTANTS.get(name) or VLLM_MUTANTS.get(name)
    if found is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r} (mutants: {sorted(MUTANTS)}; on vLLM: "
                             f"{sorted(VLLM_MUTANTS)})")
    return found.integration


def __dir__() -> list[str]:
    return sorted([*globals(), *MUTANTS, *VLLM_MUTANTS])
