"""Engine families, one row each: what the suite needs to fake a family, speak its wire and judge integrations on it.

A family is registered by one :class:`Family` row (:func:`register`): its dialect, its reference integration, how
the fake backend starts one of its engines, its mutants and, by name, its real engines (``gpu/``: the launch line,
the reset between scenarios, the weight reads, the installer and the differential), which sit above this layer and
load only when a real backend runs. Everything that differs by family reads its row; nothing branches on a family's
name. ``tests/test_families.py`` registers a third, invented family with one row and runs the main job on it."""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable

from fakes.facts import SGLANG, VLLM
from fakes.profiles import DEFAULT_PROFILE

if TYPE_CHECKING:
    from .dialect import Dialect


@dataclass(frozen=True)
class FakeOptions:
    """How the fake backend wants one engine: its id, speed (None: stepped by the backend), batch size, LoRA, seed and
    release profile (families without profiles ignore it)."""

    engine_id: str
    tokens_per_second: float | None
    max_running_requests: int
    enable_lora: bool
    seed: int
    profile: str


@dataclass(frozen=True)
class Family:
    """One engine family."""

    name: str
    label: str
    """How it is named to users (``SGLang``, ``vLLM``)."""
    dialect_spec: str
    """How its wire maps to the suite's vocabulary (``module:attribute``, a :class:`conformance.dialect.Dialect`;
    loaded on use, so that choosing among the families imports none of them)."""
    reference: str
    """The integration the suite runs on it when none is chosen (``module:attribute``)."""
    fake: Callable[[FakeOptions], Any]
    """Starts one fake engine (an object with an ASGI ``app``)."""
    mutants: str
    """Its mutants (``module:attribute``, a dict name → ``Mutant``; loaded on use)."""
    release: Callable[[str], str]
    """The release the fake behaves as, given ``--profile`` (SGLang: that profile; others: their newest release)."""
    profiles: bool = False
    """The fake takes SGLang release profiles (``--profile``, ``--profiles``); otherwise its wire is recorded in the
    suite's vocabulary."""
    real: str | None = None
    """Its real engines (``module:attribute``, a :class:`gpu.families.RealFamily`; loaded on use), or None."""

    @property
    def dialect(self) -> Dialect:
        return load(self.dialect_spec)

    def recorded_profile(self, profile: str) -> str:
        """The SGLang release its wire is recorded as (the suite's vocabulary is the default profile's:
        ``conformance.dialect.VOCABULARY_PROFILE``)."""
        return profile if self.profiles else DEFAULT_PROFILE

    def engine_label(self, profile: str) -> str:
        """The engines its fake behaves as: ``SGLang 0.5.23``, ``vLLM 0.32.0``."""
        return f"{self.label} {self.release(profile)}"

    def load_mutants(self) -> dict[str, Any]:
        return load(self.mutants)

    def load_real(self) -> Any:
        if self.real is None:
            raise ValueError(f"engine family {self.name!r} has no real engines here (only its fake)")
        return load(self.real)


def load(spec: str) -> Any:
    """``module:attribute``, imported."""
    module, _, attribute = spec.partition(":")
    return getattr(importlib.import_module(module), attribute)


def _fake_sglang(o: FakeOptions) -> Any:
    from fakes.engine import FakeEngine

    return FakeEngine(profile=o.profile, tokens_per_second=o.tokens_per_second,
                      max_running_requests=o.max_running_requests, enable_lora=o.enable_lora, seed=o.seed,
                      engine_id=o.engine_id)


def _fake_vllm(o: FakeOptions, **launch: Any) -> Any:
    """One fake vLLM server as the suite launches real ones (``launch``: more of its flags, e.g.
    ``data_parallel_size``)."""
    from fakes.vllm import FakeVLLMEngine

    return FakeVLLMEngine(tokens_per_second=o.tokens_per_second, max_num_seqs=o.max_running_requests,
                          enable_lora=o.enable_lora, enable_scale_out=True, seed=o.seed, engine_id=o.engine_id,
                          weight_transfer_config='{"backend": "gloo"}', enable_prompt_tokens_details=True, **launch)


FAMILIES: dict[str, Family] = {}
"""Family name → row, in registration order (the first is the default)."""


def register(family: Family) -> Family:
    """Add ``family`` (a name already registered is replaced); returns it."""
    FAMILIES[family.name] = family
    return family


def family(name: str) -> Family:
    """The row of ``name``, or a clear error naming the known ones."""
    try:
        return FAMILIES[name]
    except KeyError:
        raise ValueError(f"unknown engine family {name!r}; known: {', '.join(FAMILIES)}") from None


SGLANG_FAMILY = register(Family(
    "sglang", SGLANG.name, "conformance.dialect:SGLANG_DIALECT", "conformance.reference:integration", _fake_sglang, "conformance.mutants:MUTANTS",
    release=lambda profile: profile, profiles=True, real="gpu.families:SGLANG_REAL"))
VLLM_FAMILY = register(Family(
    "vllm", VLLM.name, "conformance.dialect:VLLM_DIALECT", "conformance.reference:vllm", _fake_vllm, "conformance.mutants:VLLM_MUTANTS",
    release=lambda _: VLLM.default_release, real="gpu.families:VLLM_REAL"))
DEFAULT_FAMILY = SGLANG_FAMILY.name
