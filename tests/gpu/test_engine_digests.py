"""Engine-side truth without fake-only routes: what ``/get_weights_by_name`` shows rebuilds each parameter's bytes
exactly, so the digest equals the one of the tensor the engine holds."""

from __future__ import annotations

import asyncio

import pytest
import torch

from fakes.engine import FakeEngine
from fakes.server import LoopbackServer
from fakes.weights import TensorBlob, values_preview
from gpu.weights import blob_from_values, parameter_specs, read_all_digests, read_engine_digests

pytestmark = pytest.mark.cpu


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_values_as_sglang_shows_them_rebuild_the_exact_tensor(dtype: torch.dtype) -> None:
    gen = torch.Generator().manual_seed(0)
    tensor = (torch.randn(7, 5, generator=gen) * torch.logspace(-30, 3, 5)).to(dtype)
    tensor[0, 0] = torch.finfo(dtype).tiny / 4 if dtype != torch.bfloat16 else tensor[0, 0]  # a subnormal
    original = TensorBlob.from_torch(tensor)
    shown = values_preview(original, truncate_size=tensor.shape[0])  # SGLang: .to(float32).tolist()[:n]
    assert blob_from_values(shown, str(dtype).removeprefix("torch.")).digest() == original.digest()
    shown[3][4] *= 1.25  # one value off: a different tensor
    assert blob_from_values(shown, str(dtype).removeprefix("torch.")).digest() != original.digest()


def test_a_1d_parameter_and_a_truncated_answer() -> None:
    norm = TensorBlob.from_torch(torch.ones(6, dtype=torch.bfloat16))
    assert blob_from_values(values_preview(norm, 6), "bfloat16").digest() == norm.digest()
    assert blob_from_values(values_preview(norm, 5), "bfloat16").digest() != norm.digest()


def test_digests_read_over_http_equal_what_the_engine_holds() -> None:
    engines = [FakeEngine(seed=s) for s in (0, 0, 1)]
    servers = [LoopbackServer(e.app).start() for e in engines]
    try:
        params = parameter_specs({n: b.to_torch() for n, b in engines[0].weights.items()})
        params["model.no_such.weight"] = ("float32", (2, 2))
        digests = read_all_digests([s.url for s in servers], params)

        async def inside_a_running_loop() -> list[dict[str, str]]:
            return read_all_digests([servers[0].url], params)
        assert asyncio.run(inside_a_running_loop()) == digests[:1]
    finally:
        for s in servers:
            s.stop()
    held = [{n: b.digest() for n, b in e.weights.items()} for e in engines]
    for engine, read in enumerate(digests):
        assert read["model.no_such.weight"].startswith("unreadable: 400"), read["model.no_such.weight"]
        del read["model.no_such.weight"]
        assert read == held[engine]
    assert digests[0] == digests[1] != digests[2]


def test_a_dead_engine_is_an_error_not_a_digest() -> None:
    with LoopbackServer(FakeEngine().app) as server:
        url = server.url
    with pytest.raises(Exception):
        asyncio.run(read_engine_digests(url, {"w": ("float32", (1,))}, timeout_s=2))
