"""One replay: fake engines on virtual time, the integration under test, a trainer stepping and updating, and the
history every checker reads (the same :class:`~conformance.history.History` as a scenario run)."""

from __future__ import annotations

import asyncio
import random
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from ..backends import digest_of
from ..checks import REGISTRY, Verdict
from ..history import BatchRecord, Breakage, History, UpdateCycle
from ..interface import BuildEnv, Integration
from ..prompts import PromptSource
from ..situations.refused import TRANSFER_FAILURES
from ..wire import WireLog, WireRecorder
from .network import REPLAY_DOMAIN, Network, TransferDelay, engine_url, in_process
from .vtime import LoopClock, run_virtual
from .workload import TASK_TEMPLATE, Environment, ReplayConfig, seeded_uuid4, trainer_weights


Progress = Callable[[int, int, float], None]
"""``(updates done, updates, simulated seconds)``."""


@dataclass
class TrainerStep:
    """One training step: waiting for its batch, training, then the update."""

    index: int
    t_wait: float
    t_batch: float
    t_update: float
    t_done: float
    transfer_s: float

    @property
    def train_wait_s(self) -> float:
        return self.t_batch - self.t_wait


@dataclass
class ReplayRun:
    """What one replay produced."""

    config: ReplayConfig
    integration: str
    pause_mode: str
    history: History
    steps: list[TrainerStep]
    verdicts: dict[str, Verdict] = field(default_factory=dict)
    wall_s: float = 0.0
    cpu_s: float = 0.0
    """CPU seconds of this process during the run (the wall time on a machine shared with other work is longer)."""
    sim_s: float = 0.0

    @property
    def broke(self) -> bool:
        return bool(self.history.breaks)


def replay(integration: Integration, config: ReplayConfig, progress: Progress | None = None) -> ReplayRun:
    """Run ``integration`` through the replay of ``config`` in virtual time and judge it (never raises for the
    integration's failures: they are breakages in the history)."""
    t0, c0 = time.perf_counter(), time.process_time()
    with seeded_uuid4(config.seed):
        run = run_virtual(_replay(integration, config, progress))
    run.wall_s, run.cpu_s = time.perf_counter() - t0, time.process_time() - c0
    run.verdicts = judge(run.history)
    return run


def judge(history: History) -> dict[str, Verdict]:
    """Every registered check on the replay's history, as a scenario run is judged: the pause checks only for an
    integration that pauses, those about requests resident across a pause only when it pauses in place. A check
    whose situation the replay does not make (no LoRA, no failing update, no staleness bound, no disk update)
    answers unknown with its reason."""
    mode = history.pause_mode
    return {c.id: c.run(history) for c in REGISTRY.values()
            if not (c.needs_pause and mode is None) and not (c.needs_residency and mode == "abort")}


def _pause_mode(integration: Integration, wanted: str) -> str:
    modes = integration.capabilities.pause_modes
    return wanted if wanted in modes or not modes else sorted(modes)[0]


