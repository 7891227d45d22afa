"""The project's import graph: no circle (type-only and function-level imports count) and no import up a layer.

Layers, bottom to top: ``fakes`` (vendorable, imports nothing of ours) < ``conformance`` < ``gpu``, ``reports``
(peers) < ``weightsync_conformance`` (the plugin and the command line, which wire the others together). A
``__main__`` module is an entry point (``python -m``), never imported, so it sits on the top floor.
"""

from __future__ import annotations

import ast
import functools
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LAYERS = {"fakes": 0, "conformance": 1, "gpu": 2, "reports": 2, "weightsync_conformance": 3}
TOP = max(LAYERS.values())

pytestmark = pytest.mark.cpu


def _modules() -> dict[str, Path]:
    found = {}
    for package in LAYERS:
        for path in (ROOT / package).rglob("*.py"):
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def _imports(name: str, path: Path, known: dict[str, Path]) -> set[str]:
    """The project modules ``name`` imports anywhere in its text (``from pkg import mod`` names ``pkg.mod``)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join(up + ([base] if base else []))
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names]
        else:
            continue
        for target in targets:
            while target and target not in known:
                target = target.rpartition(".")[0]
            if target and target != name:
                out.add(target)
    return out


def _layer(module: str) -> int:
    return TOP if module.rpartition(".")[2] == "__main__" else LAYERS[module.split(".")[0]]


@functools.cache
def _graph() -> dict[str, set[str]]:
    known = _modules()
    return {name: _imports(name, path, known) for name, path in known.items()}


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on.add(root)
        while work:
            v, edges = work[-1]
            w = next(edges, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(sorted(graph[w]))))
                elif w in on:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                component = []
                while True:
                    w = stack.pop()
                    on.discard(w)
                    component.append(w)
                    if w == v:
                        break
                if len(component) > 1:
                    out.append(sorted(component))
    return out


def test_the_graph_reads_the_project() -> None:
    graph = _graph()
    assert "weightsync_conformance.plugin" in graph and "fakes.engine" in graph
    assert "fakes.app" in graph["fakes.engine"]  # the reader sees ``from .app import make_app``
    assert "reports.collect" in graph["weightsync_conformance.plugin"]  # ... and function-level imports


def test_no_import_circle() -> None:
    assert _cycles(_graph()) == []


def test_the_cycle_finder_finds_one() -> None:
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_no_import_runs_up_a_layer() -> None:
    graph = _graph()
    upward = sorted(f"{a} -> {b}" for a, targets in graph.items() for b in targets if _layer(b) > _layer(a))
    assert upward == []


def test_nothing_imports_an_entry_point() -> None:
    graph = _graph()
    assert sorted(f"{a} -> {b}" for a, targets in graph.items() for b in targets if b.endswith("__main__")) == []
