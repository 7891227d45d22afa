"""The shape of one engine family's facts (:class:`EngineFamily`) and the one version parser.

Generic: nothing here names an engine. A family's table (``fakes.facts.sglang``) is plain data of these types.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping

_LEADING_DIGITS = re.compile(r"\d+")


def parse_version(text: Any) -> tuple[int, ...]:
    """A release label as a comparable tuple: ``"0.5.15.post1"`` → ``(0, 5, 15)`` (a post or rc suffix ends it);
    ``()`` when there is no version (an engine that does not say). A tuple passes through."""
    if isinstance(text, tuple):
        return text
    parts: list[int] = []
    for part in str(text or "").split("."):
        digits = _LEADING_DIGITS.match(part)
        if digits is None:
            break
        parts.append(int(digits.group()))
        if digits.end() < len(part):  # "10rc1": the suffix ends the release number
            break
    return tuple(parts)


def newest_not_newer(labels: Iterable[str], version: str) -> str | None:
    """The newest of ``labels`` not newer than ``version`` (``version`` itself when listed); None when every one is
    newer: how a snapshot taken at some releases answers for any release."""
    labels = list(labels)
    if version in labels:
        return version
    older = sorted((v for v in labels if parse_version(v) <= parse_version(version)), key=parse_version)
    return older[-1] if older else None


@dataclass(frozen=True)
class Fact:
    """One behaviour of the engine and the releases it changed in."""

    doc: str
    source: str
    """Where it lives in the engine's source tree."""
    steps: tuple[tuple[str, Any], ...]
    """``(first release, value)``, oldest first."""

    def at(self, version: str | tuple[int, ...]) -> Any:
        """The value on ``version``; the newest for an unknown version (``()``), the oldest before every step."""
        v = parse_version(version)
        if not v:
            return self.steps[-1][1]
        value = self.steps[0][1]
        for since, step in self.steps:
            if v >= parse_version(since):
                value = step
        return value

    def since(self, value: Any) -> str:
        """The first release whose value is ``value`` (``KeyError`` when no step has it)."""
        for release, step in self.steps:
            if step == value:
                return release
        raise KeyError(value)


@dataclass(frozen=True)
class Answer:
    """How the engine answers one kind of failure: the HTTP status and the message (a ``str.format`` template)."""

    status: int
    message: str
    source: str
    """Where the engine writes it."""

    def text(self, **values: Any) -> str:
        """The message with its ``{placeholders}`` filled."""
        return self.message.format(**values)


@dataclass(frozen=True)
class Release:
    """One release row of a family: a release the fake can behave as."""

    label: str
    real_on_cpu: bool = False
    """Whether the real engine of this release installs and serves on a CPU-only machine (``gpu.sglang_cpu``)."""
    lora_on_cpu: bool = False
    """Whether it was measured serving LoRA there (host memory unpinned, the torch-native LoRA backend)."""


@dataclass(frozen=True)
class EngineFamily:
    """Everything the fake and the suite know about one engine family, per release."""

    name: str
    """How messages name the engine (``"SGLang"``)."""
    rows: tuple[Release, ...]
    """The releases the fake behaves as, oldest first; the last is the default."""
    facts: Mapping[str, Fact]
    """Fact name → the behaviour and the releases it changed in."""
    answers: Mapping[str, Answer]
    """Failure kind → how the engine answers it."""
    load_failure_kills: Mapping[str, str]
    """Transport → why a weight load over it that raises kills the server instead of answering (every release)."""
    keep_alive_s: float
    """How long the engine's HTTP server keeps an idle connection open before closing it."""
    keep_alive_source: str
    """Where that limit is set in the engine."""
    sources: str = field(default="")
    """The engine's repository, which the ``source`` paths are relative to."""

    @property
    def releases(self) -> tuple[str, ...]:
        """The release labels, oldest first."""
        return tuple(r.label for r in self.rows)

    @property
    def default_release(self) -> str:
        """The release the fake behaves as unless told otherwise: the newest it knows."""
        return self.rows[-1].label

    @property
    def cpu_releases(self) -> tuple[str, ...]:
        """The releases whose real engine runs on a CPU-only machine, oldest first."""
        return tuple(r.label for r in self.rows if r.real_on_cpu)

    @property
    def lora_cpu_releases(self) -> tuple[str, ...]:
        """The releases whose real engine was measured serving LoRA on a CPU-only machine, oldest first."""
        return tuple(r.label for r in self.rows if r.lora_on_cpu)

    def fact(self, name: str, version: str | tuple[int, ...]) -> Any:
        """The value of fact ``name`` on ``version`` (``KeyError`` for a fact not in the table)."""
        return self.facts[name].at(version)

    def answer(self, kind: str) -> Answer:
        """How the engine answers failure ``kind`` (``KeyError`` for a kind not in the table)."""
        return self.answers[kind]

    def sorted(self, labels: Any) -> list[str]:
        """``labels`` oldest first."""
        return sorted(labels, key=parse_version)