async def _replay(integration: Integration, config: ReplayConfig, progress: Progress | None) -> ReplayRun:
    from fakes.engine import FakeEngine

    loop = asyncio.get_running_loop()
    clock = LoopClock(loop)
    wire = WireLog(clock=loop.time)
    engines = [FakeEngine(profile=config.profile, tokens_per_second=1 / config.step_s,
                          max_running_requests=config.capacity, seed=config.seed, engine_id=f"e{i}", clock=clock)
               for i in range(config.engines)]
    rng = random.Random(f"transfer:{config.seed}")
    transfer = [config.transfer_s]
    urls = [engine_url(i) for i in range(config.engines)]
    caps = integration.capabilities
    mode = _pause_mode(integration, config.pause_mode)
    history = History("replay", integration.name, "fake-virtual-time", config.profile, config.seed,
                      max_staleness=config.max_staleness, pause_mode=mode if caps.pause_modes else None,
                      stamps_engines=caps.stamps_engines)
    environment = Environment(config, history.prompts)
    control = wire.control()
    network = Network({_host(url): WireRecorder(TransferDelay(e.app, lambda: transfer[0]), i, wire, control)
                       for i, (url, e) in enumerate(zip(urls, engines))}, environment, environment.start)
    steps: list[TrainerStep] = []
    initial = {name: blob.to_torch() for name, blob in engines[0].weights.items()}
    history.initial_digest = digest_of(initial)

    def labels() -> list[str | None]:
        return [e.weight_version for e in engines]  # what each engine's /model_info answers
    with in_process(network), tempfile.TemporaryDirectory(prefix="weightsync-replay-") as tmp:
        prompts = PromptSource(config.seed, TASK_TEMPLATE, history.prompts)
        env = BuildEnv(urls, Path(tmp), config.rollout(), prompts, mode, config.seed)
        env.checkpoint_dir.mkdir()
        roles = None
        try:
            roles = await integration.build(env)
            updater = roles.new_updater()
            await roles.manager.start()
            for index in range(config.updates):
                t_wait = loop.time()
                batch = await roles.manager.next_batch()
                t_batch = loop.time()
                history.batches.append(BatchRecord(index, t_batch, batch, history.published_truth_at(t_batch)))
                await asyncio.sleep(config.train_s)
                transfer[0] = config.transfer_s + config.transfer_spread * (2 * rng.random() - 1)
                before = (labels(), roles.manager.weight_version, updater.version)
                t_update = loop.time()
                returned, error = None, None
                weights = trainer_weights(initial, index + 1)
                refused = bool(config.refuse_every) and (index + 1) % config.refuse_every == 0
                if refused:
                    path, body = TRANSFER_FAILURES[config.transport]
                    control.refuse(config.engines - 1, path, 400, body, times=None)
                try:
                    returned = await updater.update(weights, transport=config.transport)
                except Exception as exc:  # the integration's failure is data
                    error = f"{type(exc).__name__}: {exc}"
                t_done = loop.time()
                control.clear_refusals()
                history.cycles.append(UpdateCycle(
                    index=index, cell=0, transport=config.transport, lora=False, pause_mode=mode, t_start=t_update,
                    t_end=t_done, ok=error is None, error=error, counter_before=before[2],
                    counter_after=updater.version, returned=returned, published_before=before[1],
                    published_after=roles.manager.weight_version, labels_before=before[0], labels_after=labels(),
                    trainer_digest=digest_of(weights), digests_after=[
                        {name: blob.digest() for name, blob in e.weights.items()} for e in engines]))
                steps.append(TrainerStep(index, t_wait, t_batch, t_update, t_done, transfer[0]))
                if progress is not None:
                    progress(index + 1, config.updates, t_done)
                if error is not None and not refused:
                    history.breaks.append(Breakage("error", f"update cycle {index} failed: {error}", t_done))
                    break
            else:  # the last step trains on the last update's weights; the run stops after it, outside any cycle
                await asyncio.sleep(config.train_s)
        except Exception as exc:
            history.breaks.append(Breakage("error", f"{type(exc).__name__}: {exc}{_hint(exc)}", loop.time()))
        finally:
            if roles is not None:
                for name, closer in (("Manager.stop()", roles.manager.stop), ("Roles.close()", roles.close)):
                    if closer is None:
                        continue
                    try:
                        await closer()
                    except Exception as exc:
                        history.breaks.append(Breakage("error", f"{name} failed: {type(exc).__name__}: {exc}",
                                                       loop.time()))
            for engine in engines:
                await engine.aclose()
    history.wire = wire.snapshot()
    history.final_labels = labels()
    return ReplayRun(config, integration.name, mode, history, steps, sim_s=loop.time())


def _hint(exc: Exception) -> str:
    """What to do when the integration could not reach the replay's engines at all."""
    if REPLAY_DOMAIN in str(exc):
        return (f" (the replay's engines are reached in process, through httpx async clients only: a blocking client "
                f"such as requests cannot reach *{REPLAY_DOMAIN})")
    return ""


def _host(url: str) -> str:
    return url.split("://", 1)[1].split("/", 1)[0].split(":", 1)[0]
