"""The reference integration configured for real SGLang on other nodes: same cycle, inline tensors, a distributed
group hosted on an address the nodes reach."""

from __future__ import annotations

import base64
import pickle
from pathlib import Path

import pytest
import torch

from conformance.interface import BuildEnv, Prompt, RolloutConfig
from conformance.reference.transports import DistributedTransport
from gpu.trainer import ClusterReferenceIntegration, integration, reachable_address

pytestmark = pytest.mark.cpu


def env(tmp_path: Path) -> BuildEnv:
    return BuildEnv(["http://127.0.0.1:1"], tmp_path, RolloutConfig(), lambda: Prompt(0, "p"))


def test_tensors_travel_inline_as_sglangs_pickle_deserializer_reads_them() -> None:
    tensors = [("w", torch.arange(6, dtype=torch.bfloat16).reshape(2, 3))]
    ((name, tensor),) = pickle.loads(base64.b64decode(integration.tensor_encoder(tensors)))
    assert name == "w" and torch.equal(tensor, tensors[0][1])


def test_the_distributed_group_is_hosted_where_the_nodes_reach_it(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    transport = ClusterReferenceIntegration(master_address="10.1.2.3").make_transports(env(tmp_path))["distributed"]
    assert isinstance(transport, DistributedTransport) and transport.master_address == "10.1.2.3"
    monkeypatch.setenv("WEIGHTSYNC_MASTER_ADDR", "10.9.8.7")
    assert integration.make_transports(env(tmp_path))["distributed"].master_address == "10.9.8.7"
    monkeypatch.delenv("WEIGHTSYNC_MASTER_ADDR")
    assert reachable_address() != ""


class RecordingNccl:
    """Stands in for ``torch.distributed.ProcessGroupNCCL`` (absent from CPU torch): keeps what it was built with."""

    class Options:
        _timeout = None

    built: list["RecordingNccl"] = []

    def __init__(self, store, rank: int, world_size: int, options) -> None:
        self.store, self.rank, self.world_size, self.options, self.sent = store, rank, world_size, options, []
        RecordingNccl.built.append(self)

    def _set_sequence_number_for_group(self) -> None:
        self.store.set("seq", "0")

    def broadcast(self, tensors, options):
        self.sent.append(tensors[0])

        class Done:
            def wait(self, timeout):
                return True
        return Done()


def test_the_nccl_transport_keys_its_group_as_sglangs_ranks_do(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import datetime

    import torch.distributed as dist

    from gpu.trainer import NcclTransport, nccl_integration

    monkeypatch.setattr(dist, "ProcessGroupNCCL", RecordingNccl, raising=False)
    transport = nccl_integration.make_transports(env(tmp_path))["distributed"]
    assert isinstance(transport, NcclTransport) and transport.backend == "nccl"
    store = dist.HashStore()
    group = transport._new_group(store, "wug_1", 3)
    assert (group.rank, group.world_size, group.options._timeout) == (0, 3, datetime.timedelta(seconds=60))
    # SGLang: PrefixStore(name) -> torch's f"{name}/" -> "cuda/" for an NCCL backend
    assert store.get("wug_1/wug_1//cuda//seq") == b"0"
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: None)
    transport.device = "cpu"
    transport._broadcast(group, [torch.ones(2), torch.zeros(3)])
    assert [t.shape for t in group.sent] == [(2,), (3,)]
