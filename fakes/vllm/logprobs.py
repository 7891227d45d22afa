"""Sample logprobs as vLLM 0.32.0 answers them: the request field's checks and both routes' shapes.

``/v1/completions`` takes ``logprobs`` (int) and answers the OpenAI completion shape (``tokens``, ``token_logprobs``,
``top_logprobs``, ``text_offset``: ``entrypoints/openai/completion/serving.py`` ``_create_completion_logprobs``);
``/inference/v1/generate`` takes ``sampling_params.logprobs`` and answers ``{"content": [{token_id, logprob, rank,
top_logprobs: [...]}]}`` (``entrypoints/scale_out/token_in_token_out/serving.py`` ``_create_tokens_logprobs``).
Per position the engine holds a dict, sampled token first, then the top-k (``logprobs.py``
``append_logprobs_for_next_position``): a sampled token that is also top-1 is one entry. The fake's decode is
deterministic, so its sampled token is always rank 1; the values are deterministic floats <= 0, falling with rank.
"""

from __future__ import annotations

from typing import Any, Callable

from ..asgi import Reply
from .errors import error_reply

MAX_LOGPROBS = 20
"""``--max-logprobs``'s default (``ModelConfig.max_logprobs``, 0.32.0)."""
_PRINTABLE = range(32, 127)


def _validation_error(message: str, value: Any) -> Reply:
    """A ``VLLMValidationError`` with ``parameter="logprobs"`` as the route answers it (``exceptions.py``: the
    message carries ``(parameter=..., value=...)``; ``serve/exception_handling/error_response.py``: 400)."""
    suffix = "(parameter=logprobs" + (f", value={value})" if value is not None else ")")
    return error_reply(400, f"{message} {suffix}", "BadRequestError", "logprobs")


def completion_request_error(value: Any) -> Reply | None:
    """``CompletionRequest.check_logprobs`` (a ``mode="before"`` validator, run as the body is parsed): a value that
    is no number, or a negative one other than -1. (A fractional one fails the field's ``int`` afterwards:
    :func:`fractional`.)"""
    if value is None:
        return None
    if not isinstance(value, (int, float)):
        return _validation_error("`logprobs` must be an integer.", value)
    if value < 0 and value != -1:
        return _validation_error("`logprobs` must be a positive value or -1.", value)
    return None


def fractional(value: Any) -> bool:
    """A float pydantic's lax ``int`` refuses (``int_from_float``); a whole one (``2.0``) is taken as an int."""
    return isinstance(value, float) and not value.is_integer()


def sampling_params_error(value: Any) -> Reply | None:
    """``SamplingParams._verify_args`` (``sampling_params.py``): a negative ``logprobs`` other than -1, refused
    before the request is streamed or queued."""
    if value is not None and value != -1 and value < 0:
        return _validation_error(f"logprobs must be non-negative or -1, got {value}.", value)
    return None


def over_limit(k: int | None, vocab_size: int, max_logprobs: int = MAX_LOGPROBS) -> Reply | None:
    """``SamplingParams._validate_logprobs``, run by the engine's input processor (after the model and prompt checks;
    a streamed request has its 200 by then and gets this body as an SSE event instead): -1 asks for the whole
    vocabulary, and ``--max-logprobs -1`` allows it."""
    if not k:
        return None
    max_logprobs = vocab_size if max_logprobs == -1 else max_logprobs
    asked = vocab_size if k == -1 else k
    if asked > max_logprobs:
        return _validation_error(f"Requested sample logprobs of {asked}, which is greater than max allowed: "
                                 f"{max_logprobs}", asked)
    return None


def candidates(token: int, position: int, k: int, vocab_size: int) -> list[tuple[int, float, int]]:
    """One position's ``(token_id, logprob, rank)`` in the engine's order: the sampled token (rank 1), then the rest
    of the top ``k`` (``-1``: the whole vocabulary; ``0``: the sampled token alone)."""
    width = max(vocab_size if k == -1 else k, 1)
    others = [t for t in (*(_PRINTABLE[(token - 32 + j) % len(_PRINTABLE)] for j in range(1, len(_PRINTABLE))),
                          *(t for t in range(vocab_size) if t not in _PRINTABLE)) if t != token]
    top = -(0.05 + ((token * 31 + position * 17) % 97) / 40.0)
    return [(t, round(top - 0.5 * rank, 6), rank + 1) for rank, t in enumerate([token, *others][:width])]


def completion_logprobs(ids: list[int], k: int, vocab_size: int, decode: Callable[[list[int]], str],
                        start: int = 0, text_offset: int = 0) -> dict[str, Any]:
    """``CompletionLogProbs`` of output tokens ``ids`` (the first at output position ``start``): ``top_logprobs`` keeps
    the first ``k + 1`` entries keyed by decoded token (tokens decoding alike collapse, as on vLLM); ``text_offset``
    is absolute (a stream carries it across chunks)."""
    tokens, logprobs, tops, offsets = [], [], [], []
    for i, token in enumerate(ids):
        entries = candidates(token, start + i, k, vocab_size)
        text = decode([token])
        offsets.append(text_offset)
        text_offset += len(text)
        tokens.append(text)
        logprobs.append(entries[0][1])
        top: dict[str, float] = {}
        for index, (t, value, _) in enumerate(entries):
            if k == -1 or k >= index:
                top[decode([t])] = value
        tops.append(top)
    return {"text_offset": offsets, "token_logprobs": logprobs, "tokens": tokens, "top_logprobs": tops}


def generate_logprobs(ids: list[int], k: int, vocab_size: int, start: int = 0) -> dict[str, Any]:
    """``GenerateLogProbs`` of output tokens ``ids``: integer token ids, ``top_logprobs`` the first ``max(k, 1)``
    entries (``-1``: all)."""
    content = []
    for i, token in enumerate(ids):
        entries = candidates(token, start + i, k, vocab_size)
        top = entries if k == -1 else entries[:max(k, 1)]
        content.append({"token_id": token, "logprob": entries[0][1], "rank": entries[0][2],
                        "top_logprobs": [{"token_id": t, "logprob": v, "rank": r} for t, v, r in top]})
    return {"content": content}
