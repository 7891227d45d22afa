"""fakes/weights.py: blobs, digests, the store, checkpoints (as trainers write them), tensor payloads, LoRA,
/get_weights_by_name previews. The distributed transport is in test_distributed.py."""

from __future__ import annotations

import base64
import io
import json
import os
import pickle
import struct
import subprocess
import sys
import threading

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fakes.weights import (
    TINY_SPEC,
    CheckpointError,
    TensorBlob,
    UndecodablePayload,
    WeightError,
    WeightStore,
    decode_lora_tensor_payload,
    decode_safetensors,
    decode_tensor_payload,
    encode_safetensors,
    encode_tensor_payload,
    load_checkpoint,
    load_lora_adapter,
    perturbed,
    save_checkpoint,
    save_lora_adapter,
    tiny_lora,
    tiny_model,
    values_preview,
    weights_digest,
)

pytestmark = pytest.mark.cpu

import torch
import safetensors.torch as safetensors_torch

ALL_DTYPES = ["float32", "bfloat16", "float16", "float64", "int64", "int32", "int16", "int8", "uint8", "bool",
              "float8_e4m3fn", "float8_e5m2"]


def torch_state(blobs):
    """What a trainer holds: name -> torch tensor."""
    return {n: b.to_torch() for n, b in blobs.items()}


def random_tensor(dtype: str, shape, gen):
    dt = getattr(torch, dtype)
    if dtype == "bool":
        return torch.randint(0, 2, shape, generator=gen).bool()
    if dtype in ("int64", "int32", "int16", "int8", "uint8"):
        info = torch.iinfo(dt)
        return torch.randint(info.min, info.max, shape, generator=gen, dtype=torch.int64).to(dt)
    if dtype.startswith("float8"):
        return torch.randn(shape, generator=gen).clamp(-400, 400).to(dt)
    return torch.randn(shape, generator=gen).to(dt)


# --- TensorBlob -------------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", ALL_DTYPES)
def test_blob_torch_round_trip_is_byte_exact(dtype):
    gen = torch.Generator().manual_seed(1)
    t = random_tensor(dtype, (3, 5), gen)
    blob = TensorBlob.from_torch(t)
    assert blob.dtype == dtype and blob.shape == (3, 5) and blob.nbytes == t.numel() * t.element_size()
    back = blob.to_torch()
    assert back.dtype == t.dtype and back.shape == t.shape
    assert back.view(torch.uint8).reshape(-1).tolist() == t.view(torch.uint8).reshape(-1).tolist()


def test_bfloat16_every_bit_pattern_survives_torch_safetensors_and_payload():
    # all 65536 bfloat16 bit patterns (NaNs with payloads, infs, subnormals, -0.0)
    bits = torch.arange(0, 65536, dtype=torch.int32).to(torch.int16)  # wraps to the full int16 range
    t = bits.view(torch.bfloat16).reshape(256, 256)
    blob = TensorBlob.from_torch(t)
    assert blob.data == t.view(torch.uint8).reshape(-1).numpy().tobytes()
    via_st = decode_safetensors(encode_safetensors({"w": blob}))[0]["w"]
    assert via_st == blob
    via_lib = safetensors_torch.load(encode_safetensors({"w": blob}))["w"]
    assert torch.equal(via_lib.view(torch.int16), t.view(torch.int16))
    for fmt in ("pickle", "torch"):
        assert decode_tensor_payload(encode_tensor_payload({"w": blob}, fmt))["w"] == blob


def test_blob_odd_shapes_and_noncontiguous_tensors():
    t = torch.arange(12, dtype=torch.float32).reshape(3, 4).t()  # non-contiguous view
    assert TensorBlob.from_torch(t).to_torch().tolist() == t.tolist()
    scalar = TensorBlob.from_torch(torch.tensor(2.5, dtype=torch.bfloat16))
    assert scalar.shape == () and scalar.to_torch().item() == 2.5
    empty = TensorBlob.from_torch(torch.zeros(0, 4))
    assert empty.shape == (0, 4) and empty.data == b"" and empty.to_torch().shape == (0, 4)


def test_blob_validation_and_normalisation():
    with pytest.raises(WeightError, match="needs 8 bytes, got 7"):
        TensorBlob("float32", (2,), b"\0" * 7)
    with pytest.raises(WeightError, match="unsupported dtype 'complex64'"):
        TensorBlob("complex64", (1,), b"\0" * 8)
    with pytest.raises(WeightError, match="bare torch dtype name 'float32'"):
        TensorBlob("torch.float32", (1,), b"\0" * 4)
    b = TensorBlob("half", [2, 1], bytearray(4))
    assert b.dtype == "float16" and b.shape == (2, 1) and isinstance(b.data, bytes)
    assert TensorBlob(torch.bfloat16, (1,), b"\0\0").dtype == "bfloat16"
    assert "nbytes=4" in repr(b) and "\\x00" not in repr(b)


