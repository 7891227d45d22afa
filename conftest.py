"""This repository's own test run: the plugin, also when not pip-installed (Hypothesis profiles: tests/conftest.py,
so the main job, run from here, does not import Hypothesis)."""

from __future__ import annotations

from weightsync_conformance.cli import PLUGIN, plugin_installed

pytest_plugins = [] if plugin_installed() else [PLUGIN]
