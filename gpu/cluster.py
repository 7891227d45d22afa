"""Ray clusters: connect to a real one, or start ``N`` simulated nodes on this machine (``ray.cluster_utils.Cluster``).

On one machine Ray binds the machine's external address by default and ``ray.init`` can then hang; the settings in
:data:`LOCAL_RAY_ENV` keep every socket on 127.0.0.1, write no auth token into the home folder and keep Ray's
socket paths short. A simulated cluster has a head that runs nothing (``num_cpus=0``) and ``nodes`` worker nodes
with logical resources (``num_gpus`` is a count for the scheduler; nothing touches a GPU), no dashboard, small
object stores, and fast node-failure detection, as Ray's own tests configure it.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import Any, Iterator

LOCAL_RAY_ENV = {"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0", "RAY_AUTH_MODE": "disabled", "RAY_TMPDIR": "/tmp/rws"}
OBJECT_STORE_BYTES = 100 * 2**20
FAST_FAILURE_DETECTION = {"health_check_initial_delay_ms": 0, "health_check_period_ms": 500,
                          "health_check_timeout_ms": 500, "health_check_failure_threshold": 3}
REPO_ROOT = Path(__file__).resolve().parents[1]


def local_ray_env() -> None:
    """Set :data:`LOCAL_RAY_ENV` where the environment does not already say otherwise (before Ray starts)."""
    for key, value in LOCAL_RAY_ENV.items():
        os.environ.setdefault(key, value)
    Path(os.environ["RAY_TMPDIR"]).mkdir(parents=True, exist_ok=True)


def worker_runtime_env() -> dict[str, Any]:
    """Workers import ``gpu`` and ``fakes`` from this checkout also when it is not pip-installed."""
    path = os.pathsep.join(p for p in (str(REPO_ROOT), os.environ.get("PYTHONPATH", "")) if p)
    return {"env_vars": {"PYTHONPATH": path}}


def connect(address: str | None) -> None:
    """Connect the driver to the cluster at ``address`` (``ray://`` or ``host:port``; None: ``RAY_ADDRESS``,
    else a local single-node Ray started here). Idempotent."""
    import ray

    if ray.is_initialized():
        return
    if address is None and not os.environ.get("RAY_ADDRESS"):
        local_ray_env()
    ray.init(address=address, log_to_driver=False, logging_level="ERROR", include_dashboard=False)


@contextlib.contextmanager
def local_cluster(nodes: int, cpus_per_node: int = 1, gpus_per_node: int = 0) -> Iterator[Any]:
    """A simulated cluster of ``nodes`` worker nodes plus a head that runs nothing, the driver connected; torn
    down (driver disconnected, every node's processes ended) on exit."""
    local_ray_env()
    import ray
    from ray.cluster_utils import Cluster

    if ray.is_initialized():
        raise RuntimeError("a Ray driver is already connected in this process; disconnect it first")
    cluster = Cluster(initialize_head=True, connect=False, head_node_args={
        "num_cpus": 0, "object_store_memory": OBJECT_STORE_BYTES, "include_dashboard": False,
        "_system_config": FAST_FAILURE_DETECTION})
    try:
        for _ in range(nodes):
            cluster.add_node(num_cpus=cpus_per_node, num_gpus=gpus_per_node, object_store_memory=OBJECT_STORE_BYTES)
        ray.init(address=cluster.address, runtime_env=worker_runtime_env(), log_to_driver=False,
                 logging_level="ERROR")
        cluster.wait_for_nodes()
        yield cluster
    finally:
        ray.shutdown()
        cluster.shutdown()
        with contextlib.suppress(Exception):
            from ray._private.utils import reset_ray_address

            reset_ray_address()
