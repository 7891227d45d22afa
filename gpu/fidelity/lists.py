"""Divergence lists, for every engine family's differential: an entry's key, its classes, and what a run found
against what is listed (new, gone)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any, Callable, Sequence


def key(entry: dict[str, Any]) -> tuple[str, str, str, str]:
    """What identifies a divergence: its step, its field and both answers."""
    return (entry["step"], entry["field"], json.dumps(entry["fake"], sort_keys=True),
            json.dumps(entry["real"], sort_keys=True))


CLASSES = ("fake-only", "CPU artefact", "not modelled", "race")
"""What a listed divergence is: the fake's own extension or wording, an artefact of the real engine on CPU, behaviour the
fake does not model, or one of the answers the real engine gives run to run."""


def is_race(entry: dict[str, Any]) -> bool:
    """Whether a listed divergence is one of the answers the real engine gives only on some runs (class ``race``)."""
    return entry.get("class") == "race"


def compare(found: list[dict[str, Any]], listed: list[dict[str, Any]]) -> tuple[list[dict], list[dict]]:
    """The divergences found that are not listed, and the listed ones not found (a ``race`` entry never counts as
    gone: the real engine gives that answer only on some runs). A step not built on either side is always new: no list
    excuses a comparison that did not happen."""
    listed_keys, found_keys = {key(e) for e in listed}, {key(d) for d in found}
    new = [d for d in found if key(d) not in listed_keys or d.get("not_built")]
    gone = [e for e in listed if key(e) not in found_keys and not is_race(e)]
    return new, gone


def command_line(parser: argparse.ArgumentParser, argv: Sequence[str] | None, releases: Sequence[str], family: str,
                 coverage: Callable[[Sequence[str]], int], status: Callable[..., Any],
                 uncovered: Path) -> tuple[argparse.Namespace, Any] | int:
    """Every family's differential command line: ``--coverage`` runs ``coverage`` on the releases asked (or all) and
    its exit code is returned; otherwise the arguments and ``--release``'s real-engine environment (``status``), or 2
    when it cannot be used (said on stderr)."""
    parser.add_argument("--release", choices=releases, help="the release to compare (required but with --coverage)")
    parser.add_argument("--venv", type=Path, help=f"the release's real-{family} environment (default: the installer's)")
    parser.add_argument("--json", type=Path, help="write both engines' observations and the diff here")
    parser.add_argument("--update", action="store_true",
                        help="rewrite the committed list with what was found (keeps the explanations)")
    parser.add_argument("--coverage", action="store_true",
                        help=f"no real engine: what of the fake's surface the script leaves uncompared (every "
                             f"release, or --release), against gpu/fidelity/{uncovered.name}")
    args = parser.parse_args(argv)
    if args.coverage:
        return coverage([args.release] if args.release else list(releases))
    if args.release is None:
        parser.error("--release is required (but with --coverage)")
    env = status(args.release, args.venv, import_check=False)
    if not env.usable:
        print(f"gpu.fidelity: {env.reason}", file=sys.stderr)
        return 2
    return args, env
