"""The fake vLLM's prefix cache (``fakes/vllm/prefix_cache.py``), as measured on vLLM 0.32.0 on CPU
(``gpu/fidelity/vllm.py``, the prefix steps): full blocks of 128 tokens, keyed by the salt and the adapter's name and
path, kept across weight loads and relabels, dropped by a reset, a pause that clears the caches and a sleep; and the
engine's truth of which cached tokens the old weights computed."""

from __future__ import annotations

from pathlib import Path

import pytest

from fakes.checkpoints import save_checkpoint, save_lora_adapter
from fakes.tiny_model import perturbed, tiny_lora, tiny_model
from fakes.vllm import FakeVLLMEngine
from fakes.vllm.prefix_cache import PrefixCache

pytestmark = pytest.mark.cpu

LONG = list(range(5, 305))  # 300 tokens: two full blocks and more


async def cached(wire, prompt: list[int] = LONG, **extra: object) -> int | None:
    """One short completion; the prompt tokens the cache served (None: no details answered)."""
    body = {"model": extra.pop("model", wire.engine.served_model_name), "prompt": prompt, "max_tokens": 2, **extra}
    task = wire.spawn("POST", "/v1/completions", json=body)
    answer = (await wire.step_until_done([task]))[0]
    assert answer.status_code == 200, answer.text
    details = answer.json()["usage"]["prompt_tokens_details"]
    return None if details is None else details["cached_tokens"]


def details_on(**kw: object) -> FakeVLLMEngine:
    return FakeVLLMEngine(enable_prompt_tokens_details=True, **kw)


@pytest.mark.asyncio
async def test_hits_are_whole_blocks_one_token_short_of_the_prompt_and_keyed_by_the_salt(connect) -> None:
    wire = await connect(details_on())
    assert [await cached(wire), await cached(wire), await cached(wire, LONG[:200])] == [0, 256, 128]
    assert await cached(wire, LONG[:257]) == 256 and await cached(wire, LONG[:256]) == 128  # never the last token
    assert [await cached(wire, cache_salt="s1"), await cached(wire, cache_salt="s1")] == [0, 256]
    assert await cached(wire, cache_salt="s2") == 0


@pytest.mark.asyncio
async def test_without_the_details_flag_usage_says_nothing_and_a_bad_salt_is_refused_as_vllm_refuses_it(connect):
    wire = await connect(FakeVLLMEngine())
    assert await cached(wire) is None
    body = {"model": wire.engine.served_model_name, "prompt": LONG, "max_tokens": 2}
    for salt, why in (("", "must be a non-empty string if provided"), ("a/b", "must be at most 128 characters")):
        answer = await wire.post("/v1/completions", {**body, "cache_salt": salt})
        error = answer.json()["error"]
        assert answer.status_code == 400 and why in error["message"] and error["param"] == "cache_salt"
        assert error["type"] == "BadRequestError"


@pytest.mark.asyncio
async def test_loads_and_relabels_keep_the_cache_and_the_truth_names_the_stale_tokens(connect, tmp_path: Path) -> None:
    wire = await connect(details_on())
    await cached(wire)
    await wire.post("/update_weight_version", {"new_version": "v1"})
    assert await cached(wire) == 256
    save_checkpoint(str(tmp_path / "ck"), perturbed(tiny_model(0), step=1))
    assert (await wire.post("/collective_rpc", {"method": "reload_weights",
                                                "kwargs": {"weights_path": str(tmp_path / "ck")}})).status_code == 200
    assert await cached(wire) == 256  # served over the KV the old weights computed
    hits = [e.fields for e in wire.engine.events.of_kind("prefix.hit")]
    assert [(h["cached_tokens"], h["stale_tokens"]) for h in hits] == [(256, 0), (256, 256)]


@pytest.mark.asyncio
@pytest.mark.parametrize("query", [{"mode": "keep"}, {"mode": "wait"}, {"mode": "abort"}])
async def test_a_pause_clears_the_cache_unless_told_not_to(connect, query: dict) -> None:
    wire = await connect(details_on())
    await cached(wire)
    await wire.post("/pause", params={**query, "clear_cache": "false"})
    await wire.post("/resume")
    assert await cached(wire) == 256
    await wire.post("/pause", params=query)
    await wire.post("/resume")
    assert [await cached(wire), await cached(wire)] == [0, 256]


@pytest.mark.asyncio
async def test_a_reset_is_refused_while_a_request_runs_unless_it_preempts_it_and_a_sleep_clears(connect) -> None:
    wire = await connect(details_on())
    await cached(wire)
    task = wire.spawn("POST", "/v1/completions", json={"model": wire.engine.served_model_name, "prompt": [5, 6],
                                                       "max_tokens": 50, "ignore_eos": True,
                                                       "return_token_ids": True})
    await wire.wait(lambda: bool(wire.engine.scheduler.live()))
    await wire.engine.step(2)
    assert (await wire.post("/reset_prefix_cache")).json() == {"success": False}
    assert (await wire.post("/reset_prefix_cache", params={"reset_running_requests": "true"})).json() == \
        {"success": True}
    assert len((await wire.step_until_done([task]))[0].json()["choices"][0]["token_ids"]) == 50  # recomputed, done
    assert [await cached(wire), await cached(wire)] == [0, 256]
    await wire.post("/sleep", params={"level": "0"})
    await wire.post("/wake_up")
    assert await cached(wire) == 256
    await wire.post("/sleep", params={"level": "1"})
    await wire.post("/wake_up")
    assert await cached(wire) == 0


@pytest.mark.asyncio
async def test_an_adapter_reloaded_in_place_from_its_path_hits_the_old_adapters_kv(connect, tmp_path: Path) -> None:
    """vLLM keys an adapter's blocks by its name and path (``_gen_lora_extra_hash_keys``, 0.32.0): new files at the
    same path hit the KV the old adapter computed (stale, says the truth); another path does not."""
    wire = await connect(details_on(enable_lora=True))

    async def load(path: Path, version: int, inplace: bool = False) -> None:
        save_lora_adapter(str(path), tiny_lora(version))
        answer = await wire.post("/v1/load_lora_adapter", {"lora_name": "a", "lora_path": str(path),
                                                           "load_inplace": inplace})
        assert answer.status_code == 200, answer.text

    await load(tmp_path / "a", 1)
    assert [await cached(wire, model="a"), await cached(wire, model="a")] == [0, 256]
    assert await cached(wire) == 0  # the base model's blocks are its own
    await load(tmp_path / "a", 2, inplace=True)
    assert await cached(wire, model="a") == 256
    await load(tmp_path / "other", 3, inplace=True)
    assert await cached(wire, model="a") == 0
    stale = [e.fields["stale_tokens"] for e in wire.engine.events.of_kind("prefix.hit")]
    assert stale == [0, 256]


def test_a_block_computed_over_older_blocks_is_stale_after_any_load() -> None:
    cache = PrefixCache(block_size=4)
    cache.store([1, 2, 3, 4], None, None, [0] * 4)
    cache.store([1, 2, 3, 4, 5, 6, 7, 8], None, None, [0] * 4 + [1] * 4)  # the second block attends to the first
    hit = cache.lookup([1, 2, 3, 4, 5, 6, 7, 8, 9], None, None, 1)
    assert (hit.cached, hit.stale) == (8, 8)
    assert cache.lookup([1, 2, 3, 4, 5, 6, 7, 8, 9], None, None, 0).stale == 4
