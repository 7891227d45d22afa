"""The top floor: the pytest plugin (``weightsync_conformance.plugin``, the ``pytest11`` entry point), which wires
the conformance core, the reports and the GPU backend into pytest, and ``python -m weightsync_conformance`` (the main
job's command line, :mod:`conformance.cli`). Nothing below imports this package.
"""
