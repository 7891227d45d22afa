"""Your own update cycle, with the reference rollout manager standing in for yours.

For a framework whose rollout manager needs Ray or GPUs: the suite runs on CPU, so the reference manager
(``ReferenceManager``; it needs only each engine's ``url`` and ``generate``) plays the rollout manager, and your
framework's own weight-sync code is the :class:`~conformance.interface.Updater`. The contract between the two is one
call: after a successful cycle, publish the new version with ``manager.set_weight_version(new)`` (and never after a
failed one). Here the "framework code" is a blocking cycle over the ``requests`` wrapper of
``examples/requests_adapter.py``: pause, flush, load a checkpoint from disk, bump the version, continue.

    pytest -m cpu --conformance-integration examples.own_cycle_reference_manager:integration
"""

from __future__ import annotations

import asyncio
import uuid
from dataclasses import dataclass, field
from typing import Any, Mapping

from conformance.interface import BuildEnv, Capabilities, LoraAdapter, Roles
from conformance.reference import ReferenceManager, write_checkpoint_atomic
from examples.requests_adapter import SGLangEngine, ThreadedEngineClient


def framework_update_cycle(engines: list[SGLangEngine], checkpoint: str, version: str, pause_mode: str) -> None:
    """Stands for the framework's own (blocking) weight sync: every engine paused, loaded, relabelled, continued.
    When a step fails the error is re-raised, and an engine that was sent the checkpoint stays paused (it may hold
    part of it, or a version nobody publishes: P8) until a cycle loads whole weights into it; the others are
    continued (I6)."""
    paused: list[SGLangEngine] = []
    sent: list[SGLangEngine] = []
    done = False
    try:
        for engine in engines:
            engine.pause_generation(pause_mode)
            paused.append(engine)
        if pause_mode != "in_place":  # in_place keeps requests resident: SGLang refuses a flush then
            for engine in engines:
                engine.flush_cache()
        for engine in engines:
            sent.append(engine)
            engine.update_weights_from_disk(checkpoint)
        for engine in engines:
            engine.update_weight_version(version)
        done = True
    finally:
        for engine in paused:
            if done or engine not in sent:
                engine.continue_generation()


class OwnCycleUpdater:
    """The Updater: the framework's cycle, then the publish the reference manager needs."""

    def __init__(self, engines: list[SGLangEngine], manager: ReferenceManager, env: BuildEnv) -> None:
        self.engines, self.manager, self.env = engines, manager, env
        self._version = manager.weight_version or 0  # a failover cell continues the published version

    @property
    def version(self) -> int:
        return self._version

    async def update(self, weights: Mapping[str, Any] | None = None, *, transport: str = "disk",
                     lora: LoraAdapter | None = None) -> int:
        assert weights is not None and transport == "disk" and lora is None  # what the capabilities declare
        new = self._version + 1
        path = await asyncio.to_thread(write_checkpoint_atomic, self.env.checkpoint_dir,
                                       f"step-{new}-{uuid.uuid4().hex[:8]}", weights, {})
        await asyncio.to_thread(framework_update_cycle, self.engines, str(path), str(new), self.env.pause_mode)
        self._version = new
        self.manager.set_weight_version(new)  # the one call between your cycle and the reference manager
        return new


@dataclass(frozen=True)
class OwnCycleIntegration:
    name: str = "own-cycle+reference-manager"
    capabilities: Capabilities = field(default_factory=lambda: Capabilities(transports=frozenset({"disk"}),
                                                                            lora=False))

    async def build(self, env: BuildEnv) -> Roles:
        wrappers = [SGLangEngine(url) for url in env.engine_urls]
        clients = [ThreadedEngineClient(w) for w in wrappers]
        manager = ReferenceManager(clients, env, stamps_engines=self.capabilities.stamps_engines)

        async def close() -> None:
            await manager.stop()
            for client in clients:
                client.close()

        return Roles(manager=manager, new_updater=lambda: OwnCycleUpdater(wrappers, manager, env), close=close,
                     engines=list(clients))


integration = OwnCycleIntegration()
