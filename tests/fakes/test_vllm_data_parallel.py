"""The fake vLLM with ``--data-parallel-size 2``, as measured on vLLM 0.32.0 on CPU (``gpu/fidelity/vllm.py``, the
data-parallel steps): the load balancer sends a prompt sent again to the other rank (each rank has its own prefix
cache), ``X-data-parallel-rank`` pins a request or is refused out of range, ``/metrics`` counts per rank, and a
reset, a clearing pause and the world size cover every rank."""

from __future__ import annotations

import pytest

from fakes.vllm import FakeVLLMEngine

pytestmark = pytest.mark.cpu

LONG = list(range(5, 305))  # two full blocks and more


async def cached(wire, prompt: list[int] = LONG, rank: str | None = None):
    """One short completion (pinned by the header when ``rank`` is given): the prompt tokens the cache served, or
    the refusal's (status, error)."""
    body = {"model": wire.engine.served_model_name, "prompt": prompt, "max_tokens": 2}
    task = wire.spawn("POST", "/v1/completions", json=body,
                      headers={} if rank is None else {"X-data-parallel-rank": rank})
    answer = (await wire.step_until_done([task]))[0]
    if answer.status_code != 200:
        return answer.status_code, answer.json()["error"]
    return answer.json()["usage"]["prompt_tokens_details"]["cached_tokens"]


def two_ranks() -> FakeVLLMEngine:
    return FakeVLLMEngine(enable_prompt_tokens_details=True, data_parallel_size=2)


def running(metrics: str) -> list[float]:
    return [float(line.rsplit(" ", 1)[1]) for line in metrics.splitlines()
            if line.startswith("vllm:num_requests_running{")]


@pytest.mark.asyncio
async def test_a_prompt_sent_again_goes_to_the_other_rank_and_each_rank_caches_its_own(connect) -> None:
    wire = await connect(two_ranks())
    assert [await cached(wire) for _ in range(4)] == [0, 0, 256, 256]  # measured: rank 0, 1, 0, 1
    other = LONG[1:]
    assert [await cached(wire, other, r) for r in ("1", "1", "0", "0")] == [0, 256, 0, 256]
    assert (await wire.get("/get_world_size")).json() == {"world_size": 2}
    assert (await wire.get("/get_world_size", params={"include_dp": "false"})).json() == {"world_size": 1}


@pytest.mark.asyncio
async def test_a_rank_out_of_range_is_refused_as_vllm_refuses_it_and_one_not_a_number_is_ignored(connect) -> None:
    wire = await connect(two_ranks())
    for rank in ("2", "-1"):
        status, error = await cached(wire, rank=rank)
        assert status == 400 and error["message"] == f"data_parallel_rank {rank} is out of range [0, 2)."
        assert error["type"] == "BadRequestError" and error["param"] is None
    assert await cached(wire, rank="x") == 0
    one = await connect(FakeVLLMEngine(enable_prompt_tokens_details=True))
    assert await cached(one, rank="0") == 0
    assert (await cached(one, rank="1"))[1]["message"] == "data_parallel_rank 1 is out of range [0, 1)."


@pytest.mark.asyncio
async def test_the_gauges_count_per_rank_and_a_reset_or_a_clearing_pause_covers_both(connect) -> None:
    wire = await connect(two_ranks())
    await cached(wire, rank="x")  # one routed request: the balancer's scan now starts at rank 1
    body = {"model": wire.engine.served_model_name, "prompt": [5, 6, 7, 8], "max_tokens": 4000, "ignore_eos": True}
    tasks = [wire.spawn("POST", "/v1/completions", json=body) for _ in range(3)]
    await wire.wait(lambda: len(wire.engine.scheduler.live()) == 3)
    await wire.engine.step()
    assert running((await wire.get("/metrics")).text) == [1.0, 2.0]  # measured: the fewest in flight, ties rotate
    assert (await wire.post("/reset_prefix_cache")).json() == {"success": False}
    assert (await wire.post("/pause", params={"mode": "keep"})).json() == {"status": "paused"}
    assert running((await wire.get("/metrics")).text) == [1.0, 2.0]  # preempted, but no step since
    await wire.post("/resume")
    await wire.post("/abort_requests", json={})
    await wire.step_until_done(tasks)
    assert [await cached(wire, LONG, r) for r in ("0", "1")] == [0, 0]


@pytest.mark.asyncio
async def test_a_reset_while_one_rank_decodes_answers_false_and_still_drops_the_idle_ranks_cache(connect) -> None:
    wire = await connect(two_ranks())
    assert [await cached(wire, LONG, r) for r in ("0", "1")] == [0, 0]
    body = {"model": wire.engine.served_model_name, "prompt": [5, 6, 7, 8], "max_tokens": 4000, "ignore_eos": True}
    task = wire.spawn("POST", "/v1/completions", json=body, headers={"X-data-parallel-rank": "1"})
    await wire.wait(lambda: len(wire.engine.scheduler.live()) == 1)
    await wire.engine.step()
    assert running((await wire.get("/metrics")).text) == [0.0, 1.0]
    assert (await wire.post("/reset_prefix_cache")).json() == {"success": False}  # all() of the ranks' answers
    await wire.post("/abort_requests", json={})
    await wire.step_until_done([task])
    assert [await cached(wire, LONG, r) for r in ("0", "1")] == [0, 256]  # rank 0 reset, rank 1 refused
