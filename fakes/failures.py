"""How a fake engine fails and answers errors: ``EngineCrashed`` / ``EngineClosed``, SGLang's error bodies, and the
``flush_fail`` fault scope (every cache flush during one HTTP call fails)."""

from __future__ import annotations

import contextlib
import contextvars
from typing import Any, Iterator

from .asgi import Reply

_flush_fault: contextvars.ContextVar[bool] = contextvars.ContextVar("fake_sglang_flush_fault", default=False)


@contextlib.contextmanager
def flush_fault_scope(active: bool) -> Iterator[None]:
    """Make every cache flush inside this block fail (a ``flush_fail`` fault on the current call)."""
    token = _flush_fault.set(active)
    try:
        yield
    finally:
        _flush_fault.reset(token)


class EngineCrashed(RuntimeError):
    """The fake's SGLang process died (scheduler assert, injected crash)."""


class EngineClosed(RuntimeError):
    """The engine was shut down."""


def error_reply(status: int, message: str) -> Reply:
    """``_create_error_response``: ``{"error": {"message": ...}}`` (entrypoints/http_server.py)."""
    return Reply(status, {"error": {"message": message}})


def success_reply(ok: bool, body: dict[str, Any]) -> Reply:
    """200 when ``ok``, else 400, with ``body``."""
    return Reply(200 if ok else 400, body)
