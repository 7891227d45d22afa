"""``LocalBackend``: the Ray backend's engines as plain processes on this machine, without Ray.

Everything but the launching is :class:`gpu.backend.RayBackend`'s: the recording proxy per engine, the monitor that
turns an engine exit into an :class:`~gpu.backend.EngineFailure` naming what the integration had in flight, the
digests read through ``/get_weights_by_name``, the teardown. Each engine is a :class:`gpu.engine.EngineProcess`
(its own process group, killed with the thread that launched it), launched from the thread that starts the
backend and waited for concurrently. For single-node runs of real
SGLang on CPU (``-m sglang``), where a Ray cluster would only add start-up time and memory.
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from .backend import EngineFailure, RayBackend
from .engine import EngineProcess, EngineStartError, SupervisedEngine

LOCAL_NODE = "local"


def threads_env(resources: Any) -> dict[str, str]:
    """Each engine's threads capped at its CPUs, as a Ray actor's are (Ray sets ``OMP_NUM_THREADS`` to the actor's
    ``num_cpus``): uncapped, two engines on 2 cores each spin a thread per core and decode 20× slower (measured: 12
    against 241 tokens/s per request on real SGLang 0.5.23). A value already in the environment is kept."""
    if "OMP_NUM_THREADS" in os.environ:
        return {}
    return {"OMP_NUM_THREADS": str(max(1, int(resources.get("CPU", 1))))}


class LocalBackend(RayBackend):
    """Engines as local processes, each behind a recording proxy (``config.nodes`` and resources are ignored); each
    engine's ``handle`` is its :class:`~gpu.engine.EngineProcess`."""

    name = "local"

    def _launch(self) -> None:
        c = self.config
        env = {**threads_env(c.resources_per_engine), **c.env}
        for i in range(c.engines):
            process = EngineProcess(c.spec, c.program, host=c.engine_host or "127.0.0.1", env=env,
                                    name=f"engine-{i}", python=c.python)
            self.engines.append(SupervisedEngine(i, process))

        for e in self.engines:  # from this thread: an engine dies with the thread that forked it
            e.handle.launch()

        def start(e: SupervisedEngine) -> str | None:
            process: EngineProcess = e.handle
            try:
                process.wait_healthy(c.health_timeout_s)
            except EngineStartError as exc:
                return f"engine {e.index} did not start: {exc}"
            e.info = {"url": process.url, "node_id": LOCAL_NODE, "node_ip": process.host, "pid": process.process.pid,
                      "log": str(process.log_path), "log_tail": process.log_tail()}
            e.last_status, e.last_status_t = {"log_tail": e.info["log_tail"]}, self._since()
            return None

        with ThreadPoolExecutor(max_workers=max(1, c.engines), thread_name_prefix="engine-start") as pool:
            errors = [e for e in pool.map(start, self.engines) if e]
        if errors:
            raise EngineFailure("\n".join(errors))

    def _statuses(self, live: list[SupervisedEngine]) -> dict[int, dict[str, Any] | str | None]:
        return {e.index: e.handle.status() for e in live}

    def _stop_engines(self) -> None:
        with ThreadPoolExecutor(max_workers=max(1, len(self.engines)), thread_name_prefix="engine-stop") as pool:
            list(pool.map(lambda e: e.handle.stop(), self.engines))

    def engine_pids(self) -> list[int]:
        """The launcher process of each engine (its process group holds what it spawned)."""
        return [e.handle.process.pid for e in self.engines if e.handle.process is not None]