def test_astype_matches_torch():
    gen = torch.Generator().manual_seed(3)
    t = torch.randn(64, generator=gen) * 1000
    t[0], t[1], t[2] = float("inf"), float("nan"), 3.0e38  # overflows float16
    blob = TensorBlob.from_torch(t)
    for dtype in ("bfloat16", "float16", "float64", "int32", "int8", "bool"):
        if dtype in ("int32", "int8"):
            src = TensorBlob.from_torch(t[3:])  # no inf/nan for ints
            expect = t[3:].to(getattr(torch, dtype))
        else:
            src, expect = blob, t.to(getattr(torch, dtype))
        got = src.astype(dtype).to_torch()
        if dtype == "int8":  # torch's out-of-range float->int8 is implementation defined; compare in range
            mask = (t[3:].abs() < 127)
            assert torch.equal(got[mask], expect[mask])
        elif dtype == "bool":
            assert torch.equal(got, expect)
        else:  # bit-exact, except that NaN bit patterns are implementation defined
            nan = expect.isnan()
            assert torch.equal(got.isnan(), nan), dtype
            assert got[~nan].view(torch.uint8).tolist() == expect[~nan].view(torch.uint8).tolist(), dtype


@pytest.mark.parametrize("torch_min_bytes", [0, 1 << 62])  # the torch path, the numpy path
def test_vectorised_float_casts_match_torch_bit_for_bit(monkeypatch, torch_min_bytes):
    monkeypatch.setattr("fakes.dtypes._TORCH_CAST_MIN_BYTES", torch_min_bytes)
    gen = torch.Generator().manual_seed(5)
    t = torch.randn(2048, generator=gen, dtype=torch.float64) * 1000
    t[0], t[1], t[2], t[3] = float("inf"), float("nan"), 3.0e38, 1e300  # overflows
    t[4:64] = torch.randn(60, generator=gen, dtype=torch.float64) * 1e-6  # subnormal in float16
    floats = ("float64", "float32", "float16", "bfloat16")
    for src_dtype, dst_dtype in ((a, b) for a in floats for b in floats if a != b):
        src = TensorBlob.from_torch(t.to(getattr(torch, src_dtype)))
        got, expect = src.astype(dst_dtype).to_torch(), src.to_torch().to(getattr(torch, dst_dtype))
        nan = expect.isnan()
        assert torch.equal(got.isnan(), nan), (src_dtype, dst_dtype)
        assert torch.equal(got[~nan].view(torch.uint8), expect[~nan].view(torch.uint8)), (src_dtype, dst_dtype)


# --- digests, tiny model, store -----------------------------------------------------------------------------


def test_tiny_model_is_small_deterministic_and_hf_shaped():
    m = tiny_model()
    assert list(m) == list(TINY_SPEC)
    assert {"model.embed_tokens.weight", "model.layers.0.self_attn.q_proj.weight", "model.norm.weight",
            "lm_head.weight"} <= set(m)
    assert {b.dtype for b in m.values()} == {"float32", "bfloat16"}
    assert all((b.dtype, b.shape) == TINY_SPEC[n] for n, b in m.items())
    assert sum(b.nbytes for b in m.values()) < 64 * 1024
    assert weights_digest(tiny_model(0)) == weights_digest(tiny_model(0)) == WeightStore(tiny_model(0)).digest()
    assert weights_digest(tiny_model(1)) != weights_digest(tiny_model(0))
    # the values look like a model: small weights, norms near 1
    assert abs(m["model.norm.weight"].values()[0] - 1.0) < 0.5
    assert max(abs(v) for v in m["lm_head.weight"].values()) < 0.2


def test_store_digest_is_order_independent_and_equals_weights_digest():
    m = tiny_model()
    rev = dict(reversed(list(m.items())))
    store = WeightStore(m)
    assert store.digest() == WeightStore(rev).digest() == weights_digest(dict(store)) == weights_digest(rev)
    # other value forms give the same digest
    assert WeightStore({n: (b.dtype, b.shape, b.data) for n, b in m.items()}).digest() == store.digest()
    assert WeightStore(torch_state(m)).digest() == store.digest()
    assert store == WeightStore(rev) and len(store) == len(m) and store["lm_head.weight"] == m["lm_head.weight"]


