"""The trainer side on a cluster: the reference integration configured for real SGLang engines on other nodes.

The scenario's trainer and the integration's updater run in the pytest driver. What changes against the fake is
configuration only, never the cycle:

* **tensor and LoRA** payloads: SGLang decodes ``serialized_named_tensors`` with its pickle-based
  ``MultiprocessingSerializer``; CUDA-IPC handles never cross nodes, so the tensors travel inline
  (``encode_pickle_b64``, the reference's default);
* **distributed**: the trainer is rank 0 of a group hosted on the driver (``master_address`` must be an address
  the engines' nodes reach, not 127.0.0.1). With gloo (``integration``) SGLang receives the broadcast straight into
  its CUDA parameters (the device check ran exactly that on an H200: ``gloo_into_cuda``). With NCCL
  (``nccl_integration``, :class:`NcclTransport`) the trainer's rank holds the tensors on a GPU of the driver's
  own: NCCL refuses two ranks on one device (also seen there), so run the driver on a GPU node with a GPU no
  engine uses (``CUDA_VISIBLE_DEVICES``);
* **disk**: checkpoints are written under the scenario's temporary directory, so ``TMPDIR`` must be a filesystem
  every node mounts at the same path.

    pytest -m gpu --conformance-nodes 2 --conformance-integration gpu.trainer:integration         # or gpu.trainer:nccl_integration
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass, replace
from typing import Any

from conformance.interface import BuildEnv
from conformance.reference.integration import ReferenceIntegration
from conformance.reference.transports import DistributedTransport, WeightTransport


def reachable_address() -> str:
    """This machine's address as other nodes reach it (``WEIGHTSYNC_MASTER_ADDR`` overrides; else the interface
    that routes outward)."""
    if os.environ.get("WEIGHTSYNC_MASTER_ADDR"):
        return os.environ["WEIGHTSYNC_MASTER_ADDR"]
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect(("10.255.255.255", 1))  # no packet is sent: this only picks the outward interface
        except OSError:  # no route out: a single machine
            return "127.0.0.1"
        return s.getsockname()[0]


class NcclTransport(DistributedTransport):
    """The reference's distributed transport over NCCL: rank 0 on ``device`` (a GPU of the driver), the group keyed
    in the store as SGLang's ranks key theirs (``init_custom_process_group``: ``PrefixStore(name)``, then torch's
    ``_new_process_group_helper`` prefixes ``f"{name}/"`` and ``"cuda/"`` for an NCCL backend), and the engines
    told ``backend="nccl"``. Every tensor is copied to ``device`` and broadcast from it, in the order of the names."""

    def __init__(self, master_address: str, device: str = "cuda:0", timeout_s: float = 120.0) -> None:
        super().__init__("gloo", master_address, timeout_s)  # the parent builds gloo groups only
        self.backend, self.device = "nccl", device

    def _new_group(self, store: Any, name: str, world_size: int) -> Any:
        import torch.distributed as dist

        keyed = dist.PrefixStore("cuda/", dist.PrefixStore(f"{name}/", dist.PrefixStore(name, store)))
        options = dist.ProcessGroupNCCL.Options()
        options._timeout = self.timeout
        group = dist.ProcessGroupNCCL(keyed, 0, world_size, options)
        group._set_sequence_number_for_group()
        return group

    def _broadcast(self, group: Any, tensors: list[Any]) -> None:
        import torch
        import torch.distributed as dist

        for tensor in tensors:
            group.broadcast([tensor.to(self.device)], dist.BroadcastOptions()).wait(self.timeout)
        torch.cuda.synchronize(self.device)


@dataclass(frozen=True, eq=False)
class ClusterReferenceIntegration(ReferenceIntegration):
    """The reference integration, its distributed group hosted on ``master_address`` (default: this machine's
    outward address)."""

    master_address: str | None = None

    def make_transports(self, env: BuildEnv) -> dict[str, WeightTransport]:
        gloo = self if self.backend == "gloo" else replace(self, backend="gloo")  # the parent's transport is gloo-only
        transports = ReferenceIntegration.make_transports(gloo, env)
        address = self.master_address or reachable_address()
        transports["distributed"] = (NcclTransport(address, timeout_s=self.timeout_s) if self.backend == "nccl"
                                     else DistributedTransport(self.backend, address, timeout_s=self.timeout_s))
        return transports


integration = ClusterReferenceIntegration(name="reference-sglang")
"""``--integration gpu.trainer:integration`` (gloo from the driver's CPU)."""
nccl_integration = ClusterReferenceIntegration(name="reference-sglang-nccl", backend="nccl")
"""``--integration gpu.trainer:nccl_integration`` (NCCL from a GPU of the driver's own)."""
