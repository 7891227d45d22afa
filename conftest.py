"""This repository's own test run: the plugin, also when not pip-installed (Hypothesis profiles: tests/conftest.py,
so the main job, run from here, does not import Hypothesis), and the short ``--nodes`` of the project's cluster
command (``pytest -m gpu --nodes 2``; adopters keep the plugin's namespaced ``--conformance-nodes``)."""

from __future__ import annotations

import compileall
import sys
from pathlib import Path

import pytest

from weightsync_conformance.cli import PLUGIN, plugin_installed

pytest_plugins = [] if plugin_installed() else [PLUGIN]

sys.dont_write_bytecode = False
"""Bytecode is cached for this repository's modules and tests even where ``PYTHONDONTWRITEBYTECODE`` is set: each of
the README command's xdist workers collects every test module, and recompiling (and re-rewriting the asserts of)
them all costs each worker 2.6 s of CPU, on a 2-core machine a tenth of the run (``benchmarks/suite_speed.py``)."""


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--nodes", type=int, default=None, metavar="N",
                     help="this repository's short --conformance-nodes: nodes of the GPU backend (-m gpu)")


PACKAGES = ("conformance", "fakes", "gpu", "weightsync_conformance", "examples", "benchmarks")


def compile_ahead(config: pytest.Config) -> None:
    """Before xdist starts its workers, this repository's modules are compiled and its test modules rewritten for
    assertions, once, into the caches the workers read: in a fresh clone each of the README command's six workers
    otherwise does it all itself (3.9 s of CPU each, 10 s of the command's wall time on 2 cores). Uses pytest's own
    rewriting (``_pytest.assertion.rewrite``, private): where that changes, the workers simply do it as before."""
    root = Path(config.rootpath)
    for package in PACKAGES:
        if (root / package).is_dir():
            compileall.compile_dir(root / package, quiet=2)
    try:
        from _pytest.assertion import rewrite

        state = config.stash[rewrite.assertstate_key]
        for fn in sorted((root / "tests").rglob("*.py")):
            if not (fn.name.startswith("test_") or fn.name == "conftest.py"):
                continue
            cache = rewrite.get_cache_dir(fn)
            pyc = cache / (fn.name[:-3] + rewrite.PYC_TAIL)
            if rewrite._read_pyc(fn, pyc) is None and rewrite.try_makedirs(cache):
                source_hash, code = rewrite._rewrite_test(fn, config)
                rewrite._write_pyc(state, code, source_hash, pyc)
    except (AttributeError, KeyError, TypeError, ImportError):
        return


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config: pytest.Config) -> None:
    if config.getoption("numprocesses", None) and not hasattr(config, "workerinput"):
        compile_ahead(config)
    nodes, namespaced = config.getoption("nodes"), config.getoption("conformance_nodes")
    if nodes is None:
        return
    if namespaced not in (1, nodes):  # 1: the plugin's default, not given
        raise pytest.UsageError(f"--nodes {nodes} and --conformance-nodes {namespaced} disagree: give one of them")
    config.option.conformance_nodes = nodes
