"""Running the conformance cases of one pytest session: each scenario once per integration and backend."""

from __future__ import annotations


class ScenarioRunError(Exception):
    """A scenario's run raised before any verdict existed (an engine lost, never healthy): every case of it fails
    with this message."""
