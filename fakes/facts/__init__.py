"""Engine facts per family, the one table the fake and the suite both read: the releases, what changed in each
(``Fact``), how failures are answered (``Answer``), which failed loads kill the server, the keep-alive; and the
one version parser (``parse_version``). One module per family (``sglang``, ``vllm``); a second family is a second table of
the same types (``family``), added to :data:`FAMILIES`. Plain data, no I/O: importing it is instant."""

from __future__ import annotations

from .family import Answer, EngineFamily, Fact, Release, newest_not_newer, parse_version
from .sglang import SGLANG
from .vllm import VLLM

FAMILIES: dict[str, EngineFamily] = {f.name: f for f in (SGLANG, VLLM)}
"""Family name → its table."""

__all__ = ["FAMILIES", "SGLANG", "VLLM", "Answer", "EngineFamily", "Fact", "Release", "newest_not_newer", "parse_version"]
