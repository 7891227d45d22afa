"""This repository's own test run: the plugin (also when not pip-installed) and Hypothesis profiles."""

from __future__ import annotations

import os

from hypothesis import HealthCheck, settings

from weightsync_conformance.cli import PLUGIN, plugin_installed

pytest_plugins = [] if plugin_installed() else [PLUGIN]

settings.register_profile("dev", max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("ci", max_examples=25, deadline=None, derandomize=True,
                          suppress_health_check=[HealthCheck.too_slow], print_blob=True)
settings.register_profile("nightly", max_examples=300, stateful_step_count=100, deadline=None)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci" if os.environ.get("CI") else "dev"))
