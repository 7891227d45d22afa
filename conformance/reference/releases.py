"""What the reference cycle does differently per SGLang release, read off the engine's ``/get_server_info``
``version`` (real SGLang reports its ``__version__`` there; so does the fake, per profile). The facts themselves,
with where each lives in SGLang, are the table in ``fakes.facts`` (``SGLANG``) that the fake's profiles read too.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

from fakes.facts import SGLANG, parse_version


@dataclass(frozen=True)
class Release:
    """One engine's SGLang release and what it means for a weight-sync cycle. An engine that does not report a
    version is taken for the newest behaviour the reference targets (0.5.23)."""

    version: tuple[int, ...]

    @classmethod
    def from_server_info(cls, info: Mapping[str, Any]) -> "Release":
        return cls(parse_version(info.get("version")))

    @property
    def pause_modes(self) -> bool:
        """Fact ``pause_modes``: ``/pause_generation`` takes a mode (≥0.5.6). Before, the handler takes no body and
        every pause aborts, so a fully-async cycle does not pause there: the update itself waits for the requests in
        flight."""
        return bool(SGLANG.fact("pause_modes", self.version))

    @property
    def flush_while_retracted(self) -> bool:
        """Whether ``/flush_cache`` can succeed while paused in retract mode (facts ``flush_checks_waiting`` and
        ``flush_ignores_waiting_while_paused``): 0.5.10–0.5.22 count the waiting queue, which the retract filled, as
        busy, so the flush fails until the engine continues (0.5.23 ignores the waiting queue while paused). There
        the reference does not flush."""
        return not SGLANG.fact("flush_checks_waiting", self.version) or \
            bool(SGLANG.fact("flush_ignores_waiting_while_paused", self.version))

    @property
    def lora_tensor_field(self) -> str | None:
        """Fact ``lora_from_tensors_field``: ``/load_lora_adapter_from_tensors``'s tensor field, None before the
        route (0.5.10; the adapter goes through disk, ``/load_lora_adapter``)."""
        return SGLANG.fact("lora_from_tensors_field", self.version)


async def release_of(engine: Any) -> Release:
    """The engine's release: the reference client's cached ``release()``, else its client's ``server_info()``; a
    client with neither (an adopter's own) gets the newest behaviour the reference targets."""
    cached = getattr(engine, "release", None)
    if cached is not None:
        return await cached()
    server_info = getattr(engine, "server_info", None)
    return Release.from_server_info(await server_info()) if server_info is not None else Release(())
