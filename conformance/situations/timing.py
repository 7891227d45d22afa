"""Every duration the situations and the scenarios run by: the deadlines on the integration, and how long the
suite waits for, and aims at, the situations it builds. One home, so that a constant's meaning is read here."""

from __future__ import annotations

import os
from dataclasses import dataclass, fields, replace
from typing import Protocol


@dataclass(frozen=True)
class Deadlines:
    """How long the suite waits on the integration and for the situations it sets up. A call into the integration
    past its deadline is a hang, a situation that never comes a timeout: either breaks the run."""

    update_s: float = 20.0
    """``Updater.update()``: one whole cycle."""
    drain_s: float = 15.0
    """``Manager.next_batch()``."""
    wait_s: float = 10.0
    """Building the roles, starting and stopping the manager, waiting for requests in flight."""
    script_s: float = 60.0
    """A whole scenario script."""
    teardown_s: float = 60.0
    """Beyond the script's deadline: building the roles and tearing down are bounded too, so past the script's
    deadline plus this last-resort margin the backend is stopped and the scenario reported as hung."""

    def scaled(self, factor: float) -> Deadlines:
        """Every deadline times ``factor``."""
        return Deadlines(*(getattr(self, f.name) * factor for f in fields(self)))

    def with_update_budget(self, budget_s: float | None) -> Deadlines:
        """These deadlines for an integration that declares ``Capabilities.update_budget_s``: an update may take the
        budget where it is longer than :attr:`update_s`, and a scenario two such updates more."""
        extra = 0.0 if budget_s is None else max(0.0, budget_s - self.update_s)
        return replace(self, update_s=self.update_s + extra, script_s=self.script_s + 2 * extra)


def _scale_from_env() -> float:
    raw = os.environ.get("WEIGHTSYNC_DEADLINE_SCALE", "1")
    try:
        factor = float(raw)
    except ValueError:
        factor = 0.0
    if not factor > 0:
        raise ValueError(f"WEIGHTSYNC_DEADLINE_SCALE={raw!r}: expected a positive number (e.g. 3 for slow engines)")
    return factor


DEADLINES = Deadlines().scaled(_scale_from_env())
"""The suite's deadlines; ``WEIGHTSYNC_DEADLINE_SCALE`` (read at import) multiplies them all (slow engines: 3)."""
CANCEL_GRACE_S = 2.0
"""How long a cancelled call into the integration may take to stop before the run goes on without it."""

# waiting (conformance.situations.waiting)
TICK_S = 0.01
"""How often a wait looks again when the wire is quiet: for conditions that come true with time alone."""
STEP_S = 0.05
"""The most one wake of a wait counts against its bound (a starved process wakes seconds late)."""

# the producer kept busy (conformance.situations.producer)
STALL_S = 0.1
"""How long a wait for engine activity goes without it before consuming a batch to unblock the producer."""
QUIET_S = 0.1
"""How long no ``/generate`` is in flight before the producer counts as blocked on a full buffer."""

# resident requests (conformance.situations.resident)
SPARE = 0.25
"""The share of its decode time a request on another engine still has to go when a resident cycle's first disturbing
call goes on."""
LAST_CHANCE = 0.15
"""The share of its decode time, just above :data:`SPARE`, in which a request resident on a real engine is taken for
a held resident cycle's first call when no younger one came: past it, too little of its decode is left."""
TURN_S = 0.15
"""How long one of the integration's turns decodes, at least (the scenarios raise ``max_new_tokens`` to that at the
backend's decode speed): a request sent at most half of it before a cycle starts is still decoding when the cycle
reaches its engine, whatever the cycle does first."""

# a drain that a long request outlasts (conformance.situations.drain)
DRAIN_S = 2.0
"""How long a request resident at a cycle's first pause, bump or transfer goes on decoding after it: longer than a
drain that gives up early waits."""

# one engine held behind (conformance.situations.slow)
LINGER_S = 0.2
"""How long a slow engine's call stays in progress after every other engine answered its own."""

# the suite's long-lived requests (conformance.situations.sentinels)
SENTINEL_SECONDS = 3.0
"""How long the suite's long-lived requests decode on the fake backend when nobody aborts them."""
SETTLE_S = 0.005
"""How long a long-lived request must have been open at its recorder before the cycle starts: the recorder forwards
at once, so this covers the hop to an engine behind a proxy."""
START_TIMEOUT_S = 5.0
"""How long the long-lived requests may take to be open at every recorder (time in which the loop did not run is
not counted: :func:`~conformance.situations.waiting.wait_until`)."""
MIN_LIFE_S = 0.01
"""A long-lived request that ended on its own sooner than this was not held by its engine (it answers at once): it is
not sent again (a cycle is bounded, so renewals are not counted: on a starved machine one engine's ended three times
before the cycle reached that engine, measured on real vLLM)."""
END_TIMEOUT_S = 2.0
"""How long the suite waits for aborted long-lived requests to answer. An engine left paused in place answers only
once it continues (SGLang finishes an aborted running request at its next decode step): the pause-pairing checker
says why, and the request is then given up (its connection dropped), not waited for."""


class Decoding(Protocol):
    """What a backend says about its decode speed (``decode_tokens_per_s``: optional) and its long-lived requests'
    budget."""

    sentinel_tokens: int


def decode_rate(backend: Decoding) -> float:
    """Tokens per second one request decodes at on ``backend`` (from its long-lived requests' budget when it does not
    say)."""
    rate = getattr(backend, "decode_tokens_per_s", None)
    return float(rate) if rate else backend.sentinel_tokens / SENTINEL_SECONDS


def turn_s(max_new_tokens: int, backend: Decoding) -> float:
    """How long one of the integration's turns decodes: ``max_new_tokens`` at :func:`decode_rate`, at least
    :data:`TURN_S`."""
    return max(TURN_S, max_new_tokens / decode_rate(backend))
