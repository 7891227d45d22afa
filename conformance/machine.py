"""Model-based testing at the integration level: random interleavings of trainer actions while rollouts run.

A Hypothesis ``RuleBasedStateMachine`` drives the roles through a :class:`~conformance.scenarios.Run` (full
updates in every transport, LoRA updates, rejected transfers, failover, drains), set up as every scenario is
(``conformance.scenarios.lifecycle``: the same history, with the pause mode asked for); after every step every
check registered for the model-based run judges the history so far and none may fail. A failing example shrinks to a short, readable action sequence.

Hypothesis stateful testing has no native asyncio: the integration runs on one event loop in a background thread
and each rule submits a coroutine to it with a deadline (the zarr ``SyncStoreWrapper`` pattern).
"""

from __future__ import annotations

import asyncio
import tempfile
import threading
from pathlib import Path
from typing import Any, Awaitable, Callable

from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from fakes.facts import SGLANG

from .backends import Backend
from .checks import REGISTRY
from .interface import Integration, RolloutConfig
from .scenarios import Scenario, build_env, new_history, new_run

STEP_TIMEOUT_S = 30.0
ALWAYS_CHECKED = tuple(c.id for c in REGISTRY.values() if c.model_based is None)
"""The checks that judge the model-based run after every step (the others say why they cannot:
``Check.model_based``)."""


async def _no_script(run: object) -> None:
    """The model-based run has no script: its rules drive the run."""


class LoopThread:
    """An event loop in a daemon thread; :meth:`run` executes a coroutine there with a deadline."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name="conformance-machine", daemon=True)
        self._thread.start()

    def run(self, coro: Awaitable[Any], timeout_s: float = STEP_TIMEOUT_S) -> Any:
        return asyncio.run_coroutine_threadsafe(asyncio.wait_for(coro, timeout_s), self.loop).result(timeout_s + 5)

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout=5)
        self.loop.close()


def integration_machine(integration: Integration, backend_factory: Callable[[], Backend],
                        pause_mode: str = "retract", seed: int = 0) -> type[RuleBasedStateMachine]:
    """A state machine class over ``integration`` (run it with ``run_state_machine_as_test`` or ``.TestCase``)."""
    caps = integration.capabilities
    transports = sorted(caps.transports)
    # a rejected update is one the engine answers (400): not over a transport where a load that raises kills the
    # server (``EngineFamily.load_failure_kills`` of ``fakes.facts``, with why)
    rejectable = sorted(caps.transports - set(SGLANG.load_failure_kills))
    rollout = RolloutConfig(batch_size=2, group_size=2, turns=2, max_new_tokens=16, max_in_flight_groups=4,
                            buffer_capacity=8, max_staleness=2 if caps.staleness_filter else None)
    scenario = Scenario("model-based", "random trainer actions", _no_script, (), transport=tuple(transports),
                        pause_mode=pause_mode, rollout=rollout).resolve(integration)

    class IntegrationMachine(RuleBasedStateMachine):
        def __init__(self) -> None:
            super().__init__()
            self.loop = LoopThread()
            self.backend = backend_factory()
            self.backend.start()
            self.tmp = tempfile.TemporaryDirectory(prefix="conformance-machine-")
            self.history = new_history(scenario, integration, self.backend, seed)
            env = build_env(scenario, self.backend, Path(self.tmp.name), self.history)
            roles = self.loop.run(integration.build(env))
            self.run = new_run(scenario, integration, self.backend, roles, self.history, seed)
            self.loop.run(self.run.start())

        @rule(transport=st.sampled_from(transports))
        def full_update(self, transport: str) -> None:
            self.loop.run(self.run.update(transport))

        @precondition(lambda self: caps.lora)
        @rule()
        def lora_update(self) -> None:
            self.loop.run(self.run.update(lora=True))

        @precondition(lambda self: bool(rejectable))
        @rule(transport=st.sampled_from(rejectable or ["distributed"]))
        def rejected_update(self, transport: str) -> None:
            self.loop.run(self.run.update(transport, poison=True))

        @precondition(lambda self: "disk" in caps.transports)
        @rule()
        def update_refused_by_one_engine(self) -> None:
            self.loop.run(self.run.update("disk", refuse=[len(self.backend.urls) - 1]))

        @precondition(lambda self: caps.failover)
        @rule()
        def failover(self) -> None:
            self.loop.run(self.run.failover())

        @rule()
        def drain(self) -> None:
            self.loop.run(self.run.drain(1))

        @invariant()
        def no_checker_fails(self) -> None:
            self.history.wire = self.backend.wire.snapshot()
            failed = [REGISTRY[c].run(self.history) for c in ALWAYS_CHECKED]
            failed = [v for v in failed if v.status == "fail"]
            assert not failed, "\n".join(v.explain() for v in failed)

        def teardown(self) -> None:
            try:
                roles = self.run.roles
                self.loop.run(roles.manager.stop())
                if roles.close is not None:
                    self.loop.run(roles.close())
            finally:
                self.backend.stop()
                self.loop.close()
                self.tmp.cleanup()

    IntegrationMachine.__name__ = f"IntegrationMachine[{integration.name}]"
    return IntegrationMachine
