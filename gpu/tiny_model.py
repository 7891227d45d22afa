"""A tiny random Llama-family model built locally (no download): ``python -m gpu.tiny_model OUT``.

Writes a directory real SGLang serves and the fake serves through ``--model-path``: ``config.json``
(``LlamaForCausalLM``), ``model.safetensors`` (seeded random weights, HF parameter names), a byte-level BPE
``tokenizer.json`` built with the ``tokenizers`` package (every byte is a token, so any text encodes; no merges, so
nothing needs training data), ``tokenizer_config.json``, ``special_tokens_map.json`` and ``generation_config.json``.

The model has no end-of-sequence token (``eos_token_id`` null in ``config.json`` and ``generation_config.json``, no
``eos_token`` in the tokenizer; ``<|end_of_text|>`` stays in the vocabulary as the padding token), so real engines end
a request only at its ``max_new_tokens`` or a stop the request names, as the fake does: the suite sizes its turns in
decode time, and a random model's EOS ended them early (on real vLLM 0.32, turns sized 4 s ended at a stop token after
0.2–2.7 s, and no request was left to outlast a drain). ``null`` must be written: ``transformers.LlamaConfig`` reads a
missing ``eos_token_id`` as 2, a byte token.

The default shape keeps ``head_dim`` at 64 (``hidden_size // num_attention_heads``, which is also how SGLang's
``LlamaForCausalLM.get_weights_by_name`` slices q/k/v): attention kernels on GPUs support it everywhere.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

SPECIAL_TOKENS = ("<|begin_of_text|>", "<|end_of_text|>")


@dataclass(frozen=True)
class TinyModelConfig:
    """The model's shape and how its weights are drawn."""

    hidden_size: int = 128
    intermediate_size: int = 256
    num_hidden_layers: int = 2
    num_attention_heads: int = 2
    num_key_value_heads: int = 1
    vocab_size: int = 320
    """Rows of the embedding: at least the tokenizer's 258 tokens (256 bytes + 2 special), padded to a multiple
    of 64."""
    max_position_embeddings: int = 4096
    dtype: str = "bfloat16"
    seed: int = 0

    def check(self) -> None:
        """Raise ValueError naming the first inconsistent field."""
        if min(self.hidden_size, self.intermediate_size, self.num_hidden_layers, self.num_attention_heads,
               self.num_key_value_heads, self.max_position_embeddings) < 1:
            raise ValueError("every size must be >= 1")
        if self.hidden_size % self.num_attention_heads:
            raise ValueError(f"hidden_size {self.hidden_size} is not a multiple of num_attention_heads "
                             f"{self.num_attention_heads}")
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError(f"num_attention_heads {self.num_attention_heads} is not a multiple of "
                             f"num_key_value_heads {self.num_key_value_heads}")
        if self.vocab_size < 256 + len(SPECIAL_TOKENS):
            raise ValueError(f"vocab_size {self.vocab_size} is smaller than the tokenizer's "
                             f"{256 + len(SPECIAL_TOKENS)} tokens")
        if self.dtype not in ("bfloat16", "float16", "float32"):
            raise ValueError(f"dtype {self.dtype!r} is not one of bfloat16, float16, float32")

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads


CPU_TEST_MODEL = TinyModelConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=1, num_attention_heads=1,
                                 num_key_value_heads=1)
"""The smallest model with the same structure (head_dim 64): for CPU tests, where every digest reads every value."""


def hf_config(c: TinyModelConfig) -> dict[str, Any]:
    """``config.json`` as ``transformers.LlamaConfig`` writes it."""
    bos = 256
    return {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": c.hidden_size,
            "intermediate_size": c.intermediate_size, "num_hidden_layers": c.num_hidden_layers,
            "num_attention_heads": c.num_attention_heads, "num_key_value_heads": c.num_key_value_heads,
            "head_dim": c.head_dim, "vocab_size": c.vocab_size, "max_position_embeddings": c.max_position_embeddings,
            "rms_norm_eps": 1e-6, "rope_theta": 10000.0, "rope_scaling": None, "hidden_act": "silu",
            "attention_bias": False, "attention_dropout": 0.0, "mlp_bias": False, "initializer_range": 0.02,
            "tie_word_embeddings": False, "torch_dtype": c.dtype, "bos_token_id": bos, "eos_token_id": None,
            "use_cache": True}


