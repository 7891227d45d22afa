"""Capability resolution: what a scenario needs of an integration, and what it becomes against one (its transport,
its pause mode, single-turn samples) or why it cannot run (skipped with the reason)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import Iterable, Sequence

from ..checks import REGISTRY
from ..checks.effective import pause_modes_shown, pause_takes_mode
from ..history import LORA_LOAD_PATHS, History
from ..interface import Capabilities
from ..breaks import Unsupported


@dataclass(frozen=True)
class Needs:
    """Capabilities a scenario needs besides a transport and a pause mode; a misspelt one is a ``TypeError`` where
    the scenario is defined. Each field names a ``Capabilities`` flag (``tests/test_scenarios.py`` holds them
    together)."""

    lora: bool = False
    failover: bool = False
    multi_turn: bool = False
    staleness_filter: bool = False
    partial_rollout: bool = False
    engine_recovery: bool = False

    def missing(self, caps: Capabilities) -> str | None:
        """Why an integration with ``caps`` cannot run a scenario that needs these, or None."""
        return caps.missing(**asdict(self))

    @classmethod
    def names(cls) -> list[str]:
        return [f.name for f in fields(cls)]


def transport_for(preferred: Sequence[str], caps: Capabilities) -> str | None:
    """The first of ``preferred`` the integration has (None when it has none of them)."""
    return next((t for t in preferred if t in caps.transports), None)


def pause_mode_for(mode: str, caps: Capabilities) -> str:
    """The pause mode a scenario asking for ``mode`` runs in: an integration with one pause mode runs every scenario
    in it (keep-only vLLM frameworks in ``in_place``, or ``retract`` for a bare ``keep``; an abort-only one in ``abort``, failing I2/I3 with the cost
    measured), and the checks that need the other mode skip, saying so (:meth:`Scenario.skipped_checks`); one that
    never pauses runs in ``mode``, which it ignores; otherwise a mode it lacks raises :class:`Unsupported`."""
    if len(caps.pause_modes) == 1:
        return next(iter(caps.pause_modes))
    if caps.pause_modes and mode not in caps.pause_modes:
        raise Unsupported(f"integration does not support pause mode {mode!r} (declares {sorted(caps.pause_modes)})")
    return mode


def skip_reasons(checks: Iterable[str], caps: Capabilities, profile: str) -> dict[str, str]:
    """Checks among ``checks`` that cannot apply to an integration with ``caps`` on SGLang ``profile``, with the
    reason: those about pausing (registered ``needs_pause``) for one that never pauses, or on a release whose
    every pause aborts; those about requests resident across a pause (``needs_residency``) for one whose pauses
    abort."""
    if not caps.pause_modes:
        reason = "the integration never pauses (declares no pause mode)"
    elif not pause_takes_mode(profile):
        reason = (f"SGLang {profile} has no pause modes (every pause aborts), so a fully-async integration does "
                  f"not pause there; I1-I2 judges what its cycles do to the requests in flight")
    elif caps.pause_modes == {"abort"}:
        return _no_residency(checks, "the integration's pauses take effect in abort mode")
    else:
        return {}
    return {c: reason for c in checks if REGISTRY[c].needs_pause}


def skips_shown(checks: Iterable[str], h: History) -> dict[str, str]:
    """Checks among ``checks`` that the run's wire shows cannot apply, with the reason: those about pausing
    (``needs_pause``) in a run of LoRA cycles only that sent no pause (an adapter load needs none); those about
    requests resident across a pause (``needs_residency``) when every pause the engines accepted took effect in abort
    mode, whatever the integration declared."""
    if h.cycles and all(c.lora for c in h.cycles) and next(h.integration_calls("/pause_generation"), None) is None:
        return {c: f"the integration does not pause for adapter loads (its {len(h.cycles)} LoRA cycle(s) sent no "
                   "pause), so there is no pause to judge" for c in checks if REGISTRY[c].needs_pause}
    if pause_modes_shown(h) == {"abort"}:
        return _no_residency(checks, "every pause the engines accepted took effect in abort mode (as SGLang read "
                                     "its body off the wire)")
    return {}


@dataclass(frozen=True)
class Undeclared:
    """A capability a run's history shows although the integration does not declare it: the scenarios that need
    it were skipped for an integration that has it."""

    capability: str
    """A ``Capabilities`` flag."""
    evidence: str
    """What the history shows, with a witness."""


def undeclared_shown(h: History, caps: Capabilities) -> list[Undeclared]:
    """The capabilities ``h`` shows that ``caps`` does not declare: turns that resume aborted calls
    (``Turn.continues``, partial rollout) and adapter loads (LoRA)."""
    found = []
    if not caps.partial_rollout:
        resumed = [t for b in h.batches for g in b.batch.groups for s in g.samples for t in s.turns if t.continues]
        if resumed:
            found.append(Undeclared("partial_rollout", f"{len(resumed)} consumed turn(s) resumed aborted calls "
                                    f"(Turn.continues), e.g. {resumed[0].rid} continues {resumed[0].continues}"))
    if not caps.lora:
        loads = [c for c in h.integration_calls() if c.path in LORA_LOAD_PATHS]
        if loads:
            found.append(Undeclared("lora", f"{len(loads)} adapter load(s) on the wire, e.g. {loads[0].path} on "
                                    f"engine {loads[0].engine} at t={loads[0].t_start:.2f}s"))
    return found


def _no_residency(checks: Iterable[str], why: str) -> dict[str, str]:
    return {c: f"{why}, so no request is resident across them (I3 reports the mode)" for c in checks
            if REGISTRY[c].needs_residency}
