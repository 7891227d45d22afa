"""An integration that hangs for good in one scenario: its manager's start swallows cancellation when the scenario
runs with a staleness bound (used by ``tests/test_hangs.py`` through the plugin, as a user would run it)."""

from __future__ import annotations

import asyncio

from conformance.reference import ReferenceIntegration, ReferenceManager


class StuckWithABound(ReferenceManager):
    async def start(self) -> None:
        if self.config.max_staleness is None:
            return await super().start()
        while True:  # a retry loop in a bare except: cancellation never gets through
            try:
                await asyncio.sleep(0.05)
            except BaseException:  # noqa: BLE001 - the bug under test
                continue


integration = ReferenceIntegration(name="stuck-with-a-bound", manager_cls=StuckWithABound)
