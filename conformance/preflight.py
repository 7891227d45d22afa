"""The release check, before the first scenario: one update cycle on the release the run targets, so that an
integration that never opens a weight-update session hears it once, up front, instead of failing mid-run.

SGLang 0.5.23 runs ``/update_weights_from_tensor`` and ``/update_weights_from_distributed`` only between
``/begin_weight_update`` and ``/end_weight_update`` (``python/sglang/srt/managers/scheduler_components/
weight_updater.py``, 0.5.23); earlier releases have no sessions (``fakes.facts``: ``weight_update_sessions``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .backends import Backend
from .cases import BackendFactory
from .interface import Integration
from .loop import run_abandonable
from .history import WireCall
from .scenarios import DEADLINES, Deadlines, Run, Scenario, run_scenario

SESSION_TRANSPORTS = ("tensor", "distributed")
SESSION_PATHS = ("/begin_weight_update", "/end_weight_update")


async def _one_update(run: Run) -> None:
    await run.update()


PROBE = Scenario(name="release-check", doc="one full-weight update on a transport that needs a session",
                 script=_one_update, builds=(), transport=SESSION_TRANSPORTS)


@dataclass(frozen=True)
class Finding:
    """A preflight check that stopped the run: which, for which integration on which release, the message that says
    what to fix, and its witness (the refused calls, as the wire shows them)."""

    check: str
    integration: str
    profile: str
    message: str
    witness: tuple[str, ...] = ()

    def to_json(self) -> dict[str, Any]:
        """The result's ``preflight`` entry (``reports/schema.json``)."""
        return {"check": self.check, "status": "fail", "integration": self.integration, "profile": self.profile,
                "message": self.message, "witness": list(self.witness)}


def needs_sessions(profile: str) -> bool:
    from fakes.facts import SGLANG

    return bool(SGLANG.fact("weight_update_sessions", profile))


def probe_bound_s(deadlines: Deadlines = DEADLINES) -> float:
    """The bound on the release check's run: building the roles, one update cycle, tearing down (``wait_s``,
    ``update_s``, ``wait_s``). A probe that hangs (a call that blocks its event loop cannot be cancelled) costs no
    more, and finds nothing: the scenarios then judge the hang, each within its own bound."""
    return 2 * deadlines.wait_s + deadlines.update_s


def release_check(integration: Integration, backend_factory: BackendFactory, seed: int = 0,
                  deadlines: Deadlines = DEADLINES) -> Finding | None:
    """None when the integration opens a session around its tensor/distributed updates (or the release or its
    capabilities need none), else the finding, whose message says in one line what to fix."""
    if not set(SESSION_TRANSPORTS) & set(integration.capabilities.transports):
        return None
    backend: Backend = backend_factory()
    if not needs_sessions(backend.profile):
        return None
    transport = PROBE.transport_for(integration)
    backend.start()
    try:
        outcome = run_abandonable(run_scenario(PROBE, integration, backend, seed, deadlines),
                                  probe_bound_s(deadlines), PROBE.name)
    finally:
        backend.stop()
    history = outcome.result if outcome.finished else None
    if history is None or not history.cycles:
        return None  # the probe could not run a cycle: the scenarios will say why, with their witnesses
    opened = any(call.path in SESSION_PATHS for call in history.wire)
    refused = [call for call in history.wire if call.path.startswith("/update_weights_from_") and not call.ok]
    if opened or not refused:
        return None
    message = (f"integration {integration.name!r} never opens a weight-update session; SGLang {backend.profile} "
               f"requires one for tensor and distributed updates (its {transport} update was refused): call "
               f"/begin_weight_update before the transfer and /end_weight_update after it (the reference updater's "
               f"begin_sessions/end_sessions), or run on an earlier release with --conformance-sglang-profile")
    witness = (f"no call to {' or '.join(SESSION_PATHS)} on any engine", *map(_refusal, refused))
    return Finding(PROBE.name, integration.name, backend.profile, message, witness)


def _refusal(call: WireCall) -> str:
    """``engine 0: POST /update_weights_from_tensor at t=0.12s answered 400: <message>``."""
    body = call.response.get("message") if isinstance(call.response, dict) else call.response
    answer = "no answer" if call.status is None else f"answered {call.status}"
    return f"engine {call.engine}: {call.method} {call.path} at t={call.t_start:.2f}s {answer}" + (
        f": {str(body)[:200]}" if body else "")
