"""Sample logprobs on the fake vLLM's two generation routes, as vLLM 0.32.0 answers them (measured on real vLLM on CPU
by ``gpu/fidelity/vllm.py``; shapes from ``entrypoints/openai/completion/serving.py`` and
``entrypoints/scale_out/token_in_token_out/serving.py``): the OpenAI completion shape, the generate route's token-id
shape, both streamed, and the refusals (status, type, param and message as vLLM's)."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest

from fakes.vllm import FakeVLLMEngine

pytestmark = pytest.mark.cpu

PROMPT = [5, 6, 7, 8]
TOKENS = 5


def _completion(engine: FakeVLLMEngine, logprobs: Any, **extra: Any) -> dict[str, Any]:
    return {"model": engine.served_model_name, "prompt": PROMPT, "max_tokens": TOKENS, "temperature": 0,
            "return_token_ids": True, "logprobs": logprobs, **extra}


def _generate(logprobs: Any, **extra: Any) -> dict[str, Any]:
    return {"token_ids": PROMPT, "sampling_params": {"max_tokens": TOKENS, "temperature": 0, "logprobs": logprobs},
            **extra}


async def _answer(wire: Any, path: str, body: dict[str, Any]) -> httpx.Response:
    task = wire.spawn("POST", path, json=body)
    return (await wire.step_until_done([task]))[0]


def _events(response: httpx.Response) -> list[Any]:
    assert response.headers["content-type"].startswith("text/event-stream")
    data = [line[len("data: "):] for line in response.text.splitlines() if line.startswith("data: ")]
    assert data[-1] == "[DONE]"
    return [json.loads(d) for d in data[:-1]]


def _check_completion_logprobs(lp: dict[str, Any], ids: list[int], k: int, start_offset: int = 0) -> None:
    assert sorted(lp) == ["text_offset", "token_logprobs", "tokens", "top_logprobs"]
    assert len(lp["tokens"]) == len(lp["token_logprobs"]) == len(lp["top_logprobs"]) == len(lp["text_offset"]) \
        == len(ids)
    offset = start_offset
    for token, value, top, at in zip(lp["tokens"], lp["token_logprobs"], lp["top_logprobs"], lp["text_offset"]):
        assert isinstance(token, str) and isinstance(value, float) and value <= 0 and at == offset
        offset += len(token)
        assert top[token] == value and len(top) == max(k, 1)  # the sampled token is rank 1: k entries (k + 1 above)
        assert all(isinstance(v, float) and v <= value for v in top.values())


def _check_generate_logprobs(lp: dict[str, Any], ids: list[int], k: int) -> None:
    assert sorted(lp) == ["content"] and [e["token_id"] for e in lp["content"]] == ids
    for entry in lp["content"]:
        assert sorted(entry) == ["logprob", "rank", "token_id", "top_logprobs"] and entry["rank"] == 1
        assert isinstance(entry["logprob"], float) and entry["logprob"] <= 0
        top = entry["top_logprobs"]
        assert len(top) == max(k, 1) and top[0] == {k_: entry[k_] for k_ in ("token_id", "logprob", "rank")}
        assert [t["rank"] for t in top] == list(range(1, len(top) + 1))
        assert [t["logprob"] for t in top] == sorted((t["logprob"] for t in top), reverse=True)


@pytest.mark.asyncio
@pytest.mark.parametrize("k", [0, 2, 20])
async def test_a_completion_answers_its_logprobs_in_the_openai_shape(connect, k: int) -> None:
    wire = await connect(FakeVLLMEngine())
    body = (await _answer(wire, "/v1/completions", _completion(wire.engine, k))).json()
    choice = body["choices"][0]
    assert len(choice["token_ids"]) == TOKENS
    _check_completion_logprobs(choice["logprobs"], choice["token_ids"], k)
    assert "".join(choice["logprobs"]["tokens"]) == choice["text"]
    assert body["system_fingerprint"].startswith("vllm-0.32.0-")  # get_system_fingerprint: on by default


@pytest.mark.asyncio
async def test_without_logprobs_a_completion_answers_null_and_logprobs_true_is_one(connect) -> None:
    wire = await connect(FakeVLLMEngine())
    plain = {k: v for k, v in _completion(wire.engine, None).items() if k != "logprobs"}
    assert (await _answer(wire, "/v1/completions", plain)).json()["choices"][0]["logprobs"] is None
    choice = (await _answer(wire, "/v1/completions", _completion(wire.engine, True))).json()["choices"][0]
    _check_completion_logprobs(choice["logprobs"], choice["token_ids"], 1)  # pydantic's lax int takes a bool


@pytest.mark.asyncio
@pytest.mark.parametrize("k", [0, 2])
async def test_generate_answers_sampling_params_logprobs_by_token_id(connect, k: int) -> None:
    wire = await connect(FakeVLLMEngine(enable_scale_out=True))
    body = (await _answer(wire, "/inference/v1/generate", _generate(k))).json()
    choice = body["choices"][0]
    _check_generate_logprobs(choice["logprobs"], choice["token_ids"], k)
    assert body["prompt_token_ids"] is None  # only with return_token_ids
    outside = {**_generate(None), "logprobs": 2}  # not a GenerateRequest field: ignored
    assert (await _answer(wire, "/inference/v1/generate", outside)).json()["choices"][0]["logprobs"] is None


@pytest.mark.asyncio
async def test_a_streamed_completion_carries_each_chunks_logprobs_with_absolute_offsets(connect) -> None:
    wire = await connect(FakeVLLMEngine())
    chunks = _events(await _answer(wire, "/v1/completions", _completion(wire.engine, 2, stream=True)))
    ids, offset = [], 0
    for i, chunk in enumerate(chunks):
        assert "usage" not in chunk and ("system_fingerprint" in chunk) == (i == len(chunks) - 1)
        choice = chunk["choices"][0]
        assert sorted(choice) == ["finish_reason", "index", "logprobs", "prompt_token_ids", "stop_reason", "text",
                                  "token_ids"]
        assert (choice["prompt_token_ids"] == PROMPT) == (i == 0) and choice["token_ids"]
        assert (choice["finish_reason"] is not None) == (i == len(chunks) - 1)
        _check_completion_logprobs(choice["logprobs"], choice["token_ids"], 2, offset)
        offset += sum(len(t) for t in choice["logprobs"]["tokens"])
        ids += choice["token_ids"]
    assert len(ids) == TOKENS


@pytest.mark.asyncio
async def test_a_streamed_generate_carries_each_chunks_logprobs(connect) -> None:
    wire = await connect(FakeVLLMEngine(enable_scale_out=True))
    response = await _answer(wire, "/inference/v1/generate", _generate(2, stream=True, return_token_ids=True))
    chunks = _events(response)
    ids = []
    for i, chunk in enumerate(chunks):
        assert sorted(chunk) == sorted(["request_id", "usage", "output_mode", "choices",
                                        *(["prompt_token_ids"] if i == 0 else [])])
        choice = chunk["choices"][0]
        assert (choice["weight_versions"] is not None) == (i == len(chunks) - 1)
        _check_generate_logprobs(choice["logprobs"], choice["token_ids"], 2)
        ids += choice["token_ids"]
    assert len(ids) == TOKENS and chunks[0]["prompt_token_ids"] == PROMPT


def _refusal(message: str) -> dict[str, Any]:
    return {"error": {"message": message, "type": "BadRequestError", "param": "logprobs", "code": 400}}


def _validation(message: str, param: str) -> dict[str, Any]:
    return {"error": {"message": message, "type": "Bad Request", "param": param, "code": 400}}


REFUSED = {  # the bodies real vLLM 0.32.0 answered (measured on CPU, tiny Llama)
    ("/v1/completions", -2): _refusal("`logprobs` must be a positive value or -1. (parameter=logprobs, value=-2)"),
    ("/v1/completions", 21): _refusal("Requested sample logprobs of 21, which is greater than max allowed: 20 "
                                      "(parameter=logprobs, value=21)"),
    ("/v1/completions", "x"): _refusal("`logprobs` must be an integer. (parameter=logprobs, value=x)"),
    ("/v1/completions", 1.5): _validation(
        "1 validation error:\n  {'type': 'int_from_float', 'loc': 'body.logprobs', 'msg': 'Input should be a valid "
        "integer, got a number with a fractional part', 'input': '1.5'}", "body.logprobs"),
    ("/inference/v1/generate", -2): _refusal("logprobs must be non-negative or -1, got -2. (parameter=logprobs, "
                                             "value=-2)"),
    ("/inference/v1/generate", 21): _refusal("Requested sample logprobs of 21, which is greater than max allowed: 20 "
                                             "(parameter=logprobs, value=21)"),
    ("/inference/v1/generate", "x"): _validation(
        "2 validation errors:\n  {'type': 'is_instance_of', 'loc': 'body.sampling_params', 'msg': 'Input should be "
        "an instance of SamplingParams', 'input': '<dict of 3 items>', 'ctx': {'class': 'SamplingParams'}}\n  "
        "{'type': 'int_parsing', 'loc': 'body.sampling_params.logprobs', 'msg': 'Input should be a valid integer, "
        "unable to parse string as an integer', 'input': 'x'}", "body.sampling_params"),
    ("/inference/v1/generate", 1.5): _validation(
        "2 validation errors:\n  {'type': 'is_instance_of', 'loc': 'body.sampling_params', 'msg': 'Input should be "
        "an instance of SamplingParams', 'input': '<dict of 3 items>', 'ctx': {'class': 'SamplingParams'}}\n  "
        "{'type': 'int_from_float', 'loc': 'body.sampling_params.logprobs', 'msg': 'Input should be a valid integer, "
        "got a number with a fractional part', 'input': '1.5'}", "body.sampling_params"),
}


@pytest.mark.asyncio
@pytest.mark.parametrize("path,value", list(REFUSED))
async def test_a_bad_logprobs_is_vllms_400_and_runs_nothing(connect, path: str, value: Any) -> None:
    wire = await connect(FakeVLLMEngine(enable_scale_out=True))
    body = _completion(wire.engine, value) if path == "/v1/completions" else _generate(value)
    answer = await wire.post(path, json=body)
    assert (answer.status_code, answer.json()) == (400, REFUSED[path, value])
    assert not wire.engine.scheduler.live()


@pytest.mark.asyncio
@pytest.mark.parametrize("path", ["/v1/completions", "/inference/v1/generate"])
async def test_minus_one_asks_for_the_vocabulary_and_is_refused_above_max_logprobs(connect, path: str) -> None:
    wire = await connect(FakeVLLMEngine(enable_scale_out=True))
    body = _completion(wire.engine, -1) if path == "/v1/completions" else _generate(-1)
    answer = await wire.post(path, json=body)
    vocab = wire.engine.vocab_size
    assert answer.status_code == 400 and answer.json() == _refusal(
        f"Requested sample logprobs of {vocab}, which is greater than max allowed: 20 "
        f"(parameter=logprobs, value={vocab})")
    roomy = await connect(FakeVLLMEngine(enable_scale_out=True, max_logprobs=-1))
    body = _completion(roomy.engine, -1) if path == "/v1/completions" else _generate(-1)
    choice = (await _answer(roomy, path, body)).json()["choices"][0]
    entries = choice["logprobs"]["top_logprobs"][0] if path == "/v1/completions" else \
        choice["logprobs"]["content"][0]["top_logprobs"]
    assert 1 < len(entries) <= vocab  # the whole vocabulary (tokens that decode alike share a completion key)


@pytest.mark.asyncio
@pytest.mark.parametrize("path", ["/v1/completions", "/inference/v1/generate"])
async def test_a_streamed_request_above_max_logprobs_gets_its_200_then_the_error_event(connect, path: str) -> None:
    """The engine's input processor refuses it once the stream has begun (measured); a negative value is refused
    before (a plain 400)."""
    wire = await connect(FakeVLLMEngine(enable_scale_out=True))
    body = _completion(wire.engine, 21, stream=True) if path == "/v1/completions" else _generate(21, stream=True)
    answer = await wire.post(path, json=body)
    assert answer.status_code == 200 and _events(answer) == [REFUSED[path, 21]]
    body = _completion(wire.engine, -2, stream=True) if path == "/v1/completions" else _generate(-2, stream=True)
    answer = await wire.post(path, json=body)
    assert (answer.status_code, answer.json()) == (400, REFUSED[path, -2])
    assert not wire.engine.scheduler.live()
