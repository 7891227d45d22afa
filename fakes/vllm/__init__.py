"""The fake vLLM: one vLLM server's RL surface (pause modes, version labels, disk reload, sleep, runtime LoRA, the
completion and token-in/token-out generate routes) on the fake's shared state model. Vendorable like the fake
SGLang: ``FakeVLLMEngine(...).app`` is an ASGI app (``httpx.ASGITransport``), ``python -m fakes.vllm.launch_server``
the drop-in for ``python -m vllm.entrypoints.openai.api_server``."""

from .app import ROUTES, make_app
from .engine import FakeVLLMEngine

__all__ = ["ROUTES", "FakeVLLMEngine", "make_app"]
