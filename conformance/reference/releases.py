"""What the reference cycle does differently per SGLang release, read off the engine's ``/get_server_info``
``version`` (real SGLang reports its ``__version__`` there; so does the fake, per profile).

Sources: ``docs/sglang-api.md`` §0.1, §2.1, §4, §7.1, and the committed ``io_struct``/``http_server`` snapshots
(``fakes/snapshots``) of 0.5.4, 0.5.10, 0.5.15 and 0.5.23.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping


def parse_version(text: Any) -> tuple[int, ...]:
    """``"0.5.15.post1"`` → ``(0, 5, 15)``; ``()`` when the engine does not say."""
    parts: list[int] = []
    for part in str(text or "").split("."):
        digits = "".join(ch for ch in part if ch.isdigit()) if part[:1].isdigit() else ""
        if not digits:
            break
        parts.append(int(digits))
    return tuple(parts)


@dataclass(frozen=True)
class Release:
    """One engine's SGLang release and what it means for a weight-sync cycle. An engine that does not report a
    version is taken for the newest behaviour the reference targets (0.5.23)."""

    version: tuple[int, ...]

    @classmethod
    def from_server_info(cls, info: Mapping[str, Any]) -> "Release":
        return cls(parse_version(info.get("version")))

    def _at_least(self, *version: int) -> bool:
        return not self.version or self.version >= version

    @property
    def pause_modes(self) -> bool:
        """≥0.5.6: ``/pause_generation`` takes a mode. Before, the handler takes no body and every pause aborts, so
        a fully-async cycle does not pause there: the update itself waits for the requests in flight."""
        return self._at_least(0, 5, 6)

    @property
    def flush_while_retracted(self) -> bool:
        """Whether ``/flush_cache`` can succeed while paused in retract mode: 0.5.10–0.5.22 count the waiting queue,
        which the retract filled, as busy, so the flush fails until the engine continues (§7.1; 0.5.23 ignores
        the waiting queue while paused). There the reference does not flush."""
        return self._at_least(0, 5, 23) or self.version < (0, 5, 10)

    @property
    def lora_tensor_field(self) -> str | None:
        """``/load_lora_adapter_from_tensors``'s tensor field: none before 0.5.10 (the adapter goes through disk,
        ``/load_lora_adapter``), ``serialized_tensors`` (one string) up to 0.5.22, ``serialized_named_tensors`` (one
        string per TP rank) from 0.5.23."""
        if not self._at_least(0, 5, 10):
            return None
        return "serialized_named_tensors" if self._at_least(0, 5, 23) else "serialized_tensors"


async def release_of(engine: Any) -> Release:
    """The engine's release: the reference client's cached ``release()``, else its client's ``server_info()``; a
    client with neither (an adopter's own) gets the newest behaviour the reference targets."""
    cached = getattr(engine, "release", None)
    if cached is not None:
        return await cached()
    server_info = getattr(engine, "server_info", None)
    return Release.from_server_info(await server_info()) if server_info is not None else Release(())
