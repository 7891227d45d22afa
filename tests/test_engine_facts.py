"""Engine facts live in one table per family (``fakes.facts``): no release label is written in the package's code
outside it, versions are parsed once, and the copies of the table's answers not yet switched to it agree with it.

A release literal counts wherever it can reach behaviour or output: any string in the code (an f-string's parts
too) and the docstring of a module that prints its ``__doc__`` (help text). A bare string statement elsewhere
(a docstring) and a comment only cite a source release, and are allowed.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from conformance.interface import ALL_TRANSPORTS, KEEPALIVE_EXPIRY_S
from fakes.facts import FAMILIES, SGLANG, parse_version

pytestmark = pytest.mark.cpu

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("conformance", "fakes", "gpu", "weightsync_conformance", "reports", "benchmarks")
TABLES = ROOT / "fakes" / "facts"
RELEASE = re.compile(r"0\.5\.\d+")



def _sources() -> list[Path]:
    return [p for pkg in PACKAGES for p in sorted((ROOT / pkg).rglob("*.py")) if TABLES not in p.parents]


def _release_literals(path: Path) -> list[str]:
    """``line: text`` of every string in ``path`` that can reach behaviour or output and names a release."""
    tree = ast.parse(path.read_text(), str(path))
    cited = {id(n.value) for n in ast.walk(tree) if isinstance(n, ast.Expr) and isinstance(n.value, ast.Constant)}
    if any(isinstance(n, ast.Name) and n.id == "__doc__" for n in ast.walk(tree)):
        cited.discard(id(tree.body[0].value) if tree.body and isinstance(tree.body[0], ast.Expr) else None)
    return [f"{n.lineno}: {RELEASE.search(n.value).group()}" for n in ast.walk(tree)
            if isinstance(n, ast.Constant) and isinstance(n.value, str) and id(n) not in cited
            and RELEASE.search(n.value)]


def test_no_release_literal_outside_the_tables() -> None:
    found = {p.relative_to(ROOT).as_posix(): hits for p in _sources() if (hits := _release_literals(p))}
    assert found == {}


def test_the_scan_sees_code_and_printed_help_but_not_citations(tmp_path: Path) -> None:
    module = tmp_path / "m.py"
    module.write_text('"""Usage: --release 0.5.1."""\n# 0.5.2 in a comment\nX = f"on {1} 0.5.3"\n'
                      'def f():\n    """0.5.4 cited."""\n    return __doc__\n')
    assert _release_literals(module) == ["1: 0.5.1", "3: 0.5.3"]
    module.write_text('"""Cited: 0.5.1."""\nY = 1\n"""0.5.2: an attribute docstring."""\n')
    assert _release_literals(module) == []


def _parses_versions(tree: ast.AST) -> list[int]:
    """Lines that turn the parts of a ``.split(".")`` into ints: a version parser (or a copy of one)."""
    hits = []
    for node in ast.walk(tree):
        loops = node.generators if isinstance(node, (ast.GeneratorExp, ast.ListComp, ast.SetComp)) else \
            [node] if isinstance(node, ast.For) else []
        for loop in loops:
            split = loop.iter
            if not (isinstance(split, ast.Call) and isinstance(split.func, ast.Attribute)
                    and split.func.attr == "split" and split.args and isinstance(split.args[0], ast.Constant)
                    and split.args[0].value == "."):
                continue
            if any(isinstance(c, ast.Call) and isinstance(c.func, ast.Name) and c.func.id == "int"
                   for c in ast.walk(node)):
                hits.append(node.lineno)
    return hits


def test_one_version_parser() -> None:
    copies = {p.relative_to(ROOT).as_posix(): hits for p in _sources()
              if (hits := _parses_versions(ast.parse(p.read_text(), str(p))))}
    assert copies == {}
    assert _parses_versions(ast.parse((TABLES / "family.py").read_text())) != []  # the detector finds the one


@pytest.mark.parametrize("family", FAMILIES.values(), ids=list(FAMILIES))
def test_a_family_table_is_whole(family) -> None:
    assert family.releases == tuple(family.sorted(family.releases)) and len(set(family.releases)) == len(family.rows)
    assert family.default_release == family.releases[-1]
    assert set(family.cpu_releases) <= set(family.releases)
    assert set(family.load_failure_kills) <= ALL_TRANSPORTS and all(family.load_failure_kills.values())
    assert KEEPALIVE_EXPIRY_S < family.keep_alive_s
    for kind, answer in family.answers.items():
        assert 400 <= answer.status < 600 and answer.message and answer.source, kind
    for name, fact in family.facts.items():
        since = [parse_version(s) for s, _ in fact.steps]
        assert since == sorted(since), name


def test_the_readers_read_the_table() -> None:
    from fakes.profiles import DEFAULT_PROFILE, PROFILES
    from gpu import sglang_cpu

    assert tuple(PROFILES) == SGLANG.releases and DEFAULT_PROFILE == SGLANG.default_release
    assert sglang_cpu.RELEASES == SGLANG.cpu_releases


def _strings(path: Path) -> list[str]:
    """Every string ``path`` writes (an f-string with ``{}`` for what it fills in)."""
    tree = ast.parse(path.read_text(), str(path))
    inner = {id(v) for n in ast.walk(tree) if isinstance(n, ast.JoinedStr) for v in n.values}
    return ["".join(v.value if isinstance(v, ast.Constant) else "{}" for v in n.values) if isinstance(n, ast.JoinedStr)
            else n.value for n in ast.walk(tree) if id(n) not in inner and (
                isinstance(n, ast.JoinedStr) or isinstance(n, ast.Constant) and isinstance(n.value, str))]


def _chunks(template: str) -> list[str]:
    return [c for c in re.split(r"\{\w+\}", template) if len(c.strip(" .\n")) >= 8]


@pytest.mark.parametrize("kind", sorted(SGLANG.answers))
def test_the_fake_answers_from_the_table(kind: str) -> None:
    """The fake's weight updates read each answer from ``SGLANG.answers`` by its kind, and write no copy of it."""
    strings = _strings(ROOT / "fakes" / "weight_updates.py")
    assert kind in strings
    assert [c for c in _chunks(SGLANG.answer(kind).message) if any(c in s for s in strings)] == []


def test_the_fake_writes_the_table_s_answers() -> None:
    from fakes import weight_updates as wu

    error = ValueError("boom")
    assert [wu._disk_failure(error, stage) for stage in ("loader", "iterator", "load", "other")] == [
        SGLANG.answer(k).text(error=error) for k in ("disk_loader", "disk_iterator", "disk_load", "disk_load")]
    assert wu._partial_update_message(error) == SGLANG.answer("distributed_partial").text(error="boom")
    assert wu.FLUSH_AFTER_UPDATE_ERROR == SGLANG.answer("post_update_flush").message
    assert wu.FLUSH_AFTER_UPDATE_ASSERT == SGLANG.answer("post_update_flush_crash").message


def test_the_fake_keeps_connections_as_the_table_says() -> None:
    from fakes.serving import KEEP_ALIVE_S

    assert KEEP_ALIVE_S == SGLANG.keep_alive_s
