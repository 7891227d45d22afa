"""Integrations that hang for good (used by ``tests/test_hangs.py`` through the plugin, as a user would run them):
``integration``'s manager start swallows cancellation when the scenario runs with a staleness bound;
``loop_blocking``'s updates poll the engines with a synchronous call inside the async cycle, so the scenario's
event loop never runs again."""

from __future__ import annotations

import asyncio
import time
from typing import Any, Mapping

from conformance.interface import LoraAdapter
from conformance.reference import ReferenceIntegration, ReferenceManager, ReferenceUpdater


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



class PollsSynchronously(ReferenceUpdater):
    async def update(self, weights: Mapping[str, Any] | None = None, *, transport: str = "tensor",
                     lora: LoraAdapter | None = None) -> int:
        while True:  # "wait until the engines are idle", written with a blocking sleep: the loop is never re-entered
            time.sleep(0.05)


loop_blocking = ReferenceIntegration(name="polls-synchronously", updater_cls=PollsSynchronously)
