"""Verdicts: pass / fail / unknown, with a witness a person can act on, and metrics."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

Status = Literal["pass", "fail", "unknown"]
_RANK = {"pass": 0, "unknown": 1, "fail": 2}


@dataclass
class Verdict:
    """The result of one checker on one history. ``unknown`` never counts as a pass."""

    check: str
    status: Status
    witness: list[str] = field(default_factory=list)
    """Concrete evidence: which request, which engine, which version, when. Capped by the checker."""
    metrics: dict[str, Any] = field(default_factory=dict)
    run_broke: bool = False
    """The run broke (an unexpected failure, a hang, a timeout): the case fails whatever the checker said; the
    witness starts with the breakage, then what the checker itself found."""
    checker_status: Status | None = None
    """What the checker alone answered on the history (differs from ``status`` only when the run broke)."""

    def __post_init__(self) -> None:
        if self.checker_status is None:
            self.checker_status = self.status

    @property
    def passed(self) -> bool:
        return self.status == "pass"

    def explain(self) -> str:
        head = f"[{self.check}] {self.status.upper()}"
        return "\n  ".join([head, *self.witness[:10]] + ([f"... and {len(self.witness) - 10} more"]
                                                          if len(self.witness) > 10 else []))


MAX_WITNESSES = 20


def verdict(failures: list[str], *, vacuous: str | None = None, metrics: dict[str, Any] | None = None) -> Verdict:
    """Fail with ``failures`` when any; otherwise unknown with the ``vacuous`` reason when set; else pass. The
    check's name is set by its registration (``conformance.checks.registry.check``)."""
    if failures:
        return Verdict("", "fail", failures[:MAX_WITNESSES], metrics or {})
    if vacuous:
        return Verdict("", "unknown", [vacuous], metrics or {})
    return Verdict("", "pass", [], metrics or {})


def worst(verdicts: list[Verdict]) -> Status:
    """Jepsen's composition: the worst status wins."""
    return max((v.status for v in verdicts), key=_RANK.__getitem__, default="unknown")
