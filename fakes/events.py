"""The engine-side event log: what the fake engine saw and did, in order.

Kinds: ``request.submit``, ``request.parked``, ``request.admit``, ``request.token`` (trace mode only),
``request.retract``, ``request.finish``, ``control``, ``version.change``, ``weights.load``, ``weights.skipped``
(a name the model lacks, with SGLang's warning), ``weights.lost`` (a vLLM reload that failed after the layers were
reset), ``memory.release``, ``memory.resume``, ``lora.load``,
``lora.unload``, ``lora.implicit_reload`` (a request named an adapter unloaded since: reloaded first),
``engine.crash``, ``fault``, ``prefix.hit`` (a vLLM request served from cached blocks: how many tokens, how many of
them computed on other weights) and ``prefix.reset`` (vLLM's prefix cache dropped).
"""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass, field
from typing import Any, Iterator

KINDS = frozenset(
    {
        "request.submit",
        "request.parked",
        "request.admit",
        "request.token",
        "request.retract",
        "request.finish",
        "control",
        "version.change",
        "weights.load",
        "weights.skipped",
        "weights.lost",
        "memory.release",
        "memory.resume",
        "lora.load",
        "lora.unload",
        "lora.implicit_reload",
        "engine.crash",
        "fault",
        "prefix.hit",
        "prefix.reset",
    }
)


@dataclass(frozen=True, slots=True)
class Event:
    """One thing that happened on engine ``engine`` at engine-clock time ``t``."""

    t: float
    kind: str
    engine: str
    fields: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """A plain, JSON-ready dict: ``{"t", "kind", "engine", "fields"}``."""
        return {"t": self.t, "kind": self.kind, "engine": self.engine, "fields": dict(self.fields)}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Event:
        return cls(t=float(d["t"]), kind=str(d["kind"]), engine=str(d["engine"]), fields=dict(d.get("fields", {})))


class EventLog:
    """Append-only, thread-safe list of events."""

    def __init__(self, events: list[Event] | None = None) -> None:
        self._events: list[Event] = list(events or [])
        self._lock = threading.Lock()

    def append(self, event: Event) -> Event:
        if event.kind not in KINDS:
            raise ValueError(f"unknown event kind {event.kind!r}; known: {sorted(KINDS)}")
        with self._lock:
            self._events.append(event)
        return event

    def record(self, t: float, kind: str, engine: str, **fields: Any) -> Event:
        """Build and append an event."""
        return self.append(Event(t=t, kind=kind, engine=engine, fields=fields))

    def _snapshot(self) -> list[Event]:
        with self._lock:
            return list(self._events)

    def __iter__(self) -> Iterator[Event]:
        return iter(self._snapshot())

    def __len__(self) -> int:
        with self._lock:
            return len(self._events)

    def __getitem__(self, index: int) -> Event:
        with self._lock:
            return self._events[index]

    def of_kind(self, *kinds: str) -> list[Event]:
        """Events whose kind is one of ``kinds``, in order."""
        wanted = set(kinds)
        return [e for e in self._snapshot() if e.kind in wanted]

    def to_list(self) -> list[dict[str, Any]]:
        return [e.to_dict() for e in self._snapshot()]

    def to_jsonl(self) -> str:
        """One JSON object per line (non-JSON values rendered with ``str``)."""
        return "".join(json.dumps(d, default=str) + "\n" for d in self.to_list())

    @classmethod
    def from_jsonl(cls, text: str) -> EventLog:
        """Parse what ``to_jsonl`` wrote (e.g. fetched from ``GET /_fake/events``)."""
        return cls([Event.from_dict(json.loads(line)) for line in text.splitlines() if line.strip()])

    def __repr__(self) -> str:
        return f"EventLog({len(self)} events)"
