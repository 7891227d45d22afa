"""Clocks for the fake engine: a manual clock the test steps, and a real monotonic one."""

from __future__ import annotations

import threading
import time
from typing import Protocol


class Clock(Protocol):
    """Anything with ``now() -> float`` seconds."""

    def now(self) -> float: ...


class ManualClock:
    """A clock that only moves when told to.

    ``FakeEngine.step(n)`` advances it by ``n * dt_per_step``; tests may also ``advance(dt)``.
    """

    def __init__(self, dt_per_step: float = 0.01, start: float = 0.0) -> None:
        if dt_per_step <= 0:
            raise ValueError(f"dt_per_step must be > 0, got {dt_per_step}")
        self.dt_per_step = dt_per_step
        self._now = start
        self._lock = threading.Lock()

    def now(self) -> float:
        with self._lock:
            return self._now

    def advance(self, dt: float) -> float:
        """Move time forward by ``dt`` seconds (never backwards); return the new time."""
        if dt < 0:
            raise ValueError(f"a clock never goes backwards (dt={dt})")
        with self._lock:
            self._now += dt
            return self._now

    def tick(self, n: int = 1) -> float:
        """Advance by ``n`` decode steps."""
        return self.advance(n * self.dt_per_step)

    def __repr__(self) -> str:
        return f"ManualClock(now={self.now():.4f}, dt_per_step={self.dt_per_step})"


class RealClock:
    """Monotonic wall time, zeroed at construction."""

    def __init__(self) -> None:
        self._t0 = time.monotonic()

    def now(self) -> float:
        return time.monotonic() - self._t0

    def __repr__(self) -> str:
        return f"RealClock(now={self.now():.4f})"
