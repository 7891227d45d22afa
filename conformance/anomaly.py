"""Anomalies: what a checker found, as data. Each names what it is about (its kind, the engine, the request ids,
the update cycle, the consumed batch and prompt, the versions, the times) beside the sentence a person reads; the
pytest failure text, the Markdown and the HTML report render the sentence, and the report highlights the
timeline from the fields (never by parsing the sentence)."""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any


@dataclass(frozen=True)
class Anomaly:
    """One finding of a checker (or one line of why a run broke)."""

    kind: str
    """What went wrong, e.g. ``abort-on-update``, ``aborted-trained``, ``label-mismatch``, ``hang``."""
    text: str
    """The rendered sentence."""
    engine: int | None = None
    rids: tuple[str, ...] = ()
    cycle: int | None = None
    batch: int | None = None
    prompt: int | None = None
    """With ``batch``: the consumed group (its requests are the group's turns)."""
    versions: tuple[Any, ...] = ()
    times: tuple[float, ...] = ()
    """Seconds since the run started, as the history's times."""

    def __str__(self) -> str:
        return self.text

    def to_json(self) -> dict[str, Any]:
        """The fields that are set (``kind`` and ``text`` always)."""
        out: dict[str, Any] = {"kind": self.kind, "text": self.text}
        for f in fields(self)[2:]:
            value = getattr(self, f.name)
            if value is not None and value != ():
                out[f.name] = list(value) if isinstance(value, tuple) else value
        return out

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Anomaly:
        """The inverse of :meth:`to_json` (fields it does not know are ignored)."""
        known = {f.name: f for f in fields(cls)}
        kwargs = {k: tuple(v) if isinstance(v, list) else v for k, v in data.items() if k in known}
        return cls(**{"kind": "note", "text": "", **kwargs})


def note(text: str) -> Anomaly:
    """A line that names nothing in particular (a summary, a reason)."""
    return Anomaly("note", text)
