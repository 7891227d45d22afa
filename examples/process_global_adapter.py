"""An adapter over a framework with process-global state, run with ``--conformance-isolate-scenarios`` (``python -m conformance --isolate-scenarios``).

Some frameworks set up global state once per process (a module-level engine registry, a global process group, a
singleton client pool) and cannot build a second rollout stack beside the first. The suite builds the roles once
per scenario, so such an adapter needs each scenario in its own process:

    pytest -m cpu --conformance-integration examples.process_global_adapter:integration --conformance-isolate-scenarios

This adapter is the reference integration behind such a once-per-process guard.
"""

from __future__ import annotations

from dataclasses import dataclass

from conformance.interface import BuildEnv, Roles
from conformance.reference import ReferenceIntegration

_REGISTRY: list[str] = []
"""The framework's global registry: one rollout stack per process."""


@dataclass(frozen=True, eq=False)
class OncePerProcessIntegration(ReferenceIntegration):
    async def build(self, env: BuildEnv) -> Roles:
        if _REGISTRY:
            raise RuntimeError(f"the framework's global engine registry is already initialised in this process "
                               f"(for {_REGISTRY[0]}); run each scenario in its own process (--conformance-isolate-scenarios)")
        _REGISTRY.append(str(env.workdir))
        return await super().build(env)


integration = OncePerProcessIntegration(name="process-global")
