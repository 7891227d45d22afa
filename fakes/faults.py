"""Fault injection as data: per-endpoint latency, HTTP errors, hangs, crashes and failing flushes."""

from __future__ import annotations

import random
import threading
from dataclasses import asdict, dataclass, fields
from typing import Any, Iterable, Literal

FaultKind = Literal["latency", "error", "hang", "crash", "flush_fail"]
FAULT_KINDS: tuple[str, ...] = ("latency", "error", "hang", "crash", "flush_fail")
ANY_ENDPOINT = "*"


@dataclass(frozen=True)
class Fault:
    """One injected fault.

    ``endpoint`` is a path (``"/update_weights_from_disk"``) or ``"*"``. Kinds:
    ``latency`` (delay ``latency_s`` on the engine clock, then handle normally), ``error`` (answer
    ``status``/``body`` without handling), ``hang`` (never answer until the engine shuts down),
    ``crash`` (the engine dies, as SGLang's process would), ``flush_fail`` (the cache flush this
    request performs fails: ``/flush_cache`` → 400, a weight update → the profile's post-update
    flush failure). ``times=None`` fires on every match; ``probability`` is drawn from the plan's seed.
    """

    endpoint: str
    kind: FaultKind
    status: int | None = None
    body: Any = None
    latency_s: float = 0.0
    times: int | None = None
    probability: float = 1.0

    def __post_init__(self) -> None:
        if self.kind not in FAULT_KINDS:
            raise ValueError(f"unknown fault kind {self.kind!r}; known: {', '.join(FAULT_KINDS)}")
        if not 0.0 <= self.probability <= 1.0:
            raise ValueError(f"probability must be in [0, 1], got {self.probability}")
        if self.times is not None and self.times < 0:
            raise ValueError(f"times must be None or >= 0, got {self.times}")
        if self.latency_s < 0:
            raise ValueError(f"latency_s must be >= 0, got {self.latency_s}")
        if self.endpoint != ANY_ENDPOINT and not self.endpoint.startswith("/"):
            raise ValueError(f"endpoint must be a path starting with '/' or '*', got {self.endpoint!r}")

    @property
    def error_status(self) -> int:
        return self.status if self.status is not None else 500

    @property
    def error_body(self) -> Any:
        return self.body if self.body is not None else {"error": {"message": f"injected fault on {self.endpoint}"}}

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


class FaultPlan:
    """An ordered, seeded list of faults; ``pick(endpoint)`` returns the first that fires."""

    def __init__(self, faults: Iterable[Fault] = (), seed: int = 0) -> None:
        self.faults: tuple[Fault, ...] = tuple(faults)
        self.seed = seed
        self._rng = random.Random(seed)
        self._left: list[int | None] = [f.times for f in self.faults]
        self._lock = threading.Lock()

    def pick(self, endpoint: str) -> Fault | None:
        """The fault to apply to this call of ``endpoint``, or None; consumes one of its ``times``."""
        with self._lock:
            for i, fault in enumerate(self.faults):
                if fault.endpoint not in (endpoint, ANY_ENDPOINT):
                    continue
                if self._left[i] == 0:
                    continue
                if fault.probability < 1.0 and self._rng.random() >= fault.probability:
                    continue
                if self._left[i] is not None:
                    self._left[i] -= 1
                return fault
        return None

    @classmethod
    def from_dicts(cls, faults: Iterable[dict[str, Any]], seed: int = 0) -> FaultPlan:
        """Build a plan from plain dicts (e.g. parsed from a CLI JSON argument); ValueError says what is wrong."""
        if not isinstance(faults, (list, tuple)):
            raise ValueError(f"a fault plan is a list of objects, got {type(faults).__name__}")
        known = [f.name for f in fields(Fault)]
        plan = []
        for i, item in enumerate(faults):
            if not isinstance(item, dict):
                raise ValueError(f"fault {i} must be an object, got {type(item).__name__}")
            unknown = sorted(set(item) - set(known))
            if unknown:
                raise ValueError(f"fault {i}: unknown field(s) {', '.join(map(repr, unknown))}; known: {', '.join(known)}")
            missing = [k for k in ("endpoint", "kind") if k not in item]
            if missing:
                raise ValueError(f"fault {i}: missing field(s) {', '.join(map(repr, missing))}")
            try:
                plan.append(Fault(**item))
            except TypeError as e:  # a comparison on a value of the wrong type
                raise ValueError(f"fault {i}: a field has the wrong type ({e})") from None
            except ValueError as e:
                raise ValueError(f"fault {i}: {e}") from None
        return cls(plan, seed=seed)

    def to_dicts(self) -> list[dict[str, Any]]:
        return [f.to_dict() for f in self.faults]

    def __repr__(self) -> str:
        return f"FaultPlan({list(self.faults)!r}, seed={self.seed})"
