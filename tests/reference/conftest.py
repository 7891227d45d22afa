"""The ``rig`` fixture of the reference integration's unit tests (helpers: ``reference_rig.py``)."""

from __future__ import annotations

from pathlib import Path

import pytest_asyncio

from reference_rig import Rig


@pytest_asyncio.fixture
async def rig(tmp_path: Path):
    rig = Rig(tmp_path)
    try:
        yield rig
    finally:
        await rig.close()
