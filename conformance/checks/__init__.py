"""Checkers: pure functions ``History -> Verdict``. No I/O, no clock, no globals. Each is registered once
(``registry.check``: id, title, what it reads, what it needs); :data:`CHECKS` maps an id to its checker."""

from . import adapters, checkpoints, prefix, protocol, requests, staleness, versions, weights  # noqa: F401  (they register)
from .adapters import adapter_not_unloaded_in_use
from .checkpoints import atomic_checkpoints
from .prefix import no_stale_prefix
from .protocol import cycle_order, failures_are_fatal, flush_contract, pause_mode_sent, pause_paired_with_resume
from .registry import REGISTRY, Check, invariants, known_invariants
from .requests import aborted_never_trained, no_aborts_on_update
from .staleness import oldest_version, staleness_bound
from .verdict import Verdict, verdict
from .versions import never_backwards, nothing_before_first_update, published_only_after_success, versions_agree
from .weights import served_weights_published, weights_match

CHECKS = {c.id: c.run for c in REGISTRY.values()}
"""Invariant id → checker."""

__all__ = ["CHECKS", "REGISTRY", "Check", "Verdict", "invariants", "known_invariants", "verdict",
           *(f.__name__ for f in CHECKS.values())]
