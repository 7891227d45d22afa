"""Divergence lists, for every engine family's differential: an entry's key, its classes, and what a run found
against what is listed (new, gone)."""

from __future__ import annotations

import json
from typing import Any


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
