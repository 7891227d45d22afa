"""Verdicts: pass / fail / unknown, with a witness a person can act on, and metrics."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal, Sequence

from ..anomaly import Anomaly, note

Status = Literal["pass", "fail", "unknown"]


@dataclass
class Verdict:
    """The result of one checker on one history. ``unknown`` never counts as a pass."""

    check: str
    status: Status
    witness: list[str] = field(default_factory=list)
    """The anomalies' sentences (given alone, each becomes a ``note``)."""
    metrics: dict[str, Any] = field(default_factory=dict)
    run_broke: bool = False
    """The run broke (an unexpected failure, a hang, a timeout): the case fails whatever the checker said; the
    witness starts with the breakage, then what the checker itself found."""
    checker_status: Status | None = None
    """What the checker alone answered on the history (differs from ``status`` only when the run broke)."""
    anomalies: list[Anomaly] = field(default_factory=list)
    """Concrete evidence, as data: which request, which engine, which version, when. Capped by the checker."""

    def __post_init__(self) -> None:
        if self.checker_status is None:
            self.checker_status = self.status
        if not self.anomalies:
            self.anomalies = [note(str(w)) for w in self.witness]
        self.witness = [a.text for a in self.anomalies]

    @property
    def passed(self) -> bool:
        return self.status == "pass"

    def explain(self) -> str:
        """The pytest failure text: the name, the status, the first ten anomalies' sentences."""
        head = f"[{self.check}] {self.status.upper()}"
        lines = [a.text for a in self.anomalies]
        return "\n  ".join([head, *lines[:10]] + ([f"... and {len(lines) - 10} more"] if len(lines) > 10 else []))


MAX_WITNESSES = 20


def verdict(failures: Sequence[Anomaly | str], *, vacuous: str | None = None,
            metrics: dict[str, Any] | None = None) -> Verdict:
    """Fail with ``failures`` when any (a plain sentence is a ``note``: it names nothing the report can highlight);
    otherwise unknown with the ``vacuous`` reason when set; else pass. The check's name is set by its registration
    (``conformance.checks.registry.check``)."""
    if failures:
        anomalies = [f if isinstance(f, Anomaly) else note(f) for f in failures[:MAX_WITNESSES]]
        return Verdict("", "fail", metrics=metrics or {}, anomalies=anomalies)
    if vacuous:
        return Verdict("", "unknown", metrics=metrics or {}, anomalies=[note(vacuous)])
    return Verdict("", "pass", [], metrics or {})
