"""Helpers for the reference integration's unit tests: fake engines reached in process (httpx ASGITransport).

A uniquely named module (not ``conftest``) so the test modules can import it whatever other conftests exist.
"""

from __future__ import annotations

import asyncio
import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Awaitable, Callable, TypeVar

import httpx

from conformance.prompts import PromptSource
from conformance.interface import BuildEnv, Integration, Prompt, Roles, RolloutConfig
from conformance.reference import integration as reference
from fakes.engine import FakeEngine
from fakes.faults import FaultPlan
from fakes.weights import TensorBlob, perturbed, weights_digest

T = TypeVar("T")
STEP_TIMEOUT_S = 10.0
GROUP_TIMEOUT_S = 2.0
"""The engines' collective timeout: a broken broadcast (an engine refused) ends this fast."""


async def within(aw: Awaitable[T], timeout_s: float = STEP_TIMEOUT_S) -> T:
    """Every await in these tests is bounded."""
    return await asyncio.wait_for(aw, timeout_s)


def prompt_source() -> Callable[[], Prompt]:
    """The suite's prompt source with a short text these tests assert on."""
    return PromptSource(0, template="prompt number {i}:")


def trainer_weights(engine: FakeEngine, step: int) -> dict[str, Any]:
    """The trainer's tensors after ``step``: the engine's own weights perturbed (same names/dtypes/shapes)."""
    return {name: blob.to_torch() for name, blob in perturbed(engine.weights, step).items()}


def digest(weights: dict[str, Any]) -> str:
    return weights_digest({name: TensorBlob.from_torch(t) for name, t in weights.items()})


def finish_reasons(engines: list[FakeEngine]) -> list[str]:
    return [e.fields["finish_reason"]["type"] for engine in engines
            for e in engine.events.of_kind("request.finish")]


def control_endpoints(engine: FakeEngine) -> list[str]:
    """The control calls an engine received, queries about the server (its release) left out."""
    return [e.fields["endpoint"] for e in engine.events.of_kind("control")
            if e.fields["endpoint"] not in ("/get_server_info", "/server_info")]


@dataclass
class Rig:
    """N fake engines in real-time mode, and the roles an integration builds over them."""

    tmp_path: Path
    engines: list[FakeEngine] = field(default_factory=list)
    roles: list[Roles] = field(default_factory=list)

    def start_engines(self, n: int = 2, *, profile: str = "0.5.23", tokens_per_second: float = 400.0,
                      faults: dict[int, FaultPlan] | None = None) -> list[FakeEngine]:
        self.engines = [FakeEngine(profile=profile, tokens_per_second=tokens_per_second, enable_lora=True,
                                   engine_id=f"e{i}", group_timeout_s=GROUP_TIMEOUT_S, faults=(faults or {}).get(i))
                        for i in range(n)]
        return self.engines

    @property
    def urls(self) -> list[str]:
        return [f"http://engine{i}" for i in range(len(self.engines))]

    async def build(self, integration: Integration = reference, *, pause_mode: str = "retract",
                    **rollout: Any) -> Roles:
        """Roles of ``integration`` (a ReferenceIntegration or subclass) over the engines, in process."""
        mounts = {url: httpx.ASGITransport(app=e.app) for url, e in zip(self.urls, self.engines)}
        integration = dataclasses.replace(integration, http_mounts=mounts)  # type: ignore[type-var]
        config = RolloutConfig(**{"batch_size": 2, "group_size": 2, "max_new_tokens": 24, **rollout})
        env = BuildEnv(engine_urls=self.urls, workdir=self.tmp_path, rollout=config, prompts=prompt_source(),
                       pause_mode=pause_mode)
        roles = await within(integration.build(env))
        self.roles.append(roles)
        return roles

    async def running_everywhere(self) -> None:
        """Wait until every engine is decoding at least one request (there is something in flight)."""
        await within(asyncio.gather(*(e.wait_until(lambda e=e: bool(e.scheduler.running), STEP_TIMEOUT_S)
                                      for e in self.engines)))

    async def close(self) -> None:
        for roles in self.roles:
            if roles.close is not None:
                await within(roles.close())
        for engine in self.engines:
            await within(engine.aclose())
