"""The suite's prompts: a data source that remembers what it handed out, so which prompt a request is for is looked
up in that record, never parsed out of the request's text."""

from __future__ import annotations

import itertools
import threading
from dataclasses import dataclass, field
from typing import Any

from .interface import Prompt

TEMPLATE = "Prompt {i} (seed {seed}): solve the task and explain."
"""The scenarios' prompt text (``i``: the prompt's index, ``seed``: the run's seed)."""


@dataclass
class PromptBook:
    """The prompts handed out in one run: index by text (plain data: it travels with a history)."""

    by_text: dict[str, int] = field(default_factory=dict)
    lengths: list[int] = field(default_factory=list)
    """The texts' lengths, longest first."""

    def add(self, prompt: Prompt) -> None:
        self.by_text[prompt.text] = prompt.index
        if len(prompt.text) not in self.lengths:
            self.lengths = sorted({*self.lengths, len(prompt.text)}, reverse=True)

    def index_of(self, text: Any) -> int | None:
        """The index of the prompt ``text`` is, or starts with (a later turn carries the earlier ones); None when
        it is no prompt handed out here."""
        if not isinstance(text, str):
            return None
        for n in self.lengths:
            found = self.by_text.get(text[:n])
            if found is not None:
                return found
        return None


class PromptSource:
    """A thread-safe data source (``BuildEnv.prompts``): prompt ``i`` is ``template`` formatted with ``i`` and
    ``seed``; each prompt handed out goes into :attr:`book`."""

    def __init__(self, seed: int, template: str = TEMPLATE, book: PromptBook | None = None) -> None:
        self.seed, self.template = seed, template
        self.book = PromptBook() if book is None else book
        self._counter, self._lock = itertools.count(), threading.Lock()

    def __call__(self) -> Prompt:
        with self._lock:
            i = next(self._counter)
            prompt = Prompt(i, self.template.format(i=i, seed=self.seed))
            self.book.add(prompt)
        return prompt
