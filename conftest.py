"""This repository's own test run: the plugin, also when not pip-installed (Hypothesis profiles: tests/conftest.py,
so the main job, run from here, does not import Hypothesis), and the short ``--nodes`` of the project's cluster
command (``pytest -m gpu --nodes 2``; adopters keep the plugin's namespaced ``--conformance-nodes``)."""

from __future__ import annotations

import sys

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


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config: pytest.Config) -> None:
    nodes, namespaced = config.getoption("nodes"), config.getoption("conformance_nodes")
    if nodes is None:
        return
    if namespaced not in (1, nodes):  # 1: the plugin's default, not given
        raise pytest.UsageError(f"--nodes {nodes} and --conformance-nodes {namespaced} disagree: give one of them")
    config.option.conformance_nodes = nodes
