"""The suite's prompt record: which prompt a request is for is looked up in what was handed out, never parsed."""

from __future__ import annotations

import pytest

from conformance.history import History, WireCall
from conformance.prompts import PromptBook, PromptSource

pytestmark = pytest.mark.cpu


def test_a_request_is_looked_up_by_the_prompt_it_is_or_starts_with() -> None:
    source = PromptSource(seed=3)
    prompts = [source() for _ in range(12)]
    book = source.book
    assert [p.index for p in prompts] == list(range(12))
    assert book.index_of(prompts[1].text) == 1 and book.index_of(prompts[10].text) == 10
    assert book.index_of(prompts[1].text + " answer. tool: ok. next:") == 1, "a later turn carries the first"
    assert book.index_of("Prompt 1 (seed 3): something the suite never handed out") is None, "never parsed"
    assert book.index_of(None) is None and book.index_of(["a list"]) is None


def test_the_record_travels_with_the_history() -> None:
    source = PromptSource(seed=0, template="t{i}-{seed}", book=PromptBook())
    for _ in range(3):
        source()
    history = History("s", "i", "fake", "0.5.23", 0, prompts=source.book)
    call = _generate({"text": "t2-0 and more"})
    loaded = History.from_json(history.to_json())
    assert loaded.prompts == source.book and loaded.prompt_of(call) == 2
    assert loaded.prompt_of(_generate({"input_ids": [1]})) is None


def _generate(payload: dict) -> WireCall:
    return WireCall(seq=0, engine=0, method="POST", path="/generate", payload=payload, t_start=0.0)