@settings(max_examples=40, deadline=None)
@given(data=st.data())
def test_digest_changes_iff_content_changes(data):
    m = tiny_model()
    base = weights_digest(m)
    name = data.draw(st.sampled_from(sorted(m)))
    blob = m[name]
    kind = data.draw(st.sampled_from(["byte", "rename", "relabel", "reshape", "drop", "same"]))
    changed = dict(m)
    if kind == "byte":
        i = data.draw(st.integers(0, blob.nbytes - 1))
        flip = data.draw(st.integers(1, 255))
        raw = bytearray(blob.data)
        raw[i] ^= flip
        changed[name] = TensorBlob(blob.dtype, blob.shape, bytes(raw))
    elif kind == "rename":
        changed[name + ".x"] = changed.pop(name)
    elif kind == "relabel":  # same bytes, another dtype of the same width
        other = {"float32": "int32", "bfloat16": "float16"}[blob.dtype]
        changed[name] = TensorBlob(other, blob.shape, blob.data)
    elif kind == "reshape":  # same bytes, another shape
        changed[name] = TensorBlob(blob.dtype, (blob.numel,) if len(blob.shape) > 1 else (1, blob.numel), blob.data)
    elif kind == "drop":
        del changed[name]
    else:  # equal content, fresh objects
        changed[name] = TensorBlob(blob.dtype, list(blob.shape), bytearray(blob.data))
    assert (weights_digest(changed) == base) == (kind == "same")


def test_updated_loads_in_order_and_a_failure_keeps_what_came_before_it():
    store = WeightStore(tiny_model(0))
    new = perturbed(store, step=1)
    q = "model.layers.0.self_attn.q_proj.weight"
    # partial update: only the given names change
    partial = store.updated({q: new[q]})
    assert partial[q] == new[q] and partial["lm_head.weight"] == store["lm_head.weight"]
    assert partial.digest() != store.digest() and store[q] != new[q]  # the original store is untouched
    assert store.updated(new).digest() == weights_digest(new)

    bad_cases = {  # SGLang's own words: default_weight_loader's shape assert does not name the parameter
        "model.layers.9.mlp.up_proj.weight": (new[q], r"unknown parameter 'model\.layers\.9\.mlp\.up_proj\.weight'"),
        q: (TensorBlob.zeros("bfloat16", (8, 16)), r"^Attempted to load weight \(torch\.Size\(\[8, 16\]\)\) into "
            r"parameter \(torch\.Size\(\[16, 16\]\)\)$"),
        "lm_head.weight": (new["lm_head.weight"].astype("bfloat16"), r"'lm_head\.weight': dtype mismatch: got bfloat16"),
    }
    for name, (blob, pattern) in bad_cases.items():
        update = dict(new)  # every other entry is valid; the bad one stops the load there
        update[name] = blob
        with pytest.raises(WeightError, match=pattern) as failure:
            store.updated(update)
        before = list(update)[:list(update).index(name)]
        held = failure.value.partial
        if not before:
            assert held is None
            continue
        assert [n for n in store if held[n] == new[n]] == before  # the ones before it loaded, nothing after
    assert store.digest() == WeightStore(tiny_model(0)).digest()


def test_updated_cast_models_sglang_copy():
    store = WeightStore(tiny_model(0))
    f32 = TensorBlob.from_torch(torch.randn(16, 16))
    q = "model.layers.0.self_attn.q_proj.weight"  # stored as bfloat16
    out = store.updated({q: f32}, cast=True)
    assert out[q].dtype == "bfloat16"
    assert out[q].to_torch().tolist() == f32.to_torch().to(torch.bfloat16).tolist()


def test_perturbed_is_deterministic_and_distinct_per_step():
    m = tiny_model()
    digests = {weights_digest(perturbed(m, s)) for s in range(4)}
    assert len(digests) == 4 and weights_digest(m) not in digests
    assert weights_digest(perturbed(m, 2)) == weights_digest(perturbed(m, 2))
    assert weights_digest(perturbed(m, 2, seed=1)) != weights_digest(perturbed(m, 2))
    p = perturbed(m, 1)
    assert all(p[n].dtype == m[n].dtype and p[n].shape == m[n].shape and p[n] != m[n] for n in m)
    odd = {"i": TensorBlob.from_values("int8", (3,), [1, 2, 127]), "b": TensorBlob.from_values("bool", (2,), [True, False]),
           "f8": TensorBlob.from_torch(torch.tensor([0.5, 1.0, -2.0]).to(torch.float8_e4m3fn))}
    assert all(perturbed(odd, 0)[n] != odd[n] for n in odd)


