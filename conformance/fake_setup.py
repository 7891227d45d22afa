"""The fake backend's session set-up (its row in :mod:`conformance.backend_table`): fake SGLang engines in this
process, fresh for each scenario; it runs everywhere, under the suite's own deadlines."""

from __future__ import annotations

from dataclasses import dataclass

from fakes.profiles import DEFAULT_PROFILE

from .cases import BackendFactory, fake_backend_factory
from .families import DEFAULT_FAMILY


@dataclass(frozen=True)
class FakeSetup:
    """``fake``: two fake engines behaving as SGLang ``profile`` (or as vLLM: ``engine``), seeded with ``seed``."""

    profile: str = DEFAULT_PROFILE
    seed: int = 0
    engine: str = DEFAULT_FAMILY

    def skip_reason(self) -> str | None:
        """None: the fake runs on any machine."""
        return None

    def backend_factory(self) -> BackendFactory:
        return fake_backend_factory(self.profile, self.seed, engine=self.engine)

    def close(self) -> None:
        """Nothing is held between scenarios."""