def parameter_shapes(c: TinyModelConfig) -> dict[str, tuple[int, ...]]:
    """Every parameter of ``LlamaForCausalLM`` by its checkpoint name, in the order ``save_pretrained`` lists them."""
    h, kv = c.hidden_size, c.num_key_value_heads * c.head_dim
    shapes: dict[str, tuple[int, ...]] = {"model.embed_tokens.weight": (c.vocab_size, h)}
    for i in range(c.num_hidden_layers):
        p = f"model.layers.{i}."
        shapes.update({p + "self_attn.q_proj.weight": (h, h), p + "self_attn.k_proj.weight": (kv, h),
                       p + "self_attn.v_proj.weight": (kv, h), p + "self_attn.o_proj.weight": (h, h),
                       p + "mlp.gate_proj.weight": (c.intermediate_size, h),
                       p + "mlp.up_proj.weight": (c.intermediate_size, h),
                       p + "mlp.down_proj.weight": (h, c.intermediate_size),
                       p + "input_layernorm.weight": (h,), p + "post_attention_layernorm.weight": (h,)})
    shapes.update({"model.norm.weight": (h,), "lm_head.weight": (c.vocab_size, h)})
    return shapes


def random_weights(c: TinyModelConfig) -> dict[str, Any]:
    """Seeded weights: normal(0, 0.02) matrices, norms at one (as a freshly initialised Llama)."""
    import torch

    gen = torch.Generator().manual_seed(c.seed)
    dtype = getattr(torch, c.dtype)
    return {name: (torch.ones(shape) if len(shape) == 1 else 0.02 * torch.randn(shape, generator=gen)).to(dtype)
            for name, shape in parameter_shapes(c).items()}


def build_tokenizer() -> Any:
    """A byte-level BPE tokenizer with no merges: ids 0..255 are the bytes, then the special tokens."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    vocab = {ch: byte for byte, ch in enumerate(byte_level_chars())}
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.add_special_tokens(list(SPECIAL_TOKENS))
    return tokenizer


def byte_level_chars() -> list[str]:
    """The character byte-level BPE writes for each byte 0..255 (GPT-2's table: printable bytes stand for
    themselves, the others take the code points from 256 on, in byte order)."""
    printable = set(range(ord("!"), ord("~") + 1)) | set(range(0xA1, 0xAC + 1)) | set(range(0xAE, 0xFF + 1))
    shifted = iter(range(256, 512))
    return [chr(b) if b in printable else chr(next(shifted)) for b in range(256)]


def write_model(out: Path, config: TinyModelConfig = TinyModelConfig()) -> Path:
    """Write the model directory ``out`` (created; must not exist or be empty) and return it."""
    config.check()
    out = Path(out)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise FileExistsError(f"{out} exists and is not an empty directory")
    from safetensors.torch import save_file

    tokenizer = build_tokenizer()  # before anything is written: a missing package leaves no half-built directory
    out.mkdir(parents=True, exist_ok=True)
    cfg = hf_config(config)
    (out / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    save_file(random_weights(config), str(out / "model.safetensors"), metadata={"format": "pt"})
    tokenizer.save(str(out / "tokenizer.json"))
    bos, pad = SPECIAL_TOKENS
    (out / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "bos_token": bos, "pad_token": pad,
        "add_bos_token": False, "clean_up_tokenization_spaces": False,
        "model_max_length": config.max_position_embeddings},
        indent=2) + "\n")
    (out / "special_tokens_map.json").write_text(json.dumps({"bos_token": bos, "pad_token": pad},
                                                            indent=2) + "\n")
    (out / "generation_config.json").write_text(json.dumps({"bos_token_id": cfg["bos_token_id"],
                                                            "eos_token_id": cfg["eos_token_id"]}, indent=2) + "\n")
    (out / "tiny_model.json").write_text(json.dumps(asdict(config), indent=2) + "\n")
    return out


def main(argv: list[str] | None = None) -> int:
    defaults = TinyModelConfig()
    parser = argparse.ArgumentParser(prog="python -m gpu.tiny_model",
                                     description="Write a tiny random Llama model directory (config, safetensors "
                                                 "weights, tokenizer) that SGLang and the fake serve.")
    parser.add_argument("out", type=Path, help="directory to create (must not exist, or be empty)")
    for name in ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                 "num_key_value_heads", "vocab_size", "seed"):
        parser.add_argument("--" + name.replace("_", "-"), type=int, default=getattr(defaults, name))
    parser.add_argument("--dtype", default=defaults.dtype, choices=("bfloat16", "float16", "float32"))
    parser.add_argument("--cpu-test", action="store_true",
                        help="the smallest model of the same structure (what the CPU tests serve)")
    args = parser.parse_args(argv)
    fields = {k: v for k, v in vars(args).items() if k not in ("out", "cpu_test")}
    config = CPU_TEST_MODEL if args.cpu_test else TinyModelConfig(**fields)
    try:
        write_model(args.out, config)
    except (ValueError, FileExistsError, ImportError) as exc:
        print(f"python -m gpu.tiny_model: error: {exc}", file=sys.stderr)
        return 2
    print(args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
