"""The conformance cases on the real-engine backends, collected from this repository's test paths: ``pytest -m gpu
--nodes 2`` (a GPU cluster), ``pytest -m sglang`` and ``pytest -m vllm --conformance-engine vllm`` (real engines on
CPU) run them without naming ``conformance/suite``. The fake backend's cases are the main job (``python -m
conformance``), so they are not collected here: the README's test command (``-m "cpu and not slow"``) selects none of
these."""

from __future__ import annotations

from conformance.backend_table import BACKENDS, REFERENCE_BACKEND
from conformance.suite import ConformanceSuite


class TestRealEngines(ConformanceSuite):
    """The session's integration on every backend but the fake."""

    backends = [name for name in BACKENDS if name != REFERENCE_BACKEND]