# --- checkpoints: round trips for every layout a trainer writes ------------------------------------------


def write_hf_sharded_safetensors(path, state, shards=2):
    """What transformers' save_pretrained(max_shard_size=...) writes, with the real safetensors library."""
    os.makedirs(path, exist_ok=True)
    names = list(state)
    per = -(-len(names) // shards)
    weight_map = {}
    for i in range(shards):
        fname = f"model-{i + 1:05d}-of-{shards:05d}.safetensors"
        part = {n: state[n].contiguous() for n in names[i * per:(i + 1) * per]}
        safetensors_torch.save_file(part, os.path.join(path, fname), metadata={"format": "pt"})
        weight_map.update({n: fname for n in part})
    with open(os.path.join(path, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": 0}, "weight_map": weight_map}, f)


@pytest.mark.parametrize("layout", ["st_single", "st_sharded", "bin_single", "bin_sharded", "pt_file"])
def test_checkpoints_written_like_a_trainer_load_exactly(tmp_path, layout):
    m = perturbed(tiny_model(), step=3)
    state = torch_state(m)
    d = str(tmp_path / "ckpt")
    os.makedirs(d)
    load_format = None
    if layout == "st_single":
        safetensors_torch.save_file(state, os.path.join(d, "model.safetensors"), metadata={"format": "pt"})
    elif layout == "st_sharded":
        write_hf_sharded_safetensors(d, state, shards=3)
        # a stale single-file checkpoint left from an earlier save: the index filters it out (SGLang)
        safetensors_torch.save_file(torch_state(tiny_model(7)), os.path.join(d, "model.safetensors"))
    elif layout == "bin_single":  # save_pretrained(safe_serialization=False), e.g. minimind's half() state
        torch.save(state, os.path.join(d, "pytorch_model.bin"))
        torch.save({"lr": torch.tensor(1.0)}, os.path.join(d, "training_args.bin"))  # skipped like SGLang
    elif layout == "bin_sharded":
        names = list(state)
        torch.save({n: state[n] for n in names[:10]}, os.path.join(d, "pytorch_model-00001-of-00002.bin"))
        torch.save({n: state[n] for n in names[10:]}, os.path.join(d, "pytorch_model-00002-of-00002.bin"))
    else:
        torch.save(state, os.path.join(d, "model.pt"))
        load_format = "pt"
    loaded = load_checkpoint(d, load_format)
    assert set(loaded) == set(m)
    assert weights_digest(loaded) == weights_digest(m)
    assert WeightStore(tiny_model(0)).updated(loaded).digest() == weights_digest(m)


@pytest.mark.parametrize("fmt,shards", [("safetensors", 1), ("safetensors", 3), ("pt", 1), ("pt", 2)])
def test_save_checkpoint_is_readable_by_the_real_libraries(tmp_path, fmt, shards):
    m = perturbed(tiny_model(), step=5)
    d = str(tmp_path / "ckpt")
    save_checkpoint(d, m, fmt=fmt, shards=shards)
    files = sorted(os.listdir(d))
    assert "config.json" in files
    assert json.load(open(os.path.join(d, "config.json")))["num_hidden_layers"] == 2
    ext = ".safetensors" if fmt == "safetensors" else ".bin"
    weight_files = [f for f in files if f.endswith(ext)]
    assert len(weight_files) == shards
    if shards == 1:
        assert weight_files == (["model.safetensors"] if fmt == "safetensors" else ["pytorch_model.bin"])
    else:
        index = json.load(open(os.path.join(d, "model.safetensors.index.json" if fmt == "safetensors"
                                            else "pytorch_model.bin.index.json")))
        assert set(index["weight_map"]) == set(m) and set(index["weight_map"].values()) == set(weight_files)
    merged = {}
    for f in weight_files:
        if fmt == "safetensors":
            merged.update(safetensors_torch.load_file(os.path.join(d, f)))
            from safetensors import safe_open

            with safe_open(os.path.join(d, f), "pt") as sf:
                assert sf.metadata() == {"format": "pt"}
        else:
            merged.update(torch.load(os.path.join(d, f), weights_only=True))
    assert weights_digest({n: TensorBlob.from_torch(t) for n, t in merged.items()}) == weights_digest(m)
    assert weights_digest(load_checkpoint(d)) == weights_digest(m)


def test_stdlib_safetensors_writer_matches_the_library_byte_for_byte():
    m = tiny_model()
    ours = encode_safetensors(m, {"format": "pt"})
    theirs = safetensors_torch.save(torch_state(m), metadata={"format": "pt"})
    assert decode_safetensors(theirs)[0] == decode_safetensors(ours)[0] == m
    assert ours == theirs


def test_load_format_selection_is_sglangs(tmp_path):
    m = tiny_model()
    d = str(tmp_path / "bin")
    save_checkpoint(d, m, fmt="pt")
    assert load_checkpoint(d, "auto") == load_checkpoint(d) == m
    # SGLang's load_format="pt" globs *.pt, not pytorch_model.bin
    with pytest.raises(CheckpointError, match=r"Cannot find any model weights with .*\*\.pt") as e:
        load_checkpoint(d, "pt")
    assert e.value.stage == "iterator"
    with pytest.raises(CheckpointError, match="Cannot find any model weights"):
        load_checkpoint(d, "safetensors")
    with pytest.raises(CheckpointError, match=r"Unknown load_format: 'gguf'.*'auto', 'safetensors', 'pt'") as e:
        load_checkpoint(d, "gguf")
    assert e.value.stage == "loader"
    both = str(tmp_path / "both")  # safetensors wins over .bin in auto
    save_checkpoint(both, m)
    torch.save(torch_state(tiny_model(1)), os.path.join(both, "pytorch_model.bin"))
    assert load_checkpoint(both) == m


# --- checkpoints: half-written and broken -----------------------------------------------------------------


def test_truncated_safetensors_fails_at_every_cut_with_the_librarys_reason(tmp_path):
    m = tiny_model()
    d = tmp_path / "ckpt"
    save_checkpoint(str(d), m)
    full = (d / "model.safetensors").read_bytes()
    header_len = struct.unpack("<Q", full[:8])[0]
    cuts = {0: "header too small", 5: "header too small", 8: "invalid header length",
            8 + header_len // 2: "invalid header length", 8 + header_len: "incomplete metadata",
            8 + header_len + 100: "incomplete metadata", len(full) // 2: "incomplete metadata",
            len(full) - 1: "incomplete metadata"}
    for cut, reason in cuts.items():
        (d / "model.safetensors").write_bytes(full[:cut])
        with pytest.raises(CheckpointError) as e:
            load_checkpoint(str(d))
        msg = str(e.value)
        assert msg.startswith(f"Error while deserializing header: {reason}") and "model.safetensors" in msg, (cut, msg)
        assert e.value.stage == "load"
        # the real library refuses the same file for the same reason
        from safetensors import SafetensorError, safe_open

        with pytest.raises(SafetensorError, match=reason.split(":")[0]):
            with safe_open(str(d / "model.safetensors"), "pt") as f:
                [f.get_tensor(k) for k in f.keys()]


def test_corrupt_safetensors_headers(tmp_path):
    d = tmp_path / "ckpt"
    d.mkdir()

    def write(header: bytes, body: bytes = b""):
        (d / "model.safetensors").write_bytes(struct.pack("<Q", len(header)) + header + body)

    cases = [
        (b'{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]', b"", "invalid JSON in header"),
        (b'{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,4]}}', b"\0" * 4, "invalid shape, data type, or offset for tensor `a`"),
        (b'{"a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}}', b"\0" * 8, "invalid offset for tensor `a`"),
        (b'{"a":{"dtype":"C64","shape":[1],"data_offsets":[0,8]}}', b"\0" * 8, "unsupported dtype `C64`"),
        (b'{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}}', b"\0" * 6, "incomplete metadata, file not fully covered"),
        (b"\xff\xfe", b"", "invalid JSON in header"),
        (struct.pack("<Q", 10**9)[:0] + b"[]", b"", "expected an object"),
    ]
    for header, body, reason in cases:
        write(header, body)
        with pytest.raises(CheckpointError, match=reason.replace("(", r"\(").replace("`", "`")):
            load_checkpoint(str(d))
    (d / "model.safetensors").write_bytes(struct.pack("<Q", 200_000_000))
    with pytest.raises(CheckpointError, match="header too large"):
        load_checkpoint(str(d))


def test_sharded_checkpoint_half_written(tmp_path):
    m = tiny_model()
    d = tmp_path / "ckpt"
    save_checkpoint(str(d), m, shards=3)
    shard2 = d / "model-00002-of-00003.safetensors"
    blob2 = shard2.read_bytes()
    # the index is written but shard 2 is not there yet
    shard2.unlink()
    # SGLang 0.5.23 fails fast (weight_utils.filter_duplicate_safetensors_files); strict says it its own way
    with pytest.raises(CheckpointError, match=r"references 1 shard file\(s\) missing from .*\(incomplete "
                                              r"download\?\): \['model-00002-of-00003\.safetensors'\]") as e:
        load_checkpoint(str(d))
    assert e.value.stage == "iterator"
    with pytest.raises(CheckpointError, match=r"names shard\(s\) that do not exist: model-00002-of-00003\.safetensors"):
        load_checkpoint(str(d), strict=True, missing_shards="skip")
    # SGLang up to 0.5.16 silently loads the shards present: a partial update
    partial = load_checkpoint(str(d), missing_shards="skip")
    assert 0 < len(partial) < len(m)
    # shard 2 exists but holds fewer tensors than the index says: SGLang loads it as it is, strict refuses
    part = decode_safetensors(blob2)[0]
    dropped = sorted(part)[0]
    shard2.write_bytes(encode_safetensors({n: b for n, b in part.items() if n != dropped}))
    with pytest.raises(CheckpointError, match=rf"model-00002-of-00003\.safetensors does not contain tensor '{dropped}'"):
        load_checkpoint(str(d), strict=True)
    assert sorted(load_checkpoint(str(d))) == sorted(n for n in m if n != dropped)
    # shard 2 truncated mid-write
    shard2.write_bytes(blob2[: len(blob2) - 7])
    with pytest.raises(CheckpointError, match=r"incomplete metadata.*model-00002-of-00003\.safetensors"):
        load_checkpoint(str(d))
    # the index itself half-written
    shard2.write_bytes(blob2)
    index = (d / "model.safetensors.index.json").read_bytes()
    (d / "model.safetensors.index.json").write_bytes(index[: len(index) // 2])
    with pytest.raises(CheckpointError, match=r"model\.safetensors\.index\.json cannot be parsed"):
        load_checkpoint(str(d))
    (d / "model.safetensors.index.json").write_bytes(index)
    assert load_checkpoint(str(d)) == m


def test_tmp_dir_mid_write_and_rename(tmp_path):
    """The trainer writes into ckpt.tmp and renames it when done (the seed's atomic fix)."""
    m = perturbed(tiny_model(), step=1)
    final, tmp = tmp_path / "step_1", tmp_path / "step_1.tmp"
    tmp.mkdir()
    (tmp / "config.json").write_text("{}")  # save_pretrained writes config.json first
    with pytest.raises(CheckpointError, match=r"step_1' does not exist.*not have renamed it yet") as e:
        load_checkpoint(str(final))  # engine told about the final path too early
    assert e.value.stage == "iterator"
    with pytest.raises(CheckpointError, match=r"Cannot find any model weights with `.*step_1\.tmp`"):
        load_checkpoint(str(tmp))  # engine pointed at the tmp dir mid-write: no weights yet
    save_checkpoint(str(tmp), m)
    full = (tmp / "model.safetensors").read_bytes()
    (tmp / "model.safetensors").write_bytes(full[: len(full) // 3])
    with pytest.raises(CheckpointError, match="incomplete metadata"):
        load_checkpoint(str(tmp))
    (tmp / "model.safetensors").write_bytes(full)
    os.rename(tmp, final)
    assert weights_digest(load_checkpoint(str(final))) == weights_digest(m)
    not_a_dir = tmp_path / "file"
    not_a_dir.write_text("x")
    with pytest.raises(CheckpointError, match="is a file, not a directory"):
        load_checkpoint(str(not_a_dir))


def test_truncated_torch_bin(tmp_path):
    m = tiny_model()
    d = tmp_path / "ckpt"
    save_checkpoint(str(d), m, fmt="pt")
    full = (d / "pytorch_model.bin").read_bytes()
    for cut in (0, 100, len(full) // 2, len(full) - 10):
        (d / "pytorch_model.bin").write_bytes(full[:cut])
        with pytest.raises(CheckpointError, match=r"pytorch_model\.bin: cannot be read by torch\.load") as e:
            load_checkpoint(str(d))
        assert e.value.stage == "load"
    torch.save([1, 2], str(d / "pytorch_model.bin"))
    with pytest.raises(CheckpointError, match="expected a state dict"):
        load_checkpoint(str(d))


def test_duplicate_tensor_across_files_without_index(tmp_path):
    d = tmp_path / "ckpt"
    d.mkdir()
    m = tiny_model()
    (d / "a.safetensors").write_bytes(encode_safetensors(m))
    (d / "b.safetensors").write_bytes(encode_safetensors({"lm_head.weight": m["lm_head.weight"]}))
    with pytest.raises(CheckpointError, match=r"'lm_head\.weight' appears in both a\.safetensors and b\.safetensors"):
        load_checkpoint(str(d), strict=True)
    assert load_checkpoint(str(d))["lm_head.weight"] == m["lm_head.weight"]


# --- tensor payloads --------------------------------------------------------------------------------------


def sglang_serialize(named, output_str=True):
    """SGLang's MultiprocessingSerializer.serialize, as a trainer calls it (re-stated, not imported)."""
    from multiprocessing.reduction import ForkingPickler

    buf = io.BytesIO()
    ForkingPickler(buf).dump(named)
    data = buf.getvalue()
    return base64.b64encode(data).decode("utf-8") if output_str else data


def sglang_deserialize(data):
    if isinstance(data, str):
        data = base64.b64decode(data, validate=True)
    return pickle.loads(data)


@pytest.mark.parametrize("fmt", ["torch", "pickle"])
def test_tensor_payload_round_trip(fmt):
    m = perturbed(tiny_model(), step=2)
    item = encode_tensor_payload(m, fmt)
    assert isinstance(item, str)
    decoded = decode_tensor_payload(item)
    assert list(decoded) == list(m) and weights_digest(decoded) == weights_digest(m)
    named = sglang_deserialize(encode_tensor_payload(m, fmt))  # what real SGLang sees: a list of (name, tensor)
    assert [n for n, _ in named] == list(m)
    assert all(torch.equal(t.view(torch.uint8), m[n].to_torch().view(torch.uint8)) for n, t in named)


@pytest.mark.parametrize("decode", [decode_tensor_payload, decode_lora_tensor_payload])
def test_a_payload_deserialize_cannot_read_is_undecodable_and_says_what_it_is(decode):
    """A safetensors buffer (or any non-pickle) is what ``MultiprocessingSerializer.deserialize`` cannot read:
    ``UndecodablePayload`` (SGLang's scheduler dies on it), naming the buffer and the form SGLang reads."""
    buffer = base64.b64encode(encode_safetensors(tiny_model())).decode()
    with pytest.raises(UndecodablePayload, match=r"is a safetensors buffer: SGLang reads it with "
                                                 r"MultiprocessingSerializer\.deserialize"):
        decode(buffer)
    with pytest.raises(UndecodablePayload, match="is not a pickle"):
        decode(base64.b64encode(b"hello").decode())


def test_payload_made_by_a_trainer_the_sglang_way():
    m = tiny_model()
    named = [(n, t) for n, t in torch_state(m).items()]
    assert weights_digest(decode_tensor_payload(sglang_serialize(named))) == weights_digest(m)
    # raw bytes, as SGLang's Engine API passes them (no base64)
    assert weights_digest(decode_tensor_payload(sglang_serialize(named, output_str=False))) == weights_digest(m)
    assert weights_digest(decode_tensor_payload(pickle.dumps(named))) == weights_digest(m)


def test_torch_payload_handles_are_single_use(monkeypatch):
    item = encode_tensor_payload(tiny_model(), "torch")
    decode_tensor_payload(item)
    # the sender's multiprocessing resource sharer reports the unknown handle through sys.excepthook
    reported = threading.Event()
    monkeypatch.setattr(sys, "excepthook", lambda *exc: reported.set())
    with pytest.raises(WeightError, match="shared-memory handles"):
        decode_tensor_payload(item)
    assert reported.wait(10)


def test_bad_payloads():
    with pytest.raises(WeightError, match="not valid base64"):
        decode_tensor_payload("not base64!!")
    with pytest.raises(WeightError, match="not valid base64"):
        decode_tensor_payload("abc")  # bad padding
    with pytest.raises(WeightError, match="not valid base64"):
        decode_tensor_payload("zé==")
    with pytest.raises(UndecodablePayload, match="the tensor payload is not a pickle"):
        decode_tensor_payload(base64.b64encode(b"hello world, not tensors").decode())
    with pytest.raises(WeightError, match="blocked unpickle of posix.system|blocked unpickle of os.system"):
        decode_tensor_payload(base64.b64encode(pickle.dumps(os.system)).decode())
    with pytest.raises(WeightError, match="is a dict; SGLang expects a list of \\(name, tensor\\) pairs"):
        decode_tensor_payload(base64.b64encode(pickle.dumps({"w": torch.zeros(2)})).decode())
    with pytest.raises(WeightError, match="item 0 is not a \\(name: str, tensor\\) pair"):
        decode_tensor_payload(base64.b64encode(pickle.dumps([("w", [1.0, 2.0])])).decode())
    good = base64.b64decode(encode_tensor_payload(tiny_model(), "pickle"))
    with pytest.raises(WeightError, match="undecodable tensor payload"):
        decode_tensor_payload(base64.b64encode(good[: len(good) // 2]).decode())
    with pytest.raises(WeightError, match="must be a str or bytes"):
        decode_tensor_payload(123)


# --- LoRA ----------------------------------------------------------------------------------------------


def test_lora_adapter_round_trip_and_failures(tmp_path):
    lora = tiny_lora()
    d = tmp_path / "lora"
    save_lora_adapter(str(d), lora)
    assert sorted(os.listdir(d)) == ["adapter_config.json", "adapter_model.safetensors"]
    got = load_lora_adapter(str(d))
    assert got["config"]["r"] == 4 and got["tensors"] == lora
    # written by PEFT-style code with the real libraries
    peft = tmp_path / "peft"
    peft.mkdir()
    safetensors_torch.save_file(torch_state(lora), str(peft / "adapter_model.safetensors"))
    (peft / "adapter_config.json").write_text(json.dumps({"r": 4, "lora_alpha": 8, "target_modules": ["q_proj"]}))
    assert load_lora_adapter(str(peft))["tensors"] == lora
    binary = tmp_path / "bin"
    save_lora_adapter(str(binary), lora, fmt="pt")
    assert load_lora_adapter(str(binary))["tensors"] == lora
    # failures
    with pytest.raises(CheckpointError, match="is not a directory"):
        load_lora_adapter(str(tmp_path / "nope"))
    (peft / "adapter_config.json").unlink()
    with pytest.raises(CheckpointError, match="Can't find 'adapter_config.json'"):
        load_lora_adapter(str(peft))
    (peft / "adapter_config.json").write_text('{"r": 4, "target_')
    with pytest.raises(CheckpointError, match="adapter_config.json cannot be parsed"):
        load_lora_adapter(str(peft))
    (peft / "adapter_config.json").write_text('{"lora_alpha": 8}')
    with pytest.raises(CheckpointError, match="lacks r, target_modules"):
        load_lora_adapter(str(peft))
    raw = (d / "adapter_model.safetensors").read_bytes()
    (d / "adapter_model.safetensors").write_bytes(raw[:-1])
    with pytest.raises(CheckpointError, match="incomplete metadata"):
        load_lora_adapter(str(d))
    (d / "adapter_model.safetensors").unlink()
    with pytest.raises(CheckpointError, match="Cannot find any model weights"):
        load_lora_adapter(str(d))


# --- /get_weights_by_name -----------------------------------------------------------------------------


def sglang_preview(t, truncate_size):
    """SGLang's model.get_weights_by_name: weight.cpu().to(torch.float32).numpy().tolist()[:truncate_size]."""
    return t.cpu().to(torch.float32).numpy().tolist()[:truncate_size]


@pytest.mark.parametrize("dtype", ALL_DTYPES)
def test_values_preview_matches_sglang(dtype):
    gen = torch.Generator().manual_seed(4)
    for shape in [(7,), (5, 3), (4, 2, 3)]:
        t = random_tensor(dtype, shape, gen)
        blob = TensorBlob.from_torch(t)
        for n in (0, 2, 100, -1):
            got = values_preview(blob, n)
            expect = sglang_preview(t, n)
            assert _same(got, expect), (dtype, shape, n, got, expect)
    assert values_preview(TensorBlob.from_torch(torch.tensor(1.5))) is None  # SGLang: scalar slice fails -> None
    m = tiny_model()
    prev = values_preview(m["lm_head.weight"])
    assert len(prev) == 64 and len(prev[0]) == 16 and all(type(v) is float for v in prev[0])


def _same(a, b):
    if isinstance(a, list):
        return isinstance(b, list) and len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    return (a != a and b != b) or a == b  # NaN == NaN here


# --- vendoring ------------------------------------------------------------------------------------------


@pytest.mark.slow  # a second Python process
def test_weights_work_without_torch_numpy_or_safetensors():
    code = (
        "import sys\n"
        "import fakes.weights as w\n"
        "import tempfile, os\n"
        "m = w.tiny_model(); d = tempfile.mkdtemp(); w.save_checkpoint(d, w.perturbed(m, 1), shards=2)\n"
        "assert w.weights_digest(w.load_checkpoint(d)) == w.weights_digest(w.perturbed(m, 1))\n"
        "bad = [n for n in sys.modules if n.split('.')[0] in ('torch', 'numpy', 'safetensors', 'pytest', 'hypothesis', 'conformance')]\n"
        "assert not bad, bad\n"
    )
    repo = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60, cwd=repo,
                   env=dict(os.environ, PYTHONPATH=repo))
