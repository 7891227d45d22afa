"""The script's server lifetimes: the main sequence, the generated state matrix, and each call that may end a server,
each run on a fresh server (:func:`run_script` drives one)."""

from __future__ import annotations

from pathlib import Path

import httpx

from .malformed import malformed_steps
from .matrix import matrix_steps
from .script import ENDINGS, Checkpoints, Observation, Sent, Steps, main_steps, script_client

MATRIX = "state matrix"
"""The lifetime of the generated cases: the state matrix (:mod:`gpu.fidelity.matrix`), then the malformed bodies
(:mod:`gpu.fidelity.malformed`)."""
LIFETIMES = ("main", MATRIX, *ENDINGS)
"""The server lifetimes of the script, in order: each starts a fresh server."""
EXITED = "server exited"
"""The step recording, after each lifetime, whether the server process exited
(:func:`gpu.fidelity.__main__.run_engine`)."""


async def run_script(url: str, model_dir: Path, work: Path, release: str, lora: bool = False,
                     lifetime: str = "main", sent: list[Sent] | None = None) -> dict[str, Observation]:
    """Drive the engine at ``url`` (serving ``model_dir``, label ``default``; with ``lora``, started with LoRA on)
    through one of :data:`LIFETIMES`; a connection lost mid-way ends it, recorded as ``server lost`` (with the step
    it happened at) under the lifetime's name. Every request the script sends is appended to ``sent``."""
    out: dict[str, Observation] = {}
    sent = [] if sent is None else sent
    async with script_client(sent) as client:
        steps = Steps(client, url, Checkpoints(model_dir, work), work, release, out, sent)
        try:
            if lifetime == "main":
                await main_steps(steps, model_dir, lora)
            elif lifetime == MATRIX:
                await matrix_steps(steps, lora)
                await malformed_steps(steps)
            else:
                await ENDINGS[lifetime](steps)
        except httpx.HTTPError as error:
            out[lost(lifetime)] = {"at": list(out)[-1] if out else None, "error": type(error).__name__}
    return out


def lost(lifetime: str) -> str:
    """The step that records the server lost during ``lifetime``."""
    return "server lost" if lifetime == "main" else f"server lost ({lifetime})"
