"""Checkers: pure functions ``History -> Verdict``. No I/O, no clock, no globals."""

from .adapters import adapter_not_unloaded_in_use
from .checkpoints import atomic_checkpoints
from .protocol import cycle_order, failures_are_fatal, flush_contract, pause_mode_sent, pause_paired_with_resume
from .requests import aborted_never_trained, no_aborts_on_update
from .staleness import oldest_version, staleness_bound
from .verdict import Verdict, verdict, worst
from .versions import (never_backwards, nothing_before_first_update, published_only_after_success,
                       versions_agree, weights_match)

CHECKS = {
    "I1-I2": no_aborts_on_update,
    "I3": pause_mode_sent,
    "I4": aborted_never_trained,
    "I6": pause_paired_with_resume,
    "V1": versions_agree,
    "V2": published_only_after_success,
    "V3": nothing_before_first_update,
    "V4-S1": never_backwards,
    "S2": oldest_version,
    "S3": staleness_bound,
    "P1": cycle_order,
    "P5": failures_are_fatal,
    "P6": weights_match,
    "P7": adapter_not_unloaded_in_use,
    "C2": flush_contract,
    "F3": atomic_checkpoints,
}
"""Invariant id → checker."""

__all__ = ["CHECKS", "Verdict", "verdict", "worst", *(f.__name__ for f in CHECKS.values())]
