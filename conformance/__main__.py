"""``python -m conformance``: the command line of the top floor (``weightsync_conformance.cli``).

An entry point only (nothing imports it), so it may reach the floor that wires the suite, the reports and the GPU
backend together.
"""

import sys

from weightsync_conformance.cli import main

sys.exit(main())
