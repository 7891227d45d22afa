"""The interface an integration under test provides (README "Test your own integration").

Two roles, mirroring how every async-RL framework splits weight sync (how it talks to each SGLang engine is its
own business: the suite reads what it did from the wire; the reference integration's client protocols are in
``conformance.reference.protocols``):

* :class:`Updater` — the trainer side of one trainer cell: owns the version counter and runs a whole update
  cycle across all engines, then publishes the version to the manager. A failover cell is a second Updater
  over the same engines and manager.
* :class:`Manager` — the rollout manager: keeps groups in flight on the engines and hands out batches after
  its filters (aborted groups, staleness bound, group size).

An adapter is an :class:`Integration`: it declares :class:`Capabilities` and builds the roles for a set of
engine URLs. Everything is ``async``; an adapter over a synchronous (``requests``) wrapper runs the blocking
calls with ``asyncio.to_thread`` (see ``examples/``).

The records a manager hands out (:class:`Batch` → :class:`Group` → :class:`Sample` → :class:`Turn`) are what
the checkers read: every turn names the ``rid`` of the ``/generate`` call it came from, so the suite can join
it with what the engine actually answered on the wire.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Awaitable, Callable, Literal, Mapping, Protocol, Sequence, runtime_checkable

from fakes.facts import FAMILIES

PauseMode = Literal["abort", "retract", "in_place"]
Transport = Literal["disk", "tensor", "distributed"]

ALL_TRANSPORTS: frozenset[str] = frozenset({"disk", "tensor", "distributed"})
ALL_PAUSE_MODES: frozenset[str] = frozenset({"abort", "retract", "in_place"})

KEEPALIVE_EXPIRY_S = 0.4 * min(family.keep_alive_s for family in FAMILIES.values())
"""How long a pooled connection to an engine may sit idle before the client drops it: two fifths (2 s) of the engines'
own idle limit (``EngineFamily.keep_alive_s`` of ``fakes.facts``: SGLang's ``SGLANG_TIMEOUT_KEEP_ALIVE``, 5 s, in
every release of its table). With equal limits (httpx's default is also 5 s) a request sent on a connection the
server closes at that moment is lost (``ReadError``, no answer): seen once in the real-SGLang CI stage, a
``/generate`` of ``steady-tensor-retract`` on SGLang's default release."""


@dataclass(frozen=True)
class Capabilities:
    """What an integration supports. A test needing more is skipped with the reason, never passed.

    Every capability has a documented default; an adapter overrides only what differs.
    """

    transports: frozenset[str] = ALL_TRANSPORTS
    """Full-weight transports the Updater implements (``disk``, ``tensor``, ``distributed``)."""
    lora: bool = True
    """The Updater can push a LoRA adapter (``Updater.update(..., lora=...)``)."""
    pause_modes: frozenset[str] = frozenset({"retract", "in_place"})
    """Pause modes the Updater can run a cycle under (fully-async integrations reject ``abort``, I3). An integration
    with one mode runs every scenario in it: keep-only (vLLM's ``keep&clear_cache=false``: ``{"in_place"}``; a bare ``keep``, which clears the caches and
    preempts: ``{"retract"}``) passes where it is right,
    an abort-only one runs and fails I2/I3 with its cost measured; a check that needs the other mode skips, saying
    so. With several, a scenario asking for a mode the integration lacks is skipped. An empty set declares an
    integration that never pauses (I6 and C2 are then skipped with that reason)."""
    failover: bool = True
    """``Roles.new_updater()`` may be called again to fail over to a fresh trainer cell."""
    multi_turn: bool = True
    """The Manager can run multi-turn samples (several ``/generate`` calls per sample)."""
    staleness_filter: bool = True
    """The Manager enforces ``RolloutConfig.max_staleness`` at consumption."""
    partial_rollout: bool = False
    """The Manager resumes an aborted call instead of dropping or recycling its group (partial rollout): the call
    that continues it names it in ``Turn.continues`` and the group's oldest version counts the tokens generated
    before the abort."""
    engine_recovery: bool = False
    """The Manager survives an engine that dies under its requests and comes back on its address (a crashed server
    relaunched): it drops or recycles what the engine lost, and routes requests to it again only once an update
    loaded whole weights into it (P9)."""
    stamps_engines: bool = True
    """The Updater labels the engines with its version (``/update_weight_version``, or ``weight_version`` in the
    transfer bodies) and the Manager reads each turn's version from SGLang's ``meta_info``. False: versions live on
    the client side (a turn is as old as the version published when its ``/generate`` was sent); S2/S3 then judge
    the Manager's records against that truth, computed from the cycle timeline, and V1 still fails, plainly, on
    engines that were never stamped."""
    update_budget_s: float | None = None
    """How long one ``Updater.update()`` may take, retries included (a refusal retried for a minute before raising
    is a design, not a hang). None: the suite's deadline, ``Deadlines.update_s`` (20 s, times
    ``WEIGHTSYNC_DEADLINE_SCALE``); a larger budget extends the update deadline and each scenario's (room for two
    cycles at the budget) and the case's timeout. An update past it is a hang, and the witness names the budget."""
    absent_because: Mapping[str, str] = field(default_factory=dict, hash=False, compare=False)
    """Why a transport or capability is not declared (name → reason, e.g. the extra to install): said in the
    reason of every case skipped for it."""

    def because(self, name: str) -> str:
        """``": <reason>"`` when :attr:`absent_because` names ``name``, else ``""``."""
        reason = self.absent_because.get(name)
        return f": {reason}" if reason else ""

    def __post_init__(self) -> None:
        if self.update_budget_s is not None and not self.update_budget_s > 0:
            raise ValueError(f"Capabilities: update_budget_s must be a positive number of seconds or None, got "
                             f"{self.update_budget_s!r}")
        unknown = (set(self.transports) - ALL_TRANSPORTS) | (set(self.pause_modes) - ALL_PAUSE_MODES)
        if unknown:
            raise ValueError(f"Capabilities: unknown transport/pause mode {sorted(unknown)}; "
                             f"transports are {sorted(ALL_TRANSPORTS)}, pause modes {sorted(ALL_PAUSE_MODES)}")

    def missing(self, *, transport: str | None = None, pause_mode: str | None = None, lora: bool = False,
                failover: bool = False, multi_turn: bool = False, staleness_filter: bool = False,
                partial_rollout: bool = False, engine_recovery: bool = False) -> str | None:
        """The reason a test needing these cannot run, or None when everything is supported."""
        if transport is not None and transport not in self.transports:
            return (f"integration does not support transport {transport!r} (declares {sorted(self.transports)})"
                    f"{self.because(transport)}")
        if pause_mode is not None and pause_mode not in self.pause_modes:
            return f"integration does not support pause mode {pause_mode!r} (declares {sorted(self.pause_modes)})"
        for name, needed in (("lora", lora), ("failover", failover), ("multi_turn", multi_turn),
                             ("staleness_filter", staleness_filter), ("partial_rollout", partial_rollout),
                             ("engine_recovery", engine_recovery)):
            if needed and not getattr(self, name):
                return f"integration does not declare capability {name!r}{self.because(name)}"
        return None


@dataclass(frozen=True)
class RolloutConfig:
    """The workload a scenario asks the Manager to run."""

    batch_size: int = 4
    """Groups per batch handed to training."""
    group_size: int = 2
    """Samples per group (``n_samples_per_prompt``)."""
    turns: int = 1
    """``/generate`` calls per sample (multi-turn when > 1)."""
    max_new_tokens: int = 32
    """Per turn."""
    max_staleness: int | None = None
    """Bound on ``current - oldest`` at consumption; None disables the filter."""
    max_in_flight_groups: int = 8
    """Producer cap on concurrently generating groups."""
    buffer_capacity: int = 16
    """Finished groups waiting for consumption; the producer blocks when full."""


@dataclass(frozen=True)
class Prompt:
    """One prompt handed out by the data source; ``index`` orders samples in a batch."""

    index: int
    text: str


@dataclass(frozen=True)
class LoraAdapter:
    """A LoRA adapter to push: its name, PEFT config and tensors (``torch.Tensor`` by name)."""

    name: str
    config: Mapping[str, Any]
    tensors: Mapping[str, Any]


@dataclass(frozen=True)
class BuildEnv:
    """What the suite gives an integration to build its roles from."""

    engine_urls: Sequence[str]
    workdir: Path
    """Scratch space owned by the integration (e.g. ``workdir / "checkpoints"`` for disk updates)."""
    rollout: RolloutConfig
    prompts: Callable[[], Prompt]
    """The data source: each call returns the next prompt (thread-safe)."""
    pause_mode: str = "retract"
    """Pause mode the Updater must use for its cycles."""
    seed: int = 0

    @property
    def checkpoint_dir(self) -> Path:
        """Where disk updates write checkpoints (``workdir / "checkpoints"``, created by the suite and watched)."""
        return self.workdir / "checkpoints"


@dataclass
class Turn:
    """One ``/generate`` call of a sample, as the integration recorded it."""

    rid: str
    """``meta_info.id`` of the response (the suite joins it with the wire record). On vLLM: the ``request_id`` the
    integration put in the request's body (``/inference/v1/generate``, ``/v1/completions``), the id the dialect
    records (:mod:`conformance.dialect`)."""
    weight_version: str | None
    """The engine's label for this turn as SGLang reported it (``meta_info.weight_version``), or None."""
    finish_reason: str
    """``finish_reason.type``: ``length``, ``stop`` or ``abort``."""
    completion_tokens: int
    weight_versions: list[str] | None = None
    """Per-token span versions when the engine reports them (SGLang fact ``weight_versions_spans``), oldest first."""
    policy_version: int | None = None
    """The framework's own version for this turn (client-side versioning, ``Capabilities.stamps_engines=False``);
    None when it relies on the engine's label."""
    continues: list[str] = field(default_factory=list)
    """The rids of earlier calls of this sample that were aborted and whose prompt and partial output this call
    resumed (partial rollout). Their tokens are part of the turn: the aborted requests cost a recompute, not a
    lost sample."""


@dataclass
class Sample:
    """One trajectory: a prompt and its turns."""

    index: int
    turns: list[Turn]
    aborted: bool = False
    """The integration's own view: True when any turn ended in abort."""


@dataclass
class Group:
    """``group_size`` samples of one prompt; ``oldest_version`` is the integration's own computation."""

    prompt_index: int
    samples: list[Sample]
    oldest_version: int | None
    staleness: int | None
    """``current - oldest`` at consumption as the integration computed it; None when either is None."""


@dataclass
class Batch:
    """What the Manager hands to training."""

    groups: list[Group]
    weight_version: int | None
    """The Manager's current (published) version at consumption."""
    metrics: dict[str, float] = field(default_factory=dict)
    """Per-batch metrics; staleness metrics are named ``*staleness*``."""


@runtime_checkable
class Updater(Protocol):
    """The trainer side of one trainer cell."""

    @property
    def version(self) -> int:
        """The cell's counter: the version of the last successful update (0 before any)."""

    async def update(self, weights: Mapping[str, Any] | None = None, *, transport: str = "distributed",
                     lora: LoraAdapter | None = None) -> int:
        """Run one whole update cycle on every engine and publish the new version to the Manager.

        ``weights`` are full model tensors (``torch.Tensor`` by HF parameter name); with ``lora`` only the
        adapter is pushed. Returns the new version. Raises on any failure, leaving the published version unchanged
        (V2, P5) and every engine resumed (I6), except one the failed cycle sent full weights to: it may hold part of
        them, so it is either given published weights back or kept paused until an update loads whole weights (P8).
        """


@runtime_checkable
class Manager(Protocol):
    """The rollout manager."""

    @property
    def weight_version(self) -> int | None:
        """The published version; None before the first update (V3)."""

    def set_weight_version(self, version: int) -> None:
        """Receive a published version. A regression must be re-based or raise, never stored (V4)."""

    async def start(self) -> None:
        """Start the producer (groups generating on the engines)."""

    async def next_batch(self) -> Batch:
        """The next batch after the filters, sorted by sample index."""

    async def stop(self) -> None:
        """Stop the producer and wait for its tasks (abort nothing that training will read)."""


@dataclass(kw_only=True)
class Roles:
    """The built integration."""

    manager: Manager
    new_updater: Callable[[], Updater]
    """Each call builds a fresh trainer cell over the same engines and manager (failover)."""
    close: Callable[[], Awaitable[None]] | None = None
    """Release clients, groups and temp files."""
    engines: list[Any] = field(default_factory=list)
    """The integration's engine clients, for the adapter's own use and for debugging; optional: the suite reads
    what the engines did from the wire, never through these (the reference's client protocols:
    ``conformance.reference.protocols``)."""


@runtime_checkable
class Integration(Protocol):
    """What an adapter module exposes (``--integration module:attr``)."""

    name: str
    capabilities: Capabilities

    async def build(self, env: BuildEnv) -> Roles:
        """Build the roles over ``env.engine_urls``."""
