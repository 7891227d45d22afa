"""The top floor: the pytest plugin (``weightsync_conformance.plugin``, the ``pytest11`` entry point) and the command
line (``python -m conformance``, ``weightsync_conformance.cli``), which wire the conformance core, the reports and the
GPU backend together. Nothing below imports this package.
"""
