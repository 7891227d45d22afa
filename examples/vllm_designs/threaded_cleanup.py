""":mod:`.threaded_requests` plus cleanup after each publish: the superseded checkpoint directory is removed before
``update()`` returns (every engine serves the new one by then; the new one stays, as a failed next reload restores it).

    python -m conformance --engine vllm --integration examples.vllm_designs.threaded_cleanup:integration
"""

from __future__ import annotations

import asyncio
import shutil
from dataclasses import dataclass

from .threaded_requests import ThreadedRequestsIntegration, ThreadedUpdater


class CleaningUpdater(ThreadedUpdater):
    async def after_publish(self, path: str) -> None:
        old, self.shared["published"] = self.shared.get("published"), path  # shared by failover cells
        if old is not None and old != path:
            await asyncio.to_thread(shutil.rmtree, old, True)


@dataclass(frozen=True)
class ThreadedCleanupIntegration(ThreadedRequestsIntegration):
    name: str = "vllm-design-threaded-cleanup"
    updater_cls: type = CleaningUpdater


integration = ThreadedCleanupIntegration()
