"""A scenario: a named workload and trainer script, what it needs of an integration, the situations it builds (and so
the checks it is judged by). Checked where it is defined: situations known, needs typed, transports and pause mode
known."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Awaitable, Callable

from ..backends import Backend
from ..breaks import Unsupported
from ..checks import REGISTRY
from ..interface import ALL_PAUSE_MODES, ALL_TRANSPORTS, Integration, RolloutConfig
from ..prompts import TEMPLATE
from ..situations.registry import SITUATIONS, unknown_situations
from .capabilities import Needs, pause_mode_for, skip_reasons, transport_for
from .run import Run

Script = Callable[[Run], Awaitable[None]]
DEFAULT_ROLLOUT = RolloutConfig(batch_size=2, group_size=2, turns=2, max_new_tokens=16, max_in_flight_groups=3,
                                buffer_capacity=4)
"""Two-turn samples, two groups of two per batch, a small buffer: what most scenarios run."""


@dataclass(frozen=True)
class Scenario:
    """A named workload + trainer script, the capabilities it needs and the situations it builds."""

    name: str
    doc: str
    script: Script
    builds: tuple[str, ...]
    """The situations its script builds besides an update cycle and consumed batches
    (``conformance.situations.registry``); those its fields say (a full update, an adapter load, a pause in place, a disk load) are added."""
    transport: tuple[str, ...] = ("tensor", "disk", "distributed")
    """Transports the scenario's full updates may use, preferred first; the first the integration has is used."""
    pause_mode: str = "retract"
    rollout: RolloutConfig = DEFAULT_ROLLOUT
    needs: Needs = Needs()
    full_updates: bool = True
    """False when the scenario only pushes LoRA adapters (no full-weight transport needed)."""
    long: bool = False
    """It runs several times longer than most (many batches drained): where scenarios run ahead it is started first,
    so that it does not finish last."""
    needs_pause: bool = False
    """Its situation exists only for an integration that pauses (answers reaching it while its engines are paused):
    one that never pauses skips it, saying so."""
    prompt_template: str = TEMPLATE
    """The integration's prompts (:class:`~conformance.prompts.PromptSource`'s template)."""
    turn_s: Callable[[Backend], float] | None = None
    """How long the integration's turns decode at least on a backend (None:
    :data:`~conformance.situations.timing.TURN_S`)."""

    def __post_init__(self) -> None:
        if isinstance(self.builds, str):
            raise TypeError(f"scenario {self.name!r}: builds must be a tuple of situation names, got {self.builds!r}")
        unknown = unknown_situations(self.builds)
        if unknown:
            raise ValueError(f"scenario {self.name!r}: unknown situation(s) {unknown}; known: {list(SITUATIONS)}")
        if not isinstance(self.needs, Needs):
            raise TypeError(f"scenario {self.name!r}: needs must be a Needs(...) ({Needs.names()}), "
                            f"got {self.needs!r}")
        if set(self.transport) - ALL_TRANSPORTS or self.pause_mode not in ALL_PAUSE_MODES:
            raise ValueError(f"scenario {self.name!r}: transports {list(self.transport)} / pause mode "
                             f"{self.pause_mode!r} not among {sorted(ALL_TRANSPORTS)} / {sorted(ALL_PAUSE_MODES)}")

    @property
    def situations(self) -> frozenset[str]:
        """Every situation its run builds: ``builds``, an update cycle, consumed batches, and what its fields say."""
        derived = {"full-update": self.full_updates, "lora": self.needs.lora, "in-place": self.pause_mode == "in_place",
                   "disk": self.transport == ("disk",)}
        return frozenset({"cycle", "consumed", *self.builds, *(n for n, on in derived.items() if on)})

    @property
    def checks(self) -> tuple[str, ...]:
        """The checks it is judged by, in the registry's order: every one whose needs it builds."""
        return tuple(c.id for c in REGISTRY.values() if c.needs <= self.situations)

    def transport_for(self, integration: Integration) -> str | None:
        """The transport this scenario uses with ``integration`` (None when it has none of them)."""
        return transport_for(self.transport, integration.capabilities)

    def resolve(self, integration: Integration) -> Scenario:
        """This scenario as it runs against ``integration`` (its pause mode: ``capabilities.pause_mode_for``;
        single-turn samples without ``multi_turn``, unless the scenario needs several turns); raises
        :class:`Unsupported` with the reason."""
        caps = integration.capabilities
        if self.full_updates and self.transport_for(integration) is None:
            raise Unsupported(f"integration supports none of the transports this scenario needs "
                              f"{list(self.transport)} (declares {sorted(caps.transports)})"
                              + "".join(caps.because(t) for t in self.transport))
        if self.needs_pause and not caps.pause_modes:
            raise Unsupported("the integration never pauses (declares no pause mode): this scenario's situation, "
                              "answers reaching it while its engines are paused, cannot arise")
        mode = pause_mode_for(self.pause_mode, caps)
        reason = self.needs.missing(caps)
        if reason:
            raise Unsupported(reason)
        turns = self.rollout.turns if caps.multi_turn else 1
        return replace(self, pause_mode=mode, rollout=replace(self.rollout, turns=turns))

    def skipped_checks(self, integration: Integration, profile: str) -> dict[str, str]:
        """Checks of this scenario that cannot apply to ``integration`` on SGLang ``profile``, with the reason; and
        those whose situation needs the scenario's own pause mode where the integration runs it in another."""
        skipped = skip_reasons(self.checks, integration.capabilities, profile)
        resolved = self.resolve(integration)
        for check in set(self.checks) - set(resolved.checks) - set(skipped):
            skipped[check] = (f"the integration runs this scenario in its only pause mode, {resolved.pause_mode} "
                              f"(declares {sorted(integration.capabilities.pause_modes)}), and {check} needs a pause "
                              f"in {self.pause_mode}")
        return skipped
