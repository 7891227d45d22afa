"""The reference async-RL weight-sync integration: a compact, correct client of real SGLang to copy from.

``integration`` is the suite's default (``--integration conformance.reference:integration``). Modules, bottom
up: ``concurrency`` (task helpers) → ``client`` (one engine over HTTP) → ``transports`` (disk, tensor,
distributed, LoRA) and ``manager`` (rollout producer + consumer filters) → ``updater`` (one trainer cell's
update cycle) → ``integration`` (builds the roles). Of ``fakes`` it uses only the release facts and the stdlib
safetensors encoder (checkpoints without torch); torch where the tensor and distributed transports run.
"""

from dataclasses import replace

from ..interface import Capabilities
from .client import EngineError, HttpEngineClient
from .integration import ReferenceIntegration, default_capabilities
from .manager import (NegativeStaleness, PartialRolloutManager, ProtocolError, ReferenceManager, VersionRegression,
                      numeric_label)
from .transports import (DiskTransport, DistributedTransport, LoraTransport, TensorTransport,
                         encode_pickle_b64, write_checkpoint_atomic)
from .updater import ReferenceUpdater
from .transports import torch_installed
from .vllm_client import NO_GLOO, NO_TENSORS, VllmEngineClient, VllmSleepingClient

integration = ReferenceIntegration()
partial_rollout = ReferenceIntegration(name="reference-partial-rollout", manager_cls=PartialRolloutManager,
                                       capabilities=default_capabilities(partial_rollout=True))
"""The reference with partial rollout: aborted turns are resumed instead of recycled."""
vllm = ReferenceIntegration(
    name="reference-vllm", client_cls=VllmEngineClient,
    capabilities=Capabilities(transports=frozenset({"disk", "distributed"} if torch_installed() else {"disk"}),
                              engine_recovery=True,
                              absent_because={"tensor": NO_TENSORS, **({} if torch_installed() else
                                                                        {"distributed": NO_GLOO})}))
"""The reference on vLLM (``--engine vllm``): the same updater and manager over :class:`VllmEngineClient`, disk
updates, and distributed ones through vLLM's native weight transfer (its gloo engine) where torch is installed (its
``retract`` cycles pause with ``wait``, which answers once every running request finished: such a cycle lasts as
long as the longest request in flight)."""

vllm_sleeping = replace(vllm, name="reference-vllm-sleeping", client_cls=VllmSleepingClient,
                        capabilities=replace(vllm.capabilities, pause_modes=frozenset({"retract"})))
"""The reference on vLLM with its engines asleep for each update (:class:`VllmSleepingClient`): colocated designs'
``/sleep`` … ``/wake_up``, the weights woken before they are loaded. A level-1 sleep clears the caches, which
preempts the requests in flight: it pauses in ``retract`` only."""

__all__ = [
    "DiskTransport", "DistributedTransport", "EngineError", "HttpEngineClient", "LoraTransport", "NegativeStaleness",
    "PartialRolloutManager", "ProtocolError", "ReferenceIntegration", "ReferenceManager", "ReferenceUpdater",
    "TensorTransport", "VersionRegression", "VllmEngineClient", "VllmSleepingClient", "default_capabilities",
    "encode_pickle_b64", "integration", "numeric_label", "partial_rollout", "vllm", "vllm_sleeping",
    "write_checkpoint_atomic",
]
