"""The table of SGLang facts (``fakes.facts.SGLANG``) exists once and is read: every fact is used, the fake's
profiles, the checkers' reading of the wire and the reference integration's adaptations agree on it, and the
default release is spelt once."""

from __future__ import annotations

import ast
import re
from dataclasses import fields
from pathlib import Path

import pytest

from conformance.checks.effective import pause_takes_mode
from conformance.reference.releases import Release
from fakes import structs
from fakes.profiles import DEFAULT_PROFILE, PROFILES, Profile
from fakes.facts import SGLANG, parse_version

FACTS, RELEASES, fact = SGLANG.facts, SGLANG.releases, SGLANG.fact

pytestmark = pytest.mark.cpu

ROOT = Path(__file__).resolve().parents[2]
SOURCES = [p for pkg in ("fakes", "conformance", "gpu", "reports", "weightsync_conformance")
           for p in sorted((ROOT / pkg).rglob("*.py"))]
TABLES = ("fakes/profiles.py",)
"""The table's own modules (besides ``fakes/facts/``): a fact named there is not yet read."""
SNAPSHOT_TEST = ROOT / "tests" / "fakes" / "test_structs.py"
"""Where the facts the fake takes from its io_struct/http_server snapshots instead (routes, struct fields) are held
against those snapshots (``test_profiles_agree_with_the_snapshots``)."""
BETWEEN = ("0.5.6", "0.5.16", "0.5.22", "0.5.23.post1")
"""Releases the fake has no profile of, which the reference meets on real engines."""


def _read_in(text: str, name: str) -> bool:
    return re.search(rf"\.{name}\b|fact\(\"{name}\"", text) is not None


def test_every_fact_is_a_profile_switch_and_nothing_else_is() -> None:
    assert set(FACTS) == {f.name for f in fields(Profile)} - {"version"}


def test_every_fact_is_used() -> None:
    """Read by the fake, the checkers or the reference (``profile.NAME``, ``fact("NAME", …)``), or held against the
    snapshots of the released wheels."""
    code = "\n".join(p.read_text() for p in SOURCES if p.relative_to(ROOT).as_posix() not in TABLES
                     and p.parent != ROOT / "fakes" / "facts")
    snapshot_test = SNAPSHOT_TEST.read_text()
    unused = [name for name in FACTS if not _read_in(code, name) and f"p.{name}" not in snapshot_test]
    assert unused == []


def test_each_fact_names_where_it_lives_in_sglang_and_steps_forward() -> None:
    for name, f in FACTS.items():
        assert f.source.startswith("python/sglang/srt/") and f.doc, name
        since = [parse_version(s) for s, _ in f.steps]
        assert since == sorted(since) and len(set(since)) == len(since), name
        values = [v for _, v in f.steps]
        assert all(a != b for a, b in zip(values, values[1:])), name  # each step changes something


def test_a_fact_reads_at_any_release() -> None:
    assert fact("lora_from_tensors_field", "0.5.4") is None
    assert fact("lora_from_tensors_field", "0.5.22") == "serialized_tensors"
    assert fact("lora_from_tensors_field", "0.5.23.post1") == "serialized_named_tensors"
    assert fact("pause_modes", ()) is True  # an engine that does not say: the newest behaviour
    assert fact("destroy_group_route", "0.4.10") is False  # older than every step: the oldest


@pytest.mark.parametrize("version", RELEASES + BETWEEN)
def test_the_three_readers_agree(version: str) -> None:
    release = Release(parse_version(version))
    profile = PROFILES.get(version)
    assert release.pause_modes == pause_takes_mode(version) == fact("pause_modes", version)
    assert release.lora_tensor_field == fact("lora_from_tensors_field", version)
    if profile is not None:
        assert profile.pause_modes == release.pause_modes
        assert profile.lora_from_tensors_field == release.lora_tensor_field
        if profile.pause_modes:  # a retract pause exists: can a flush then succeed?
            assert release.flush_while_retracted == (not profile.flush_checks_waiting
                                                     or profile.flush_ignores_waiting_while_paused)


@pytest.mark.parametrize("version", RELEASES)
def test_the_table_says_what_the_released_wheels_have(version: str) -> None:
    assert fact("pause_modes", version) == structs.has_struct("PauseGenerationReqInput", version)
    lora = fact("lora_from_tensors_field", version)
    assert lora is None or lora in structs.struct_fields("LoadLoRAAdapterFromTensorsReqInput", version)


def test_the_default_release_is_spelt_once() -> None:
    """No default argument, field default or ``or`` fallback spells the default release: they say
    ``DEFAULT_PROFILE``."""
    spelt = []
    for path in SOURCES:
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            defaults: list[ast.AST] = []
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                defaults = [*node.args.defaults, *(d for d in node.args.kw_defaults if d is not None)]
            elif isinstance(node, ast.AnnAssign) and node.value is not None:
                defaults = [node.value]
            elif isinstance(node, ast.BoolOp) and isinstance(node.op, ast.Or):
                defaults = node.values[1:]
            spelt += [f"{path.relative_to(ROOT)}:{d.lineno}" for d in defaults
                      if isinstance(d, ast.Constant) and d.value == DEFAULT_PROFILE]
    assert spelt == []
    assert DEFAULT_PROFILE == RELEASES[-1] == SGLANG.default_release


@pytest.mark.parametrize("text, parsed", [("0.5.15.post1", (0, 5, 15)), ("0.5.23", (0, 5, 23)), ("", ()),
                                           (None, ()), ("0.5.10rc1", (0, 5, 10)), ("dev", ()), ((0, 5), (0, 5))])
def test_parse_version(text, parsed) -> None:
    assert parse_version(text) == parsed


def test_a_fact_says_since_when() -> None:
    assert FACTS["weight_update_sessions"].since(True) == RELEASES[-1]
    with pytest.raises(KeyError):
        FACTS["weight_update_sessions"].since("never")
