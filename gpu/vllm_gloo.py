"""A gloo weight-transfer engine for real vLLM on CPU: vLLM's native weight transfer (``/init_weight_transfer_engine``,
``/start_weight_update``, ``/update_weights``, ``/finish_weight_update``) where NCCL cannot run.

vLLM 0.32.0's factory (``distributed/weight_transfer/factory.py``) registers only CUDA engines and takes engines
registered at runtime; :func:`register` is a vLLM general plugin (entry point ``vllm.general_plugins``, which
``gpu.vllm_cpu``'s installer writes into the release's environment) that registers :data:`BACKEND` in every vLLM
process. It loads where this repository is on the engine's ``PYTHONPATH`` (``gpu.vllm_setup``): elsewhere vLLM logs
that the plugin failed to load and a ``gloo`` config is refused as unknown.

The engine is NCCL's (``nccl_engine.NCCLWeightTransferEngine``, unpacked) on a gloo group: the same ``init_info``
and ``update_info`` (:mod:`fakes.vllm.weight_transfer`, which the fake vLLM serves the same way), the group built by
:class:`fakes.distributed.DistributedGroup` (the trainer joins it with ``fakes.distributed.trainer_group``), one
broadcast per tensor from rank 0 loaded by ``model.load_weights`` inside vLLM's layerwise reload. Its
``update_weights`` skips the base class's ``torch.accelerator.synchronize()``, which raises without an accelerator.
"""

from __future__ import annotations

from typing import Any

from fakes.vllm.weight_transfer import (BACKEND, ENGINE_CLASS, JOIN_TIMEOUT_S, GlooWeightTransferInitInfo,
                                        GlooWeightTransferUpdateInfo)

PLUGIN = "weightsync_gloo"
"""The plugin's entry-point name (``VLLM_PLUGINS`` may name it)."""


def register() -> None:
    """Register :data:`BACKEND` with vLLM's weight-transfer factory (idempotent: vLLM may load plugins twice)."""
    from vllm.distributed.weight_transfer.factory import WeightTransferEngineFactory

    if BACKEND not in WeightTransferEngineFactory._registry:
        WeightTransferEngineFactory.register_engine(BACKEND, __name__, ENGINE_CLASS)


def __getattr__(name: str) -> Any:
    """The engine class, built on first use (it subclasses vLLM's base, importable only in vLLM's environment)."""
    if name == ENGINE_CLASS:
        return _engine_class()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _engine_class() -> type:
    from vllm.distributed.weight_transfer.base import WeightTransferEngine
    from vllm.model_executor.model_loader.reload import finalize_layerwise_reload, initialize_layerwise_reload

    from fakes.distributed import DistributedGroup

    class GlooWeightTransferEngine(WeightTransferEngine):
        """NCCL's engine, unpacked, on a gloo group (see the module docstring)."""

        init_info_cls = GlooWeightTransferInitInfo
        update_info_cls = GlooWeightTransferUpdateInfo
        supports_draft_weight_update = False
        group: DistributedGroup | None = None

        def init_transfer_engine(self, init_info: GlooWeightTransferInitInfo) -> None:
            """Join the trainer's group as ``rank_offset`` + this worker's rank (NCCL's ``worker_init_process_group``
            with one data-parallel replica)."""
            rank = init_info.rank_offset + self.parallel_config.rank
            self.group = DistributedGroup.join(init_info.master_address, init_info.master_port, rank,
                                               init_info.world_size, init_info.group_name, BACKEND, JOIN_TIMEOUT_S)

        def start_weight_update(self) -> None:
            initialize_layerwise_reload(self.model)

        def finish_weight_update(self) -> None:
            finalize_layerwise_reload(self.model, self.model_config)

        def update_weights(self, update_info: dict[str, Any]) -> None:
            self.receive_weights(self.parse_update_info(update_info))

        def receive_weights(self, update_info: GlooWeightTransferUpdateInfo) -> None:
            if self.group is None:
                raise RuntimeError("gloo weight transfer not initialized. Call init_transfer_engine() first.")
            for name, dtype, shape in zip(update_info.names, update_info.dtype_names, update_info.shapes):
                received = self.group.receive([name], [dtype], [shape])[name]
                self.model.load_weights([(name, received.to_torch())])

        def shutdown(self) -> None:
            if self.group is not None:
                self.group.destroy()
                self.group = None

    GlooWeightTransferEngine.__name__ = GlooWeightTransferEngine.__qualname__ = ENGINE_CLASS
    return GlooWeightTransferEngine
