"""Loading weights the way SGLang's model does: unknown names skipped with its warning (success), shape mismatch
refused, half-written sharded checkpoints per release; `strict_weights` keeps the stricter behaviour; and the
model an engine serves (`--model-path`): names, shapes and dtypes from the checkpoint, config.json, fast load."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
import torch

from fakes.engine import FakeEngine
from fakes.served_model import ModelPathError, load_served_model, resolve_dtype
from fakes.weights import (
    TensorBlob,
    encode_tensor_payload,
    perturbed,
    save_checkpoint,
    tiny_model,
    values_preview,
)

pytestmark = pytest.mark.cpu

UNKNOWN = "model.layers.0.self_attn.q_norm.weight"  # a Qwen3 name the tiny Llama lacks
WARNING = f"Parameter {UNKNOWN} not found in params_dict"


def _with_unknown(step: int) -> dict[str, TensorBlob]:
    new = perturbed(tiny_model(0), step=step)
    new[UNKNOWN] = TensorBlob.from_values("float32", (16,), [1.0] * 16)
    return new


async def _tensor_update(wire, blobs, profile_sessions: bool):
    body = {"serialized_named_tensors": [encode_tensor_payload(blobs)]}
    if profile_sessions:
        await wire.post("/begin_weight_update", json={})
    resp = await wire.post("/update_weights_from_tensor", json=body)
    if profile_sessions and not wire.engine.crashed:
        await wire.post("/end_weight_update", json={})
    return resp


@pytest.mark.asyncio
@pytest.mark.parametrize("transport", ["disk", "tensor"])
async def test_unknown_names_are_skipped_with_sglangs_warning(connect, tmp_path: Path, caplog, transport) -> None:
    wire = await connect(FakeEngine("0.5.23"))
    new = _with_unknown(1)
    caplog.set_level(logging.WARNING)
    if transport == "disk":
        save_checkpoint(str(tmp_path), new)
        resp = await wire.post("/update_weights_from_disk", json={"model_path": str(tmp_path)})
    else:
        resp = await _tensor_update(wire, new, profile_sessions=True)
    assert resp.status_code == 200 and resp.json()["success"] is True, resp.text
    known = {n: b for n, b in new.items() if n != UNKNOWN}
    assert wire.engine.weights.digest() == FakeEngine(weights=known).weights.digest()  # the rest loaded
    assert WARNING in caplog.text
    (skipped,) = wire.engine.events.of_kind("weights.skipped")
    assert skipped.fields["name"] == UNKNOWN and skipped.fields["message"] == WARNING


@pytest.mark.asyncio
@pytest.mark.parametrize("transport", ["disk", "tensor"])
async def test_strict_weights_refuses_unknown_names(connect, tmp_path: Path, transport) -> None:
    wire = await connect(FakeEngine("0.5.23", strict_weights=True))
    before = wire.engine.weights.digest()
    if transport == "disk":
        save_checkpoint(str(tmp_path), _with_unknown(1))
        resp = await wire.post("/update_weights_from_disk", json={"model_path": str(tmp_path)})
        assert resp.status_code == 400 and f"unknown parameter '{UNKNOWN}'" in resp.json()["message"]
        assert "Rolling back to original weights" in resp.json()["message"]
        assert wire.engine.weights.digest() == before
    else:
        resp = await _tensor_update(wire, _with_unknown(1), profile_sessions=True)
        assert resp.status_code == 500 and wire.engine.crashed  # no try/except around load_weights


@pytest.mark.asyncio
async def test_stacked_and_rotary_names_are_skipped_silently(connect, caplog) -> None:
    wire = await connect(FakeEngine("0.5.10"))
    new = perturbed(tiny_model(0), step=2)
    new["model.layers.9.self_attn.q_proj.weight"] = new["model.layers.0.self_attn.q_proj.weight"]  # → qkv_proj
    new["model.layers.0.self_attn.rotary_emb.inv_freq"] = TensorBlob.from_values("float32", (4,), [1.0] * 4)
    caplog.set_level(logging.WARNING)
    resp = await _tensor_update(wire, new, profile_sessions=False)
    assert resp.status_code == 200, resp.text
    assert "not found in params_dict" not in caplog.text
    assert {e.fields["message"] for e in wire.engine.events.of_kind("weights.skipped")} == {None}


@pytest.mark.asyncio
@pytest.mark.parametrize("profile", ["0.5.10", "0.5.23"])
async def test_shape_mismatch_on_disk_kills_the_server_in_the_rollback(connect, tmp_path: Path, profile) -> None:
    """SGLang's rollback re-reads the folder it failed on (measured on real 0.5.10 and 0.5.23): the server dies."""
    wire = await connect(FakeEngine(profile))
    new = perturbed(tiny_model(0), step=3)
    new["lm_head.weight"] = TensorBlob.zeros("float32", (6400, 64))  # the user's model, not the served one
    save_checkpoint(str(tmp_path), new)
    resp = await wire.post("/update_weights_from_disk", json={"model_path": str(tmp_path)})
    assert resp.status_code == 500 and wire.engine.crashed
    assert "rollback" in wire.engine.crash_reason and "into parameter (torch.Size([64, 16]))" in wire.engine.crash_reason
    assert (await wire.get("/health")).status_code == 503


