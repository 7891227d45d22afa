"""This repository's own test run: the plugin, also when not pip-installed (Hypothesis profiles: tests/conftest.py,
so the main job, run from here, does not import Hypothesis)."""

from __future__ import annotations

import sys

from weightsync_conformance.cli import PLUGIN, plugin_installed

pytest_plugins = [] if plugin_installed() else [PLUGIN]

sys.dont_write_bytecode = False
"""Bytecode is cached for this repository's modules and tests even where ``PYTHONDONTWRITEBYTECODE`` is set: each of
the README command's xdist workers collects every test module, and recompiling (and re-rewriting the asserts of)
them all costs each worker 2.6 s of CPU, on a 2-core machine a tenth of the run (``benchmarks/suite_speed.py``)."""
