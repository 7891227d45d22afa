"""The tiny model builder: a complete Llama directory written locally, a tokenizer that encodes any text, and clean
errors for bad input (exit 2, nothing written)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors import safe_open

from gpu.tiny_model import CPU_TEST_MODEL, SPECIAL_TOKENS, TinyModelConfig, main, parameter_shapes, write_model
from gpu.weights import read_weights

pytestmark = pytest.mark.cpu
ROOT = Path(__file__).resolve().parents[2]


def test_the_directory_holds_config_weights_and_tokenizer(tmp_path: Path) -> None:
    out = write_model(tmp_path / "m", CPU_TEST_MODEL)
    config = json.loads((out / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"] and config["model_type"] == "llama"
    assert config["head_dim"] == config["hidden_size"] // config["num_attention_heads"] == 64
    with safe_open(str(out / "model.safetensors"), framework="pt") as f:
        shapes = {name: tuple(f.get_slice(name).get_shape()) for name in f.keys()}
        assert {f.get_slice(name).get_dtype() for name in f.keys()} == {"BF16"}
    assert shapes == parameter_shapes(CPU_TEST_MODEL)
    assert shapes["model.layers.0.self_attn.k_proj.weight"] == (64, 64)
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "generation_config.json"):
        assert (out / name).is_file()
    assert json.loads((out / "tokenizer_config.json").read_text())["pad_token"] == SPECIAL_TOKENS[1]


def test_the_model_has_no_end_of_sequence_token(tmp_path: Path) -> None:
    """Real engines end a request only at its budget, as the fake does: ``eos_token_id`` is written as null (a missing
    one reads as 2 in ``transformers.LlamaConfig``) and the tokenizer declares no ``eos_token``."""
    out = write_model(tmp_path / "m", CPU_TEST_MODEL)
    for name in ("config.json", "generation_config.json"):
        config = json.loads((out / name).read_text())
        assert "eos_token_id" in config and config["eos_token_id"] is None, name
    for name in ("tokenizer_config.json", "special_tokens_map.json"):
        assert "eos_token" not in json.loads((out / name).read_text()), name


def test_the_tokenizer_encodes_any_text_byte_by_byte(tmp_path: Path) -> None:
    from tokenizers import Tokenizer

    out = write_model(tmp_path / "m", CPU_TEST_MODEL)
    tokenizer = Tokenizer.from_file(str(out / "tokenizer.json"))
    text = "Prompt 3 (seed 7): solve ünïcode → 42"
    encoding = tokenizer.encode(text)
    assert encoding.ids == list(text.encode())
    assert tokenizer.decode(encoding.ids) == text
    assert tokenizer.token_to_id(SPECIAL_TOKENS[1]) == 257
    assert tokenizer.get_vocab_size() <= CPU_TEST_MODEL.vocab_size


def test_weights_are_seeded_and_read_back_exactly(tmp_path: Path) -> None:
    a = read_weights(write_model(tmp_path / "a", CPU_TEST_MODEL))
    b = read_weights(write_model(tmp_path / "b", CPU_TEST_MODEL))
    c = read_weights(write_model(tmp_path / "c", TinyModelConfig(**{**CPU_TEST_MODEL.__dict__, "seed": 1})))
    name = "model.layers.0.mlp.up_proj.weight"
    assert all(torch.equal(a[n], b[n]) for n in a)
    assert not torch.equal(a[name], c[name])
    assert torch.equal(a["model.norm.weight"], torch.ones(64, dtype=torch.bfloat16))
    assert 0.01 < a[name].float().std().item() < 0.03


@pytest.mark.slow  # a second Python process
def test_the_cli_writes_the_default_model(tmp_path: Path) -> None:
    out = tmp_path / "tiny"
    result = subprocess.run([sys.executable, "-m", "gpu.tiny_model", str(out), "--dtype", "float32"], cwd=ROOT,
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == str(out)
    weights = read_weights(out)
    assert weights["lm_head.weight"].dtype == torch.float32
    assert weights["model.embed_tokens.weight"].shape == (TinyModelConfig().vocab_size, TinyModelConfig().hidden_size)


@pytest.mark.parametrize(("args", "error"), [
    (["--num-attention-heads", "3"], "hidden_size 128 is not a multiple of num_attention_heads 3"),
    (["--vocab-size", "100"], "vocab_size 100 is smaller than the tokenizer's 258 tokens"),
    (["--num-key-value-heads", "0"], "every size must be >= 1"),
])
def test_bad_shapes_exit_2_and_write_nothing(tmp_path: Path, capsys: pytest.CaptureFixture, args: list[str],
                                             error: str) -> None:
    assert main([str(tmp_path / "m"), *args]) == 2
    err = capsys.readouterr().err
    assert err.strip() == f"python -m gpu.tiny_model: error: {error}"
    assert not (tmp_path / "m").exists()


def test_an_existing_directory_is_never_overwritten(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "keep.txt").write_text("mine")
    assert main([str(tmp_path / "m")]) == 2
    assert "exists and is not an empty directory" in capsys.readouterr().err
    assert [p.name for p in (tmp_path / "m").iterdir()] == ["keep.txt"]
