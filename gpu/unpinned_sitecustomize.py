"""Installed as ``sitecustomize`` in a real-SGLang environment by ``gpu/sglang_cpu.py``. On a machine without an accelerator, torch refuses pinned host memory,
which SGLang's LoRA layers ask for unconditionally (sglang/srt/lora/layers.py ``pin_memory=True``, lora/backend
``.pin_memory()``). With WEIGHTSYNC_UNPINNED=1 (the installer's CPU_ENV), pinning is dropped: the tensors stay in
ordinary host memory, which is where they are on CPU anyway. Nothing in SGLang is edited."""

import functools
import os

if os.environ.get("WEIGHTSYNC_UNPINNED") == "1":
    import torch

    if not torch.cuda.is_available():
        def _unpinned(factory):
            @functools.wraps(factory)
            def call(*args, **kwargs):
                kwargs.pop("pin_memory", None)
                return factory(*args, **kwargs)
            return call

        for _name in ("empty", "zeros", "ones", "full", "tensor", "empty_like", "zeros_like", "ones_like", "full_like",
                      "arange", "as_tensor", "empty_strided"):
            if hasattr(torch, _name):
                setattr(torch, _name, _unpinned(getattr(torch, _name)))
        torch.Tensor.pin_memory = lambda self, *args, **kwargs: self