@pytest.mark.asyncio
async def test_a_rollback_that_reads_the_folder_complete_loads_the_new_weights(connect, tmp_path: Path,
                                                                             monkeypatch) -> None:
    """A checkpoint still being written fails the load; by the rollback's read it is complete: the answer says
    "Rolling back to original weights" and the engine holds the new ones."""
    import fakes.weights as W

    wire = await connect(FakeEngine("0.5.23"))
    before = wire.engine.weights.digest()
    save_checkpoint(str(tmp_path), perturbed(tiny_model(0), step=3))
    real, reads = W.load_checkpoint, []

    def half_written_once(*args, **kw):
        reads.append(args[0])
        if len(reads) == 1:
            raise W.CheckpointError("model.safetensors: truncated or still being written?", stage="load")
        return real(*args, **kw)
    monkeypatch.setattr(W, "load_checkpoint", half_written_once)
    resp = await wire.post("/update_weights_from_disk", json={"model_path": str(tmp_path)})
    assert resp.status_code == 400 and "Rolling back to original weights" in resp.json()["message"]
    assert len(reads) == 2 and wire.engine.weights.digest() != before and not wire.engine.crashed


@pytest.mark.asyncio
@pytest.mark.parametrize(("profile", "loads"), [("0.5.10", True), ("0.5.23", False)])
async def test_half_written_sharded_checkpoint_per_release(connect, tmp_path: Path, profile, loads) -> None:
    wire = await connect(FakeEngine(profile))
    before = wire.engine.weights.digest()
    save_checkpoint(str(tmp_path), perturbed(tiny_model(0), step=4), shards=3)
    (tmp_path / "model-00002-of-00003.safetensors").unlink()
    resp = await wire.post("/update_weights_from_disk", json={"model_path": str(tmp_path)})
    if loads:  # up to 0.5.16 the shards present load: a silent partial update
        assert resp.status_code == 200 and wire.engine.weights.digest() != before
    else:
        assert resp.status_code == 400 and resp.json()["message"].startswith(
            "Failed to get weights iterator: model.safetensors.index.json references 1 shard file(s) missing")
        assert wire.engine.weights.digest() == before


# -- the served model (--model-path) -----------------------------------------------------------------------------


def _user_model(dtype: str) -> dict[str, TensorBlob]:
    """A small model of another shape than the built-in one (vocab 96, hidden 8)."""
    gen = torch.Generator().manual_seed(7)
    tensors = {"model.embed_tokens.weight": torch.randn(96, 8, generator=gen),
               "model.layers.0.self_attn.q_proj.weight": torch.randn(8, 8, generator=gen),
               "model.norm.weight": torch.ones(8), "lm_head.weight": torch.randn(96, 8, generator=gen)}
    return {n: TensorBlob.from_torch(t.to(getattr(torch, dtype))) for n, t in tensors.items()}


@pytest.mark.asyncio
@pytest.mark.parametrize(("fmt", "shards", "dtype"), [("safetensors", 1, "bfloat16"), ("safetensors", 2, "float16"),
                                                      ("pt", 1, "float32")])
async def test_engine_serves_the_model_dir(connect, tmp_path: Path, fmt, shards, dtype) -> None:
    blobs = _user_model(dtype)
    config = {"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "torch_dtype": dtype,
              "vocab_size": 96, "hidden_size": 8}
    save_checkpoint(str(tmp_path), blobs, fmt=fmt, shards=shards, config=config)
    model = load_served_model(str(tmp_path))
    held = "float16" if dtype == "float32" else dtype  # --dtype auto serves float32 checkpoints in float16
    assert model.dtype == held and {n: b.shape for n, b in model.weights.items()} == {n: b.shape for n, b in blobs.items()}
    wire = await connect(FakeEngine("0.5.23", model=model))
    info = (await wire.get("/get_model_info")).json()
    assert (info["model_path"], info["architectures"], info["model_type"]) == (
        str(tmp_path), ["Qwen3ForCausalLM"], "qwen3")
    assert (await wire.get("/get_server_info")).json()["model_path"] == str(tmp_path)
    got = (await wire.post("/get_weights_by_name", json={"name": "lm_head.weight", "truncate_size": 2})).json()
    assert got == values_preview(blobs["lm_head.weight"].astype(held), 2)
    # the trainer's save_pretrained of the same model: the disk update the issue saw refused now loads
    save_checkpoint(str(tmp_path / "step1"), {n: b.astype("float32") for n, b in blobs.items()}, config=config)
    resp = await wire.post("/update_weights_from_disk", json={"model_path": str(tmp_path / "step1")})
    assert resp.status_code == 200, resp.text


def test_dtype_resolution_and_bad_model_paths(tmp_path: Path) -> None:
    assert resolve_dtype({"torch_dtype": "float32"}) == "float16"
    assert resolve_dtype({"torch_dtype": "float32", "model_type": "gemma2"}) == "bfloat16"
    assert resolve_dtype({"dtype": "bfloat16"}) == "bfloat16"
    assert resolve_dtype({"torch_dtype": "bfloat16"}, "half") == "float16"
    assert resolve_dtype({}, "float") == "float32"
    with pytest.raises(ModelPathError, match="Unknown dtype: int8"):
        resolve_dtype({}, "int8")
    with pytest.raises(ModelPathError, match="Cannot find any model weights"):
        load_served_model(str(tmp_path))
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(ModelPathError, match="config.json cannot be parsed"):
        load_served_model(str(tmp_path))
