"""The trainer side on a cluster: the reference integration configured for real SGLang engines on other nodes.

The scenario's trainer and the integration's updater run in the pytest driver. What changes against the fake is
configuration only, never the cycle:

* **tensor and LoRA** payloads: SGLang decodes ``serialized_named_tensors`` with its pickle-based
  ``MultiprocessingSerializer``; CUDA-IPC handles never cross nodes, so the tensors travel inline
  (``encode_pickle_b64``) rather than as the fake's safetensors-b64;
* **distributed**: the trainer is rank 0 of a gloo group hosted on the driver (``master_address`` must be an
  address the engines' nodes reach, not 127.0.0.1); SGLang receives the gloo broadcast straight into its CUDA
  parameters (the device check ran exactly that on an H200: ``gloo_into_cuda``). An NCCL trainer needs a GPU of
  its own (NCCL refuses two ranks on one device, also seen there): run the driver on a GPU node outside the
  engines' placement group, and give the transport an NCCL group (``DistributedTransport._new_group`` with
  ``ProcessGroupNCCL`` and torch's ``"cuda/"`` store prefix) — not built yet;
* **disk**: checkpoints are written under the scenario's temporary directory, so ``TMPDIR`` must be a filesystem
  every node mounts at the same path.

    pytest -m gpu --nodes 2 --integration gpu.trainer:integration
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass

from conformance.interface import BuildEnv
from conformance.reference.integration import ReferenceIntegration
from conformance.reference.transports import DistributedTransport, WeightTransport, encode_pickle_b64


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


@dataclass(frozen=True, eq=False)
class ClusterReferenceIntegration(ReferenceIntegration):
    """The reference integration, its distributed group hosted on ``master_address`` (default: this machine's
    outward address)."""

    master_address: str | None = None

    def make_transports(self, env: BuildEnv) -> dict[str, WeightTransport]:
        transports = super().make_transports(env)
        transports["distributed"] = DistributedTransport(self.backend, self.master_address or reachable_address(),
                                                         timeout_s=self.timeout_s)
        return transports


integration = ClusterReferenceIntegration(name="reference-sglang", tensor_encoder=encode_pickle_b64)
"""``--integration gpu.trainer:integration``."""
