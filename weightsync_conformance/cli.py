"""The main job's command line, for ``python -m weightsync_conformance`` and the code that names it here: it lives
in :mod:`conformance.cli` (``python -m conformance``)."""

from conformance.cli import PLUGIN, main, plugin_installed

__all__ = ["PLUGIN", "main", "plugin_installed"]
