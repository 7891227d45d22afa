"""vLLM's error answers: the ``ErrorResponse`` body and the failures of the facts table (``fakes.facts.VLLM``)."""

from __future__ import annotations

from typing import Any

from ..asgi import Reply
from ..facts import VLLM


def error_body(status: int, message: str, err_type: str | None = None, param: str | None = None) -> dict[str, Any]:
    """vLLM's ``ErrorResponse`` (``entrypoints/serve/engine/protocol.py``): HTTP exceptions take the status phrase as
    ``type`` (``exception_handling/handlers/http.py``)."""
    from http import HTTPStatus

    return {"error": {"message": message, "type": err_type or HTTPStatus(status).phrase, "param": param,
                      "code": status}}


def error_reply(status: int, message: str, err_type: str | None = None, param: str | None = None) -> Reply:
    return Reply(status, error_body(status, message, err_type, param))


def worker_failed(method: str, error: str) -> Reply:
    """A call the engine ran on its worker that raised: ``EngineCore`` answers the ``collective_rpc`` (or
    ``add_lora``...) with the error's text quoted (``v1/engine/core.py``, 0.32.0), the route a 500."""
    return error_reply(500, f"Call to {method} method failed: Worker failed with error '{error}', please check the "
                            f"stack trace above for the root cause", "InternalServerError")


_RAISED = frozenset({"invalid_json", "missing_rpc_method", "compare_needs_baseline"})
"""Answers a route raises as FastAPI's ``HTTPException``: their ``type`` is the status phrase (``Bad Request``);
the others are ``create_error_response`` bodies typed by kind (``BadRequestError``...)."""


def answer(kind: str, param: str | None = None, **values: Any) -> Reply:
    """The reply of failure ``kind`` of the facts table (``param``: the request field it names)."""
    answer = VLLM.answer(kind)
    types = {400: "BadRequestError", 403: "PermissionDeniedError", 404: "NotFoundError", 500: "InternalServerError"}
    return error_reply(answer.status, answer.text(**values), None if kind in _RAISED else types.get(answer.status),
                       param)
