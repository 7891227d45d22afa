"""Malformed bodies, generated from the request structs: for every route of the fake's table that takes a body struct
on the release (``fakes.structs.endpoints``), a body that is not JSON, an empty body, a JSON array, an object without
its required fields, and for each field a value of a type it refuses (the first of :data:`WRONG` the field's
compiled type refuses, ``fakes.structs.check``; a field that takes anything has none). Sent idle at the end of the
state matrix's lifetime, each marked with :data:`MALFORMED` as its state, so the coverage report holds every struct
route to one; each answer is compared with its validation errors by type and location
(:func:`gpu.fidelity.script.normalise`).

SGLang validates a body before its handler runs (FastAPI over the ``io_struct`` dataclasses), so none of these
reaches the scheduler on either engine; a case that did would show as a divergence in status or state after.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from fakes.app import HANDLERS
from fakes.structs import check, compiled_type, endpoints, struct_fields

from .script import STATE_HEADER, Steps

MALFORMED = "malformed body"
"""The state the coverage report knows these cases by."""
WRONG: tuple[Any, ...] = ({"malformed": 1}, ["malformed"], "malformed", 1.5)
"""Values tried, in order, for a field: the first its type refuses is sent."""


@dataclass(frozen=True)
class Malformed:
    """One malformed call: its route, what is wrong with it, and the raw body sent."""

    route: str
    what: str
    body: bytes


def wrong_value(type_text: str, release: str) -> Any | None:
    """A value of :data:`WRONG` that a field typed ``type_text`` refuses on ``release``, or None (it takes any)."""
    node = compiled_type(type_text, release)
    return next((value for value in WRONG if check(node, value)[1]), None)


def malformed(release: str) -> list[Malformed]:
    """Every malformed call of the struct routes the fake serves on ``release``, in route-table order."""
    served = endpoints(release)
    cases = []
    for route in HANDLERS:
        endpoint = served.get(route) or {}
        struct = endpoint.get("struct")
        if not struct or "POST" not in endpoint.get("methods", []):
            continue
        fields = struct_fields(struct, release)
        cases += [Malformed(route, "not JSON", b"{not json"), Malformed(route, "no body", b""),
                  Malformed(route, "a JSON array", b"[]")]
        if any(spec["required"] for spec in fields.values()):
            cases.append(Malformed(route, "no required field", b"{}"))
        for name, spec in fields.items():
            value = wrong_value(spec["type"], release)
            if value is not None:
                cases.append(Malformed(route, f"{name} of a wrong type", json.dumps({name: value}).encode()))
    return cases


async def malformed_steps(steps: Steps) -> None:
    """Every case of :func:`malformed`, idle, into ``steps.out`` (a step each)."""
    for case in malformed(steps.release):
        await steps.call(f"POST {case.route} malformed: {case.what}", case.route, case.body,
                         headers={STATE_HEADER: MALFORMED})
