"""``python -m weightsync_conformance``: the same as ``python -m conformance``."""

import sys

from .cli import main

sys.exit(main())
