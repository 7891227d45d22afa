"""Every check is registered once (``conformance.checks.registry``) and read from there: its id and title are
spelt once, no module keeps its own table of check ids, the README's invariant table is the registry's, and
scenarios and mutants naming an unknown check or invariant fail where they are defined."""

from __future__ import annotations

import ast
import functools
import re
from pathlib import Path

import pytest

from conformance.checks import CHECKS, REGISTRY
from conformance.checks.registry import check
from conformance.mutants import MUTANTS, Mutant
from conformance.scenarios import SCENARIOS, Needs, Scenario

pytestmark = pytest.mark.cpu

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("conformance", "fakes", "gpu", "reports", "weightsync_conformance")


@functools.lru_cache(maxsize=1)
def _sources() -> dict[Path, ast.AST]:
    """Every module of the packages, parsed once per process."""
    return {p: ast.parse(p.read_text(), str(p)) for pkg in PACKAGES for p in sorted((ROOT / pkg).rglob("*.py"))}


def _strings(tree: ast.AST) -> list[str]:
    """The string literals of a module, docstrings left out (prose may name a check)."""
    docs = {id(n.body[0].value) for n in ast.walk(tree)
            if isinstance(n, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and n.body
            and isinstance(n.body[0], ast.Expr) and isinstance(n.body[0].value, ast.Constant)}
    return [n.value for n in ast.walk(tree)
            if isinstance(n, ast.Constant) and isinstance(n.value, str) and id(n) not in docs]


def test_every_check_is_registered_in_the_readme_order_with_a_checker() -> None:
    assert list(REGISTRY) == ["I1-I2", "I3", "I4", "I6", "V1", "V2", "V3", "V4-S1", "S2", "S3", "P1", "P5", "P6",
                              "P7", "P8", "P9", "C2", "C3", "F3"]
    assert CHECKS == {c.id: c.run for c in REGISTRY.values()}


def test_each_title_is_spelt_once_in_the_source() -> None:
    titles = [c.title for c in REGISTRY.values()]
    assert len(set(titles)) == len(titles)
    strings = {p: _strings(tree) for p, tree in _sources().items()}
    for c in REGISTRY.values():
        spelt = [p.relative_to(ROOT).as_posix() for p, found in strings.items() for s in found
                 if s == c.title or c.name in s]
        assert spelt == ["conformance/checks/" + c.run.__module__.rpartition(".")[2] + ".py"], \
            f"the title of {c.id} ({c.title!r}) is spelt in {spelt}"


def test_no_module_keeps_its_own_table_of_check_ids() -> None:
    """A tuple, list, set or dict with two check ids or more is a table: none may hold one (a scenario's checks
    follow from the situations it builds). The checks a situation a run could not build leaves unknown
    (``Run.unmet``) are named where that is recorded."""
    tables = []
    for path, tree in _sources().items():
        unmet = {id(n.args[0]) for n in ast.walk(tree) if isinstance(n, ast.Call) and n.args
                 and isinstance(n.func, ast.Attribute) and n.func.attr == "unmet"}
        for node in ast.walk(tree):
            if isinstance(node, (ast.Tuple, ast.List, ast.Set, ast.Dict)) and id(node) not in unmet:
                items = node.keys if isinstance(node, ast.Dict) else node.elts
                ids = [i.value for i in items if isinstance(i, ast.Constant) and i.value in REGISTRY]
                if len(ids) > 1:
                    tables.append(f"{path.relative_to(ROOT)}:{node.lineno} {ids}")
    assert tables == []


def test_the_readme_invariant_table_is_the_registry() -> None:
    readme = (ROOT / "README.md").read_text()
    rows = [line for line in readme.splitlines() if re.match(r"^\| [IVSPCF]\d", line)]
    assert rows == [f"| {c.label} | {c.holds} | {c.reads} |" for c in REGISTRY.values()]


def test_the_readme_case_list_is_generated_from_the_needs() -> None:
    from conformance.cases import case_table

    readme = (ROOT / "README.md").read_text()
    start = readme.index("| scenario | builds")
    assert readme[start:start + len(case_table()) + 1] == case_table() + "\n", "regenerate: python -m conformance " \
        "--case-table"


def test_a_verdict_is_named_by_its_registration() -> None:
    from conformance.history import History

    v = REGISTRY["V4-S1"].run(History("s", "i", "fake", "0.5.23", 0))
    assert v.check == "V4/S1 never backwards" == REGISTRY["V4-S1"].name


def test_a_check_cannot_be_registered_twice() -> None:
    with pytest.raises(ValueError, match="registered twice"):
        check("I3", "again", holds="", reads="", needs={"cycle"})(lambda h: None)  # type: ignore[arg-type,return-value]


def test_a_check_needing_an_unknown_situation_fails_where_it_is_registered() -> None:
    with pytest.raises(ValueError, match=r"needs \['resdent'\] must name situations among"):
        check("I9", "typo", holds="", reads="",
              needs={"resdent"})(lambda h: None)  # type: ignore[arg-type,return-value]
    assert "I9" not in REGISTRY


def test_a_scenario_naming_an_unknown_situation_fails_where_it_is_defined() -> None:
    script = SCENARIOS["lora"].script
    with pytest.raises(ValueError, match=r"unknown situation\(s\) \['windw'\]"):
        Scenario("typo", "", script, ("resident", "windw"))
    with pytest.raises(TypeError, match="builds must be a tuple of situation names"):
        Scenario("a-string", "", script, "resident")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="needs must be a Needs"):
        Scenario("untyped", "", script, (), needs={"lora": True})  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        Needs(lorra=True)  # type: ignore[call-arg]


def test_needs_are_capabilities() -> None:
    from conformance.interface import Capabilities

    assert set(Needs.names()) <= set(Capabilities.__dataclass_fields__)
    assert Needs(lora=True).missing(Capabilities(lora=False)) == "integration does not declare capability 'lora'"


def test_a_mutant_expected_to_be_caught_by_an_unknown_invariant_fails_where_it_is_defined() -> None:
    m = MUTANTS["pause_abort"]
    with pytest.raises(ValueError, match=r"unknown invariant\(s\) or scenario\(s\) \['I9'\]"):
        Mutant("typo", m.bug, m.source, ("I9",), m.integration, m.shows_in)
