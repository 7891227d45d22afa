"""``python -m conformance``: the main job's command line (:mod:`conformance.cli`)."""

import sys

from .cli import main

sys.exit(main())
