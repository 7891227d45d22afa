"""``python -m conformance new-adapter PATH [--sync|--async]``: a commented adapter that runs at once and fails every
case with "implement <method>: …" until its roles are filled in (it never passes)."""

from __future__ import annotations

from pathlib import Path

_HEAD = '''"""weightsync-conformance adapter for <your framework> (written by `python -m conformance new-adapter`).

Every method below raises "implement <method>: ..." until you fill it in, so the suite runs at once and fails
every case with the first thing left to do:

    pytest -m cpu --conformance-integration {module}:integration            # or python -m conformance --integration ...
    python -m conformance --list-cases                                       # the case ids (<invariant>-<scenario>)

Reusable pieces (conformance.reference), so you write only what is yours:
  HttpEngineClient    an async httpx client of one engine with every call the reference makes (or wrap yours)
  ReferenceManager    the rollout manager (fully-async producer, staleness filter at consumption); its engines need
                      only `url` and `generate`; it honours Capabilities.stamps_engines (policy_version when False)
  ReferenceUpdater    the whole update cycle (pause, flush, sessions, transfer, stamp, continue, publish, the failure
                      paths) over any client with the calls it makes (conformance/reference/protocols.py:
                      each step lists what it calls, so you implement only what your cycle uses);
                      subclass it and override one step to run your own (examples/override_one_step.py)
  DiskTransport, TensorTransport, DistributedTransport, LoraTransport: the weight transports
  ReferenceIntegration(client_cls=..., updater_cls=..., manager_cls=...): all of it, with one piece swapped
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any, Mapping

from conformance.interface import Batch, BuildEnv, Capabilities, LoraAdapter, Roles


def todo(what: str, hint: str) -> NotImplementedError:
    return NotImplementedError(f"implement {{what}}: {{hint}}")
'''

_SYNC_ENGINE = '''

class EngineWrapper:
    """Your framework's blocking engine wrapper (one per engine URL), e.g. over `requests`."""

    def __init__(self, base_url: str) -> None:
        self.base_url = base_url

    def generate(self, payload: Mapping[str, Any]) -> dict:
        raise todo("EngineWrapper.generate", "POST {{base_url}}/generate with the native SGLang payload (text, "
                   "sampling_params, rid; lora_path for an adapter) and return the decoded JSON")


class EngineClient:
    """The async client the suite's roles use, over the blocking wrapper: each call in a thread. Give generations
    their own pool (a /generate blocks while the engine is paused; see examples/requests_adapter.py)."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.wrapper = EngineWrapper(url)

    async def generate(self, payload: Mapping[str, Any]) -> Any:
        return await asyncio.to_thread(self.wrapper.generate, payload)
'''

_ASYNC_ENGINE = '''

class EngineClient:
    """Your client for ONE engine (or conformance.reference.HttpEngineClient)."""

    def __init__(self, url: str) -> None:
        self.url = url

    async def generate(self, payload: Mapping[str, Any]) -> Any:
        raise todo("EngineClient.generate", f"POST {{self.url}}/generate with the native SGLang payload (text, "
                   "sampling_params, rid; lora_path for an adapter) and return the decoded JSON")
'''

_ROLES = '''

class Manager:
    """Your rollout manager (or conformance.reference.ReferenceManager(engines, env,
    stamps_engines=CAPABILITIES.stamps_engines))."""

    def __init__(self, engines: list[EngineClient], env: BuildEnv) -> None:
        self.engines, self.env = engines, env

    @property
    def weight_version(self) -> int | None:
        raise todo("Manager.weight_version", "the published version; None before the first update (V3)")

    def set_weight_version(self, version: int) -> None:
        raise todo("Manager.set_weight_version", "store a published version; a lower one must be refused or re-based, "
                   "never stored (V4)")

    async def start(self) -> None:
        raise todo("Manager.start", "start generating groups on the engines (env.prompts() hands out prompts, "
                   "env.rollout says how many and how big)")

    async def next_batch(self) -> Batch:
        raise todo("Manager.next_batch", "the next batch of env.rollout.batch_size groups, after your filters; each "
                   "Turn names the rid of its /generate and the version it was produced under")

    async def stop(self) -> None:
        raise todo("Manager.stop", "stop the producer and wait for its tasks")


class Updater:
    """One trainer cell: its version counter and the whole update cycle on every engine (or
    conformance.reference.ReferenceUpdater over your clients)."""

    def __init__(self, engines: list[EngineClient], manager: Manager, env: BuildEnv) -> None:
        self.engines, self.manager, self.env = engines, manager, env

    @property
    def version(self) -> int:
        raise todo("Updater.version", "the version of the last successful update (0 before any); a failover cell "
                   "continues the published one")

    async def update(self, weights: Mapping[str, Any] | None = None, *, transport: str = "distributed",
                     lora: LoraAdapter | None = None) -> int:
        raise todo("Updater.update", f"one whole cycle on every engine with transport {{transport!r}}: pause "
                   f"({{self.env.pause_mode}}), load, stamp the version, continue, publish to the manager; on failure "
                   "resume the engines and publish nothing")


CAPABILITIES = Capabilities(
    transports=frozenset({{"disk", "tensor", "distributed"}}),  # full-weight transports Updater.update implements
    lora=True,                          # Updater.update(..., lora=LoraAdapter) pushes an adapter
    pause_modes=frozenset({{"retract", "in_place"}}),  # one mode: every scenario in it; empty: never
    failover=True,                      # Roles.new_updater() may build a second trainer cell (failover)
    multi_turn=True,                    # samples of several /generate calls
    staleness_filter=True,              # the Manager enforces env.rollout.max_staleness at consumption
    partial_rollout=False,              # the Manager resumes an aborted call (Turn.continues) instead of recycling
    engine_recovery=False,              # an engine that died is used again only once whole weights are loaded in it
    stamps_engines=True,                # the engines carry your versions (False: Turn.policy_version holds them)
    update_budget_s=None,               # seconds one update may take, retries included (None: the suite's 20 s)
    absent_because={{}},                # why something above is not declared (name -> reason; said in its skips)
)
"""Declare only what you support: a case needing more is skipped with the reason, never passed."""


@dataclass(frozen=True)
class Integration:
    name: str = "my-framework"
    capabilities: Capabilities = field(default_factory=lambda: CAPABILITIES)

    async def build(self, env: BuildEnv) -> Roles:
        engines = [EngineClient(url) for url in env.engine_urls]
        manager = Manager(engines, env)

        async def close() -> None:
            """Release clients, process groups and temp files."""

        return Roles(manager=manager, new_updater=lambda: Updater(engines, manager, env), close=close,
                     engines=list(engines))


integration = Integration()
'''


def adapter_source(module: str, sync: bool) -> str:
    """The adapter's text (``module``: its import name, for the commands it prints)."""
    return (_HEAD + (_SYNC_ENGINE if sync else _ASYNC_ENGINE) + _ROLES).format(module=module)


def write_adapter(path: Path, sync: bool) -> Path:
    """Write the adapter to ``path`` (a ``.py`` file that must not exist yet)."""
    if path.suffix != ".py":
        raise ValueError(f"{path}: the adapter is a Python module; give a path ending in .py")
    if path.exists():
        raise ValueError(f"{path} exists already; choose a new path (nothing was overwritten)")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(adapter_source(path.stem, sync))
    except OSError as exc:
        raise ValueError(f"cannot write {path}: {exc.strerror or exc}") from None
    return path
