"""SGLang's facts under the names they had before the per-family table (``fakes.facts``): an alias module for the
readers not yet switched to ``fakes.facts.SGLANG``. New code reads ``fakes.facts``."""

from __future__ import annotations

from .facts import SGLANG, Fact, parse_version

RELEASES = SGLANG.releases
"""The releases the fake behaves as (``fakes.profiles.PROFILES``), oldest first; the last is the default."""

FACTS = SGLANG.facts
"""Fact name → the fact."""

fact = SGLANG.fact
"""The value of fact ``name`` on SGLang ``version`` (``KeyError`` for a fact not in the table)."""

__all__ = ["FACTS", "RELEASES", "Fact", "fact", "parse_version"]
