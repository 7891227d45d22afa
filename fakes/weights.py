"""The weights a fake SGLang engine holds, and every way a trainer can hand it new ones (one import for all of it).

SGLang: the weight-update endpoints of ``python/sglang/srt/entrypoints/http_server.py`` and their structs in
``managers/io_struct.py``. Vendorable: stdlib only at import time;
``torch`` (and ``numpy``) are imported lazily, only by the code paths that need them. The pieces, one module each:

* ``weight_errors`` -- ``WeightError``, ``UndecodablePayload``, ``CheckpointError`` (with the ``stage`` that picks SGLang's message);
* ``dtypes`` -- torch dtypes without torch: names, sizes, exact element codecs, vectorised float casts;
* ``tensors`` -- ``TensorBlob``, ``WeightStore``, ``weights_digest``, ``values_preview`` (``/get_weights_by_name``);
* ``tiny_model`` -- the built-in tiny Llama (``tiny_model``, ``TINY_SPEC``, ``TINY_CONFIG``), ``perturbed``,
  ``tiny_lora``;
* ``safetensors_format`` -- ``encode_safetensors`` / ``decode_safetensors`` (stdlib, validated like the library);
* ``checkpoints`` -- ``save_checkpoint`` / ``load_checkpoint`` (``/update_weights_from_disk``), LoRA adapter dirs;
* ``tensor_payloads`` -- ``/update_weights_from_tensor`` payloads (torch, pickle, SGLang's weight_sync
  ``LocalSerializedTensor`` form, ``flattened_bucket``);
* ``distributed`` -- ``DistributedGroup`` over a real gloo group (``/update_weights_from_distributed``).
"""

from __future__ import annotations

from .checkpoints import SUPPORTED_LOAD_FORMATS, load_checkpoint, load_lora_adapter, save_checkpoint, save_lora_adapter
from .distributed import _make_gloo_group  # noqa: F401  (gpu/scripts/device_check.py joins as SGLang does)
from .distributed import DistributedGroup, distributed_metadata, trainer_group
from .safetensors_format import decode_safetensors, encode_safetensors
from .tensor_payloads import (
    PAYLOAD_FORMATS,
    TENSOR_LOAD_FORMATS,
    FlattenedTensorMetadata,
    LocalSerializedTensor,
    decode_lora_tensor_payload,
    decode_tensor_payload,
    encode_flattened_bucket,
    encode_lora_tensor_payload,
    encode_tensor_payload,
    encode_weight_sync_payload,
)
from .tensors import TensorBlob, WeightStore, values_preview, weights_digest
from .tiny_model import TINY_CONFIG, TINY_SPEC, perturbed, tiny_lora, tiny_model
from .weight_errors import CheckpointError, UndecodablePayload, WeightError

__all__ = [
    "TensorBlob",
    "WeightError",
    "UndecodablePayload",
    "CheckpointError",
    "WeightStore",
    "weights_digest",
    "tiny_model",
    "TINY_SPEC",
    "TINY_CONFIG",
    "perturbed",
    "encode_safetensors",
    "decode_safetensors",
    "save_checkpoint",
    "load_checkpoint",
    "SUPPORTED_LOAD_FORMATS",
    "PAYLOAD_FORMATS",
    "TENSOR_LOAD_FORMATS",
    "LocalSerializedTensor",
    "FlattenedTensorMetadata",
    "encode_tensor_payload",
    "encode_weight_sync_payload",
    "encode_flattened_bucket",
    "decode_lora_tensor_payload",
    "encode_lora_tensor_payload",
    "decode_tensor_payload",
    "DistributedGroup",
    "trainer_group",
    "distributed_metadata",
    "load_lora_adapter",
    "save_lora_adapter",
    "tiny_lora",
    "values_preview",
]
