"""Every check, registered once: its id, title, what must hold, what it reads, the situations it needs.

The scenarios' check lists, the mutants' ``kills``, the model-based run, the README's invariant table
(``tests/test_check_registry.py`` holds it against this) and the report all read :data:`REGISTRY`.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Iterable

from ..situations.registry import SITUATIONS, unknown_situations
from .verdict import Verdict

if TYPE_CHECKING:
    from ..history import History

Checker = Callable[["History"], Verdict]
_FAMILIES = "IVSPCF"  # the README's order: in-flight requests, versions, staleness, protocol, cache, files


@dataclass(frozen=True)
class Check:
    """One registered check (``V4-S1`` checks the invariants V4 and S1 at once)."""

    id: str
    title: str
    holds: str
    """What must hold (the README's "invariant" column)."""
    reads: str
    """What it reads of the history (the README's "what it reads on the wire" column)."""
    needs_pause: bool
    """Only for an integration that pauses, on a release whose pause takes a mode (skipped with the reason
    otherwise)."""
    needs_residency: bool
    """About requests kept resident across a pause: skipped, with the reason, for an integration whose pauses take
    effect in abort mode (nothing is resident; I3 reports the mode)."""
    needs: frozenset[str]
    """The situations it reads (``situations.SITUATIONS``): it judges every scenario that builds them all."""
    model_based: str | None
    """None when the model-based run (``conformance.machine``) judges it after every step; else why it cannot."""
    measures: bool
    """Its metrics are what the run cost (aborted requests, staleness): the report lists them."""
    run: Checker

    @property
    def invariants(self) -> tuple[str, ...]:
        return tuple(self.id.split("-"))

    @property
    def label(self) -> str:
        """The id as the README and the verdicts spell it (``V4/S1``)."""
        return "/".join(self.invariants)

    @property
    def name(self) -> str:
        """What a verdict of this check is called (``[V4/S1 never backwards] FAIL``)."""
        return f"{self.label} {self.title}"


REGISTRY: dict[str, Check] = {}
"""Check id → check, in the README's order (once every checker module is imported: ``conformance.checks``)."""


def check(id: str, title: str, *, holds: str, reads: str, needs: Iterable[str], needs_pause: bool = False,
          needs_residency: bool = False, model_based: str | None = None,
          measures: bool = False) -> Callable[[Checker], Checker]:
    """Register the decorated checker as check ``id``, judging every scenario that builds the situations it
    ``needs``; its verdicts carry the check's name."""

    def register(fn: Checker) -> Checker:
        if id in REGISTRY:
            raise ValueError(f"check {id!r} is registered twice ({REGISTRY[id].run.__name__}, {fn.__name__})")
        if not id or id[0] not in _FAMILIES:
            raise ValueError(f"check id {id!r} must start with one of {_FAMILIES}")
        if not needs or unknown_situations(needs):
            raise ValueError(f"check {id!r}: needs {sorted(needs)} must name situations among {list(SITUATIONS)}")

        @functools.wraps(fn)
        def run(h: History) -> Verdict:
            v = fn(h)
            v.check = spec.name
            return v

        spec = Check(id, title, holds, reads, needs_pause, needs_residency, frozenset(needs), model_based, measures,
                     run)
        REGISTRY[id] = spec
        ordered = sorted(REGISTRY.values(), key=lambda c: (_FAMILIES.index(c.id[0]), int(c.invariants[0][1:])))
        REGISTRY.clear()
        REGISTRY.update((c.id, c) for c in ordered)
        return run

    return register


def invariants(check_id: str) -> set[str]:
    """The invariant ids a check covers (``"V4-S1"`` → V4 and S1); a ``KeyError`` for an unregistered id."""
    return set(REGISTRY[check_id].invariants)


def known_invariants() -> set[str]:
    return {i for c in REGISTRY.values() for i in c.invariants}
