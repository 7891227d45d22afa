"""What a call on the wire means to SGLang: its body as the engine's handler sees it, per release.

A checker must judge the value SGLang acts on, not the keys the integration happened to send: a disk update that
leaves out ``flush_cache`` flushes (the field defaults to true), a bump without ``abort_all_requests`` aborts
every request (it defaults to true), a pause whose body has no ``mode`` (or any pause on ≤0.5.4, whose handler
takes no body) aborts too, and ``"false"`` (a string) reads as false under SGLang's lax validation. The values
come from the committed snapshots of SGLang's ``io_struct.py`` / ``http_server.py`` per release
(``fakes/snapshots``, the same data the fake validates with), so the checkers read them the way the real server
does, on any backend.
"""

from __future__ import annotations

import functools
from typing import Any

from fakes.facts import SGLANG

from ..history import History, WireCall

IMPLICIT: dict[tuple[str, str], Any] = {
    ("/pause_generation", "mode"): "abort",
    ("/update_weights_from_disk", "flush_cache"): True,
}
"""What SGLang does where its handler takes no such field at all: before 0.5.6 ``/pause_generation`` has no body and
always aborts (``python/sglang/srt/entrypoints/http_server.py`` 0.5.2:934; fact ``pause_modes`` of
``fakes.facts.SGLANG``); before 0.5.6 a disk update always flushes (no ``flush_cache``: fact ``disk_flush_cache_field``)."""


@functools.lru_cache(maxsize=None)
def _routes(profile: str) -> dict[str, Any]:
    from fakes.structs import endpoints

    return endpoints(profile)


def pause_takes_mode(profile: str) -> bool:
    """Whether SGLang ``profile``'s ``/pause_generation`` takes a mode (fact ``pause_modes``: ≥0.5.6); before, every
    pause aborts."""
    return bool(SGLANG.fact("pause_modes", profile))


def effective_body(call: WireCall, profile: str) -> dict[str, Any] | None:
    """The body SGLang ``profile`` acts on: defaults filled, values coerced; ``{}`` for a handler that takes no
    body; None when SGLang rejects it (400) or has no such route."""
    from fakes.structs import NO_BODY, RequestError, validate

    route = _routes(profile).get(call.path)
    if route is None:
        return None
    if route.get("struct") is None:
        return {}
    try:
        return validate(route["struct"], NO_BODY if call.payload is None else call.payload, profile)
    except (RequestError, KeyError):
        return None


def effective(call: WireCall, field: str, profile: str) -> Any:
    """The value of ``field`` SGLang ``profile`` acts on for ``call`` (None when it rejects the call)."""
    body = effective_body(call, profile)
    if body is None:
        return None
    return body[field] if field in body else IMPLICIT.get((call.path, field))


def sent_as(call: WireCall, field: str, profile: str) -> str:
    """How ``field`` came to have its effective value, for witnesses: as sent (the JSON value), SGLang's default
    (left out), or a handler that takes no such field on ``profile``; for a call another engine family's dialect
    translated (``WireCall.sent_as``), the call as the integration sent it."""
    if call.sent_as is not None:
        return f"sent as {call.sent_as}: {field} {effective(call, field, profile)!r} in the suite's vocabulary"
    payload = call.payload if isinstance(call.payload, dict) else {}
    body = effective_body(call, profile)
    if body is not None and field not in body:
        return f"SGLang {profile}'s handler takes no {field!r}"
    if field not in payload:
        return f"no {field!r} sent: SGLang's default"
    value = payload[field]
    coerced = "" if body is None or body.get(field) == value else f", which SGLang reads as {body.get(field)!r}"
    return f"{field}: {value!r} sent{coerced}"


def pause_mode(call: WireCall, profile: str) -> str | None:
    """The mode SGLang ``profile`` pauses in for the ``/pause_generation`` ``call`` (None where it rejects the body)."""
    mode = effective(call, "mode", profile)
    return mode if isinstance(mode, str) else None


def pause_modes_shown(h: History) -> set[str | None]:
    """The mode SGLang read off each pause the integration's engines accepted."""
    return {pause_mode(pause, h.profile) for engine in {w.engine for w in h.integration_calls()}
            for pause, _ in h.pause_windows(engine)}
