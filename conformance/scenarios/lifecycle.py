"""A scenario's lifecycle: set up (its history, the build environment, the roles, the run), drive its script within
its deadline, tear down (the manager stopped, the roles closed), and the history filled in. The set-up is shared
with the model-based run (``conformance.machine``), so both record the same history."""

from __future__ import annotations

import math
import tempfile
from dataclasses import replace
from pathlib import Path

from ..backends import Backend, probe_labels
from ..fswatch import DirectoryWatch
from ..history import Breakage, History, held_weights
from ..interface import BuildEnv, Integration, Roles
from ..prompts import PromptSource
from .definition import Scenario
from ..breaks import RunBroken, ScenarioTimeout, Unsupported, bounded, open_calls
from ..situations.registry import SITUATIONS
from ..situations.timing import DEADLINES, TURN_S, Deadlines, decode_rate
from .run import Run
from .trainer import Trainer


def for_backend(scenario: Scenario, backend: Backend) -> Scenario:
    """``scenario`` with turns long enough on ``backend`` that a request of the integration seen in flight when a
    cycle starts is still decoding when the cycle reaches its engine (:data:`~conformance.situations.timing.TURN_S`
    of decoding at the backend's measured speed, at least the scenario's own ``max_new_tokens``); raises
    :class:`Unsupported` where the backend cannot build a situation the scenario builds."""
    why_not = next((why for name in sorted(scenario.builds) if (why := SITUATIONS[name].why_not(backend))), None)
    if why_not:
        raise Unsupported(why_not)
    tokens = math.ceil((scenario.turn_s(backend) if scenario.turn_s else TURN_S) * decode_rate(backend))
    if tokens <= scenario.rollout.max_new_tokens:
        return scenario
    return replace(scenario, rollout=replace(scenario.rollout, max_new_tokens=tokens))


def new_history(scenario: Scenario, integration: Integration, backend: Backend, seed: int) -> History:
    """The empty history of ``scenario`` (resolved) run against ``integration``: with the pause mode the
    integration was asked for (None when it never pauses) and whether it stamps the engines, so I3 and S2 judge
    it as configured."""
    caps = integration.capabilities
    return History(scenario.name, integration.name, backend.name, backend.profile, seed,
                   max_staleness=scenario.rollout.max_staleness,
                   pause_mode=scenario.pause_mode if caps.pause_modes else None, stamps_engines=caps.stamps_engines,
                   served_model=getattr(backend, "served_model", None))


def build_env(scenario: Scenario, backend: Backend, folder: Path, history: History) -> BuildEnv:
    """What ``Integration.build`` gets: the engines' URLs, a checkpoint directory (created) under ``folder``, the
    workload, the prompts (each handed out recorded in ``history``), the pause mode and the seed."""
    prompts = PromptSource(history.seed, scenario.prompt_template, book=history.prompts)
    env = BuildEnv(list(backend.urls), folder, scenario.rollout, prompts, scenario.pause_mode, history.seed)
    env.checkpoint_dir.mkdir()
    return env


def new_run(scenario: Scenario, integration: Integration, backend: Backend, roles: Roles, history: History,
            seed: int, deadlines: Deadlines = DEADLINES) -> Run:
    """The run a script drives over built ``roles``."""
    return Run(backend, roles, history, Trainer(backend.initial_weights(), seed), roles.new_updater(),
               rollout=scenario.rollout, pause_mode=scenario.pause_mode,
               transport=scenario.transport_for(integration) or "tensor", deadlines=deadlines,
               update_budget_s=integration.capabilities.update_budget_s)


async def run_scenario(scenario: Scenario, integration: Integration, backend: Backend, seed: int = 0,
                       deadlines: Deadlines = DEADLINES) -> History:
    """Run ``scenario`` against ``integration`` on a started ``backend``; never raises for integration bugs."""
    scenario = for_backend(scenario.resolve(integration), backend)
    history = new_history(scenario, integration, backend, seed)
    t0 = backend.wire.clock()
    with tempfile.TemporaryDirectory(prefix=f"conformance-{scenario.name}-") as tmp:
        env = build_env(scenario, backend, Path(tmp), history)
        watch = DirectoryWatch(env.checkpoint_dir).start()
        unsync = backend.wire.sync_with(watch.sync)  # a checkpoint's change is stamped before the answers after it
        roles: Roles | None = None
        try:
            roles = await bounded(integration.build(env), deadlines.wait_s, "Integration.build()", backend.wire)
            run = new_run(scenario, integration, backend, roles, history, seed, deadlines)
            await bounded(scenario.script(run), deadlines.script_s, f"scenario {scenario.name}", backend.wire,
                          ScenarioTimeout)
        except RunBroken as exc:
            history.breaks.append(exc.breakage(backend.wire))
        except Exception as exc:
            history.breaks.append(Breakage("error", f"{type(exc).__name__}: {exc}", backend.wire.clock(),
                                           open_calls(backend.wire)))
        finally:
            history.t_teardown = backend.wire.clock()
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
                                                       backend.wire.clock(), open_calls(backend.wire)))
            unsync()
            history.fs = watch.stop()
    history.wire = backend.wire.frozen()
    history.final_labels = await probe_labels(list(backend.urls), dialect=backend.dialect)
    history.engine_truth = backend.truth()
    history.held_weights = held_weights(history.engine_truth, backend.dialect.rid)
    history.rebase(t0)
    return history
