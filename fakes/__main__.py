"""`python -m fakes`: see `cli.py`."""

from .cli import main

raise SystemExit(main())
