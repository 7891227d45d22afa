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
