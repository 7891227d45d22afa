"""The vLLM fidelity script: one fixed sequence of calls over vLLM's weight-sync surface, each answer normalised.

The vLLM counterpart of :mod:`gpu.fidelity.script` (same normalisation, same diff): the OpenAI completion and the
token-in/token-out generate routes, the three pause modes with a request running (``abort``, the default; ``keep``;
``wait``), a request sent while paused, relabels and the version spans of a request that spans one, abort by id and
of everything, the disk reload through ``/collective_rpc``, the prefix-cache reset, the weight-transfer routes
without a transfer engine, sleep and wake, the weight checker, malformed bodies and unknown routes. vLLM's routes:
``vllm/entrypoints/rl/online/api_router.py``, ``vllm/entrypoints/serve/dev/*/api_router.py``,
``vllm/entrypoints/openai/completion``, ``vllm/entrypoints/scale_out/token_in_token_out`` (0.32.0).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import re
import sys
import time
from pathlib import Path
from typing import Any, Awaitable, Callable, Sequence

import httpx

from ..tiny_model import TinyModelConfig
from .script import CALL_TIMEOUT_S, Observation, Sent, diff, during_decode, message_class, normalise, script_client

LONG_TOKENS = 6000
"""Budget of a held request: ~10 s on real vLLM (~600 tokens/s on 2 cores), so a call sent while it decodes lands
before it ends even when this machine stalls the client for seconds (measured under load: 6 s between two polls)."""
HELD_ID = "fidelity-held"
"""The ``request_id`` of the held request the aborts by id name."""
MODEL_LEN = 8192
"""The model's positions and ``--max-model-len`` for this script (the CPU flags' 4096 is under the held budget)."""
PROMPT = [5, 6, 7, 8]
VOCAB_SIZE = TinyModelConfig().vocab_size
"""Token ids the served model can answer: ``0..VOCAB_SIZE-1``."""
LONG_PROMPT = list(range(5, 305))
"""A prompt of two full blocks and more (vLLM's CPU block: 128 tokens), for the prefix-cache steps."""
HELD_S = 1.0
"""How long a request sent while paused must go unanswered to count as held (a refusal answers at once)."""


def choice(body: Any) -> Observation:
    """What a completion or generate answer says about its first choice and its usage (not its tokens)."""
    if not isinstance(body, dict):
        return {"body": type(body).__name__}
    seen: Observation = {"keys": sorted(body), "object": body.get("object")}
    choices = body.get("choices") or []
    if choices:
        first = choices[0]
        seen["choice keys"] = sorted(first)
        seen["finish_reason"] = first.get("finish_reason")
        seen["stop_reason"] = first.get("stop_reason")
        ids = first.get("token_ids")
        seen["token_ids"] = None if ids is None else len(ids)
        spans = first.get("weight_versions")
        if spans is not None:
            seen["span versions"] = [s.get("version") for s in spans]
            seen["spans cover the output"] = (ids is not None and bool(spans) and spans[0].get("start") == 0
                                              and spans[-1].get("end") == len(ids))
    usage = body.get("usage")
    if isinstance(usage, dict):
        seen["usage keys"] = sorted(usage)
        seen["completion_tokens"] = usage.get("completion_tokens")
    if "error" in body:
        error = body["error"]
        seen["error"] = ({k: (message_class(v) if k == "message" else v) for k, v in error.items()}
                         if isinstance(error, dict) else message_class(str(error)))
    return seen


LOGPROBS_TOKENS = 4
"""Budget of the logprobs steps' requests (their answers are compared by shape, not by value)."""
_LOC_ERROR = re.compile(r"'type': '(\w+)', 'loc': '([^']*)'")


def located_errors(body: Any) -> list[str] | None:
    """A vLLM validation error's errors as ``type at loc`` (``validation.py`` joins each ``loc``), in order."""
    message = body.get("error", {}).get("message") if isinstance(body, dict) else None
    found = [f"{kind} at {loc}" for kind, loc in _LOC_ERROR.findall(message)] if isinstance(message, str) else []
    return found or None


def _all(values: Any) -> bool:
    return all(values)


def completion_logprobs(lp: Any, k: int, ids: list[int] | None = None) -> Observation:
    """What a completion's ``logprobs`` (``CompletionLogProbs``) says by shape: its keys, parallel lists one entry per
    token, floats <= 0, a ``top_logprobs`` dict per token holding the sampled token and 1 to ``k + 1`` entries (tokens
    that decode alike share one key, so a count is a range), not the values or the token strings."""
    if not isinstance(lp, dict):
        return {"logprobs": None if lp is None else type(lp).__name__}
    tokens, values, tops, offsets = (lp.get(f) or [] for f in ("tokens", "token_logprobs", "top_logprobs",
                                                                 "text_offset"))
    return {"keys": sorted(lp),
            "one entry per token": len({len(tokens), len(values), len(tops), len(offsets)}) == 1
            and (ids is None or len(tokens) == len(ids)),
            "tokens are strings": _all(isinstance(t, str) for t in tokens),
            "token_logprobs are floats <= 0": _all(isinstance(v, float) and v <= 0 for v in values),
            "text_offset counts the tokens' text": _all(b - a == len(t) for a, b, t in zip(offsets, offsets[1:], tokens)),
            "top_logprobs hold the sampled token": _all(isinstance(d, dict) and t in d for t, d in zip(tokens, tops)),
            "top_logprobs sizes within 1..k+1": _all(isinstance(d, dict) and 1 <= len(d) <= k + 1 for d in tops),
            "top_logprobs values are floats <= 0": _all(isinstance(v, float) and v <= 0 for d in tops
                                                         if isinstance(d, dict) for v in d.values())}


def generate_logprobs(lp: Any, k: int, ids: list[int] | None) -> Observation:
    """What a generate choice's ``logprobs`` (``GenerateLogProbs``) says by shape: one entry per output token naming
    it, rank and top candidates (the sampled token first, at most ``max(k, 1)``, ranks ascending), floats <= 0."""
    if not isinstance(lp, dict):
        return {"logprobs": None if lp is None else type(lp).__name__}
    content = lp.get("content") or []
    entries = [e for e in content if isinstance(e, dict)]
    tops = [e.get("top_logprobs") or [] for e in entries]
    return {"keys": sorted(lp),
            "entry keys": sorted({json.dumps(sorted(e)) for e in entries}),
            "top entry keys": sorted({json.dumps(sorted(t)) for top in tops for t in top if isinstance(t, dict)}),
            "one entry per token": ids is not None and [e.get("token_id") for e in entries] == ids,
            "logprobs are floats <= 0": _all(isinstance(e.get("logprob"), float) and e["logprob"] <= 0
                                             for e in [*entries, *(t for top in tops for t in top)]),
            "ranks are ints": _all(isinstance(e.get("rank"), int) for e in [*entries, *(t for top in tops for t in top)]),
            "top starts with the sampled token": _all(top and top[0].get("token_id") == e.get("token_id")
                                                      for e, top in zip(entries, tops)),
            "top sizes within 1..max(k,1)": _all(1 <= len(top) <= max(k, 1) for top in tops),
            "top ranks ascend": _all([t.get("rank") for t in top] == sorted(t.get("rank") for t in top)
                                     for top in tops)}


def sse_events(response: httpx.Response) -> list[Any]:
    """The events of a server-sent-events answer (``[DONE]`` kept as a string)."""
    events: list[Any] = []
    for line in response.text.splitlines():
        if line.startswith("data: "):
            data = line[len("data: "):]
            events.append(data if data == "[DONE]" else json.loads(data))
    return events


def stream_observation(response: httpx.Response, k: int, completion: bool) -> Observation:
    """A streamed logprobs answer by shape, whatever its chunking (the fake decodes faster and sends fewer chunks):
    the chunks' keys, the prompt ids and finish reason where they ride, every chunk's logprobs covering its tokens
    (``text_offset`` running on across chunks), the tokens in all; an error event as its body."""
    seen: Observation = {"status": response.status_code,
                         "content-type": response.headers.get("content-type", "").split(";")[0]}
    if seen["content-type"] != "text/event-stream":
        seen.update(choice(response.json()))
        return seen
    events = sse_events(response)
    seen["ends with [DONE]"] = bool(events) and events[-1] == "[DONE]"
    chunks = [e for e in events if isinstance(e, dict)]
    errors = [e for e in chunks if "error" in e]
    if errors:
        seen["error events"] = [choice(e) for e in errors]
        return seen
    choices = [c["choices"][0] for c in chunks if c.get("choices")]
    last = len(choices) - 1
    riders = {"system_fingerprint", "prompt_token_ids"}  # on the last chunk, on the first: one chunk may be both
    seen["chunk keys"] = sorted({json.dumps(sorted(set(c) - riders)) for c in chunks})
    seen["last chunk keys"] = sorted(set(chunks[-1]) - {"prompt_token_ids"}) if chunks else None
    seen["choice keys"] = sorted({json.dumps(sorted(c)) for c in choices})
    seen["finish_reason on the last chunk only"] = [c.get("finish_reason") is not None for c in choices] == \
        [i == last for i in range(len(choices))]
    seen["tokens in all"] = sum(len(c.get("token_ids") or []) for c in choices)
    if completion:
        seen["prompt ids on the first chunk only"] = [c.get("prompt_token_ids") is not None for c in choices] == \
            [i == 0 for i in range(len(choices))]
        shapes = [completion_logprobs(c.get("logprobs"), k, c.get("token_ids")) for c in choices]
        offsets = [(c.get("logprobs") or {}).get("text_offset") or [] for c in choices]
        tokens = [(c.get("logprobs") or {}).get("tokens") or [] for c in choices]
        flat_offsets = [o for chunk in offsets for o in chunk]
        flat_tokens = [t for chunk in tokens for t in chunk]
        seen["text_offset runs on across chunks"] = bool(flat_offsets) and flat_offsets[0] == 0 and _all(
            b - a == len(t) for a, b, t in zip(flat_offsets, flat_offsets[1:], flat_tokens))
    else:
        seen["prompt ids on the first chunk only"] = [c.get("prompt_token_ids") is not None for c in chunks] == \
            [i == 0 for i in range(len(chunks))]
        seen["weight_versions on the last chunk only"] = [c.get("weight_versions") is not None for c in choices] == \
            [i == last for i in range(len(choices))]
        shapes = [generate_logprobs(c.get("logprobs"), k, c.get("token_ids")) for c in choices]
    merged: Observation = {}
    for shape in shapes:
        for key, value in shape.items():
            merged[key] = (merged[key] and value) if isinstance(value, bool) and key in merged else \
                merged.get(key, value)
    seen["chunk logprobs"] = merged
    return seen


async def logprobs_steps(call: Call, model: str, out: dict[str, Observation]) -> None:
    """Sample logprobs on both generation routes, as RL trainers read them for importance ratios: answered, streamed,
    and refused (negative, above ``--max-logprobs``, -1 for the whole vocabulary, not a number, fractional; above the
    limit a stream has its 200 and gets the error as its event): ``entrypoints/openai/completion``,
    ``entrypoints/scale_out/token_in_token_out``, ``sampling_params.py`` (0.32.0)."""

    def completion(logprobs: Any, **extra: Any) -> dict[str, Any]:
        return {"model": model, "prompt": PROMPT, "max_tokens": LOGPROBS_TOKENS, "temperature": 0,
                "return_token_ids": True, "logprobs": logprobs, **extra}

    def generate(logprobs: Any, **extra: Any) -> dict[str, Any]:
        return {"token_ids": PROMPT, "sampling_params": {"max_tokens": LOGPROBS_TOKENS, "temperature": 0,
                                                         "logprobs": logprobs}, **extra}

    for k in (0, 2):
        step = f"completion logprobs {k}"
        body = (await call(step, "/v1/completions", completion(k))).json()
        first = (body.get("choices") or [{}])[0]
        out[step + " answer"] = {**choice(body), **completion_logprobs(first.get("logprobs"), k, first.get("token_ids")),
                                 "system_fingerprint": type(body.get("system_fingerprint")).__name__}
        step = f"generate logprobs {k}"
        body = (await call(step, "/inference/v1/generate", generate(k))).json()
        first = (body.get("choices") or [{}])[0]
        out[step + " answer"] = {**choice(body), **generate_logprobs(first.get("logprobs"), k, first.get("token_ids"))}
    body = (await call("completion without logprobs", "/v1/completions",
                       {k: v for k, v in completion(None).items() if k != "logprobs"})).json()
    out["completion without logprobs answer"] = {
        "logprobs": ((body.get("choices") or [{}])[0]).get("logprobs", "<absent>"),
        "system_fingerprint": type(body.get("system_fingerprint")).__name__}
    body = (await call("generate with logprobs outside sampling_params", "/inference/v1/generate",
                       {**generate(None), "logprobs": 2})).json()
    out["generate with logprobs outside sampling_params answer"] = {
        "logprobs": ((body.get("choices") or [{}])[0]).get("logprobs", "<absent>")}
    for step, path, body in (("completion logprobs streamed", "/v1/completions", completion(2, stream=True)),
                             ("generate logprobs streamed", "/inference/v1/generate",
                              generate(2, stream=True, return_token_ids=True)),
                             ("completion logprobs 21 streamed", "/v1/completions", completion(21, stream=True)),
                             ("generate logprobs 21 streamed", "/inference/v1/generate", generate(21, stream=True)),
                             ("completion logprobs -2 streamed", "/v1/completions", completion(-2, stream=True))):
        response = await call(step, path, body)
        out[step] = stream_observation(response, 2, path == "/v1/completions")  # not the stream's text
    for value in (-2, -1, 21, "x", 1.5):
        for step, path, body in ((f"completion logprobs {value}", "/v1/completions", completion(value)),
                                 (f"generate logprobs {value}", "/inference/v1/generate", generate(value))):
            response = await call(step, path, body)
            out[step + " answer"] = {**choice(response.json()), "errors": located_errors(response.json())}


class Held:
    """A ``/inference/v1/generate`` kept running in the background, not streamed (a stream's per-token events load the
    API server, which then answers control calls seconds late); its answer carries the version spans. Whether the
    engine decodes it is read on its ``/metrics`` (:func:`decoding`)."""

    def __init__(self, client: httpx.AsyncClient, url: str, budget: int = LONG_TOKENS,
                 request_id: str | None = None, rank: str | None = None) -> None:
        self.budget, self.request_id = budget, request_id
        self.headers = {} if rank is None else {"X-data-parallel-rank": rank}
        """``rank``: the data-parallel rank it is pinned to."""
        self.answer: httpx.Response | None = None
        self.task = asyncio.ensure_future(self._run(client, url))

    async def _run(self, client: httpx.AsyncClient, url: str) -> None:
        body: dict[str, Any] = {"token_ids": PROMPT, "sampling_params": {"max_tokens": self.budget, "temperature": 0,
                                                                         "ignore_eos": True}}
        if self.request_id is not None:
            body["request_id"] = self.request_id
        try:
            self.answer = await client.post(url + "/inference/v1/generate", json=body, headers=self.headers)
        except httpx.HTTPError:
            pass  # the server went away mid-answer: result() shows it unfinished

    async def result(self) -> Observation:
        await asyncio.wait_for(self.task, CALL_TIMEOUT_S)
        if self.answer is None:
            return {"finished": False}
        seen = choice(self.answer.json())
        tokens = seen.pop("token_ids", None)
        return {"finished": True, "status": self.answer.status_code, "full budget": tokens == self.budget,
                **{k: seen.get(k) for k in ("finish_reason", "span versions", "spans cover the output")}}


async def until_running(client: httpx.AsyncClient, url: str, within_s: float = 10.0, running: bool = True) -> bool:
    """Wait (at most ``within_s``) until the engine has a request running (``running=False``: none); whether it came to
    that."""
    deadline = asyncio.get_running_loop().time() + within_s
    while await engine_running(client, url) != running:
        if asyncio.get_running_loop().time() >= deadline:
            return False
        await asyncio.sleep(0.01)  # polling the engine's own gauge, bounded by the deadline
    return True


async def engine_running(client: httpx.AsyncClient, url: str) -> bool:
    """Whether the engine itself has a request running (``vllm:num_requests_running`` on ``/metrics``): the client's
    stream lags behind the engine's decode, so a request the client still reads may be finished there. (Its gauges
    move only as it steps: a request queued while paused does not show in ``vllm:num_requests_waiting``.)"""
    for line in (await client.get(url + "/metrics")).text.splitlines():
        if line.split("{", 1)[0].split(" ", 1)[0] == "vllm:num_requests_running":
            return float(line.rsplit(" ", 1)[1]) > 0
    return False


async def generated_tokens(client: httpx.AsyncClient, url: str) -> float:
    """Tokens the engine decoded since it started, every rank (``vllm:generation_tokens_total`` on ``/metrics``): a
    counter moves only as tokens are decoded, where the running gauge of an idle engine still shows a request an
    abort took (the gauges move only as the engine steps)."""
    return sum(float(line.rsplit(" ", 1)[1]) for line in (await client.get(url + "/metrics")).text.splitlines()
               if line.split("{", 1)[0] == "vllm:generation_tokens_total")


async def decoding(client: httpx.AsyncClient, url: str, tries: int = 3, request_id: str | None = None,
                   within_s: float = 10.0) -> tuple[Held, bool]:
    """A held request the engine is seen decoding (its generated-tokens counter moves past where it stood before the
    request was sent, the script's only request then), started again (at most ``tries`` times) when it was not: the
    situation a pause or abort step compares is made to happen, and whether it did is recorded."""
    loop = asyncio.get_running_loop()
    for _ in range(tries):
        before = await generated_tokens(client, url)
        held, deadline = Held(client, url, request_id=request_id), loop.time() + within_s
        while not held.task.done() and await generated_tokens(client, url) <= before and loop.time() < deadline:
            await asyncio.sleep(0.01)  # polling the engine's own counter, bounded by the deadline
        if not held.task.done() and await generated_tokens(client, url) > before:
            return held, True
        await held.result()
    return held, False


async def checksums(client: httpx.AsyncClient, url: str) -> Any:
    """The engine's per-parameter checksums (``/weight_checker``), or the status it answered instead."""
    answer = await client.post(url + "/weight_checker", json={"action": "checksum"})
    return answer.json().get("checksums") if answer.status_code == 200 else answer.status_code


Call = Callable[..., Awaitable[httpx.Response]]


def recording(client: httpx.AsyncClient, url: str, out: dict[str, Observation]) -> Call:
    """``call(step, path, body=None, method="POST", **query)``: send, and record the normalised answer as ``step``."""
    async def call(step: str, path: str, body: Any = None, method: str = "POST", headers: dict[str, str] | None = None,
                   **params: Any) -> httpx.Response:
        kwargs: dict[str, Any] = {"params": params} if params else {}
        if body is not None:
            kwargs["json"] = body
        response = await client.request(method, url + path, headers=headers, **kwargs)
        out[step] = normalise(response)
        return response
    return call


async def run_vllm_script(url: str, model: str, sent: list[Sent] | None = None) -> dict[str, Observation]:
    """Drive the engine at ``url`` (serving ``model``) through the script; ``{step: observation}``."""
    out: dict[str, Observation] = {}
    async with script_client(sent) as client:
        call = recording(client, url, out)

        async def get(step: str, path: str) -> httpx.Response:
            return await call(step, path, method="GET")

        def completion(max_tokens: int = 8, **extra: Any) -> dict[str, Any]:
            return {"model": model, "prompt": PROMPT, "max_tokens": max_tokens, "temperature": 0,
                    "return_token_ids": True, **extra}

        # -- what the engine reports at start --
        for step, path in (("health", "/health"), ("version", "/version"), ("weight_info", "/weight_info"),
                           ("is_paused", "/is_paused"), ("is_sleeping", "/is_sleeping"),
                           ("get_world_size", "/get_world_size")):
            response = await get(step, path)
            out[step]["text" if response.headers.get("content-type", "").startswith("text") else "body"] = \
                response.text if response.status_code == 200 and len(response.text) < 80 else None
        models = (await get("v1/models", "/v1/models")).json()
        out["v1/models"]["ids are the served model"] = [m.get("id") for m in models.get("data", [])] == [model]
        out["v1/models"]["model keys"] = sorted(models["data"][0]) if models.get("data") else None

        # -- generation --
        response = await call("completion", "/v1/completions", completion())
        out["completion answer"] = choice(response.json())
        out["completion"]["content-type"] = response.headers.get("content-type", "").split(";")[0]
        response = await call("completion without return_token_ids", "/v1/completions",
                              {k: v for k, v in completion().items() if k != "return_token_ids"})
        out["completion without return_token_ids answer"] = choice(response.json())
        response = await call("generate", "/inference/v1/generate",
                              {"token_ids": PROMPT, "sampling_params": {"max_tokens": 8, "temperature": 0}})
        out["generate answer"] = choice(response.json())
        every_token = list(range(VOCAB_SIZE))  # whatever the first token is, it is a stop token
        response = await call("completion ignoring eos with stop_token_ids", "/v1/completions",
                              completion(ignore_eos=True, stop_token_ids=every_token))
        seen = choice(response.json())
        seen["stop_reason"] = seen.get("stop_reason") in every_token  # the token, which differs from the fake's
        out["completion ignoring eos with stop_token_ids answer"] = seen
        response = await call("completion unknown model", "/v1/completions", {**completion(), "model": "nope"})
        out["completion unknown model answer"] = choice(response.json())
        response = await call("completion without prompt", "/v1/completions", {"model": model, "max_tokens": 4})
        out["completion without prompt answer"] = choice(response.json())
        await logprobs_steps(call, model, out)
        await prefix_cache_steps(call, client, url, model, out)  # before the sleeps: after them, real vLLM's /metrics
        # no longer showed a request decoding (measured: the reset steps' requests were never seen running)

        # -- pause: abort (the default), keep, wait --
        async def pause_default(held: Held) -> bool:
            await call("pause (no mode)", "/pause")
            return not (await held.result()).get("full budget")

        out["request under the default pause"], running = await during_decode(
            lambda: decoding(client, url), pause_default, lambda: client.post(url + "/resume"))
        out["pause (no mode)"]["running_at_pause"] = running
        await get("is_paused while paused", "/is_paused")
        out["is_paused while paused"]["body"] = (await client.get(url + "/is_paused")).json()
        waiting = asyncio.ensure_future(client.post(url + "/v1/completions", json=completion()))
        try:  # held, not refused: no answer within HELD_S while paused (the engine's gauges do not move then)
            await asyncio.wait_for(asyncio.shield(waiting), HELD_S)
        except asyncio.TimeoutError:
            pass
        out["completion sent while paused"] = {"answered while paused": waiting.done()}
        await call("resume", "/resume")
        answer = await asyncio.wait_for(waiting, CALL_TIMEOUT_S)
        out["completion sent while paused"].update({"status": answer.status_code, **choice(answer.json())})

        for _ in range(3):  # until the pause catches the request mid-decode (the engine runs ahead of its client)
            held, running = await decoding(client, url)
            await call("pause keep", "/pause", mode="keep")
            running = running and await engine_running(client, url)  # still in the batch, frozen
            if running:
                break
            await client.post(url + "/resume")
            await held.result()
        out["pause keep"]["running_at_pause"] = running
        await call("relabel v1 while kept", "/update_weight_version", {"new_version": "v1"})
        await call("resume after keep", "/resume")
        out["request held across pause keep"] = await held.result()

        async def pause_wait(held: Held) -> bool:
            decoding_when_sent = await engine_running(client, url)  # wait lets it finish: read before, not after
            await call("pause wait", "/pause", mode="wait")
            out["pause wait"]["engine idle when it answered"] = not await engine_running(client, url)
            return decoding_when_sent

        out["request under pause wait"], running = await during_decode(
            lambda: decoding(client, url), pause_wait, lambda: client.post(url + "/resume"))
        out["pause wait"]["running_at_pause"] = running
        await call("resume after wait", "/resume")
        await call("pause bad mode", "/pause", mode="nope")
        await call("resume twice", "/resume")
        await call("resume not paused", "/resume")

        # -- versions --
        await call("update_weight_version v2", "/update_weight_version", {"new_version": "v2"})
        out["weight_info after v2"] = (await client.get(url + "/weight_info")).json()
        await call("update_weight_version without new_version", "/update_weight_version", {})
        await call("update_weight_version number", "/update_weight_version", {"new_version": 3})
        async def relabel(held: Held) -> bool:
            await call("update_weight_version v3 while decoding", "/update_weight_version", {"new_version": "v3"})
            return await engine_running(client, url)  # the request decodes on, past the relabel

        out["request across a relabel"], running = await during_decode(
            lambda: decoding(client, url), relabel,
            lambda: client.post(url + "/update_weight_version", json={"new_version": "v2"}))
        out["update_weight_version v3 while decoding"]["running_at_pause"] = running
        response = await call("generate after v3", "/inference/v1/generate",
                              {"token_ids": PROMPT, "sampling_params": {"max_tokens": 8, "temperature": 0}})
        out["generate after v3 answer"] = choice(response.json())

        # -- aborts --
        async def abort_all(held: Held) -> bool:
            response = await call("abort_requests all", "/abort_requests", {})
            out["abort_requests all"]["aborted"] = response.json().get("aborted") if response.status_code == 200 \
                else None
            return not (await held.result()).get("full budget")  # not run to its end before the abort came

        out["request under abort_requests all"], running = await during_decode(
            lambda: decoding(client, url), abort_all)
        out["abort_requests all"]["running_at_pause"] = running

        async def abort_by_id(held: Held) -> bool:  # vLLM knows it as its route's prefix + the body's request_id
            await call("abort_requests by the body's request_id", "/abort_requests", {"request_ids": [HELD_ID]})
            # the gauge is read for up to 2 s: a single read right after the abort once showed no request running on
            # real vLLM (the next run, and every earlier one, showed it running, as AsyncLLM.abort's external ids say)
            out["abort_requests by the body's request_id"]["still decoding"] = await until_running(client, url, 2.0)
            await call("abort_requests by the id vLLM knows", "/abort_requests",
                       {"request_ids": [f"generate-tokens-{HELD_ID}"]})  # token_in_token_out/serving.py
            return not (await held.result()).get("full budget")

        out["request under abort_requests by id"], running = await during_decode(
            lambda: decoding(client, url, request_id=HELD_ID), abort_by_id)
        out["abort_requests by the id vLLM knows"]["running_at_pause"] = running
        response = await call("abort_requests unknown id", "/abort_requests", {"request_ids": ["nope"]})
        out["abort_requests unknown id"]["aborted"] = response.json().get("aborted") if response.status_code == 200 \
            else None
        await call("abort_requests not json", "/abort_requests", method="POST")

        # -- a client that leaves: both generation routes are wrapped in with_cancellation --
        held, running = await decoding(client, url)
        held.task.cancel()
        await asyncio.gather(held.task, return_exceptions=True)
        out["request whose client left"] = {"running_at_call": running,
                                            "stopped within 2 s": await until_running(client, url, 2.0, running=False)}

        # -- disk reload, caches --
        response = await call("collective_rpc reload_weights", "/collective_rpc", {"method": "reload_weights"})
        out["collective_rpc reload_weights"]["body"] = response.json() if response.status_code == 200 else None
        await call("collective_rpc without method", "/collective_rpc", {})
        response = await call("reset_prefix_cache", "/reset_prefix_cache")
        out["reset_prefix_cache"]["body"] = response.json() if response.status_code == 200 else None

        async def reset_cache(held: Held) -> bool:
            response = await call("reset_prefix_cache while decoding", "/reset_prefix_cache")
            out["reset_prefix_cache while decoding"]["body"] = response.json() if response.status_code == 200 else None
            return await engine_running(client, url)  # the request decodes on, past the reset

        out["request under reset_prefix_cache"], running = await during_decode(
            lambda: decoding(client, url), reset_cache)
        out["reset_prefix_cache while decoding"]["running_at_pause"] = running
        await get("weight_info after reload", "/weight_info")
        out["weight_info after reload"]["body"] = (await client.get(url + "/weight_info")).json()

        # -- weight transfer without a transfer engine --
        for step, path, body in (("start_weight_update", "/start_weight_update", None),
                                 ("start_draft_weight_update", "/start_draft_weight_update", None),
                                 ("update_weights", "/update_weights", {"update_info": {}}),
                                 ("finish_weight_update v9", "/finish_weight_update", {"weight_version": "v9"}),
                                 ("init_weight_transfer_engine", "/init_weight_transfer_engine", {"init_info": {}}),
                                 ("shutdown_weight_transfer_engine", "/shutdown_weight_transfer_engine", None)):
            await call(step, path, body)
        out["weight_info after a failed finish"] = (await client.get(url + "/weight_info")).json()

        # -- the weight checker --
        response = await call("weight_checker checksum", "/weight_checker", {"action": "checksum"})
        body = response.json() if response.status_code == 200 else {}
        out["weight_checker checksum"]["checksums"] = len(body.get("checksums") or {})
        await call("weight_checker compare without baseline", "/weight_checker", {"action": "compare"})
        await call("weight_checker bad action", "/weight_checker", {"action": "nope"})

        # -- sleep and wake; a relabel and a reload while asleep; the weights across each level --
        before = await checksums(client, url)
        await call("sleep", "/sleep", level=1)
        out["is_sleeping while asleep"] = (await client.get(url + "/is_sleeping")).json()
        await call("update_weight_version while asleep", "/update_weight_version", {"new_version": "v-asleep"})
        out["weight_info while asleep"] = (await client.get(url + "/weight_info")).json()
        await call("collective_rpc reload_weights while asleep", "/collective_rpc", {"method": "reload_weights"})
        await call("wake_up", "/wake_up")
        out["is_sleeping after wake_up"] = (await client.get(url + "/is_sleeping")).json()
        out["weights after a level 1 sleep"] = {"as before": await checksums(client, url) == before}
        await call("sleep level 2", "/sleep", level=2)
        await call("wake_up after level 2", "/wake_up")
        out["weights after a level 2 sleep"] = {"as before": await checksums(client, url) == before}
        await call("collective_rpc reload_weights after level 2", "/collective_rpc", {"method": "reload_weights"})
        out["weights after a level 2 sleep and a reload"] = {"as before": await checksums(client, url) == before}
        response = await call("completion after wake_up", "/v1/completions", completion())
        out["completion after wake_up answer"] = choice(response.json())
        # a partial wake (the weights first, to load new ones) and a pause alone, as /is_sleeping and /is_paused see them
        await call("sleep keep", "/sleep", level=1, mode="keep")
        await call("wake_up weights", "/wake_up", tags="weights")
        out["is_paused after waking the weights"] = (await client.get(url + "/is_paused")).json()
        await call("wake_up weights again", "/wake_up", tags="weights")
        await call("wake_up kv_cache and scheduling", "/wake_up", tags=["kv_cache", "scheduling"])
        out["is_paused after waking the rest"] = (await client.get(url + "/is_paused")).json()
        await call("pause keep before is_sleeping", "/pause", mode="keep")
        out["is_sleeping while paused"] = (await client.get(url + "/is_sleeping")).json()
        await call("wake_up after a pause", "/wake_up")
        out["is_paused after that wake_up"] = (await client.get(url + "/is_paused")).json()

        # -- routes a release may lack --
        await call("unknown route", "/update_weights_from_disk", {"model_path": "/nope"})
        await call("load_lora_adapter without LoRA", "/v1/load_lora_adapter", {"lora_name": "a", "lora_path": "/x"})
        # last: real vLLM answers 500 and its API server may then shut down (measured on 0.32.0 CPU, not every run)
        await call("collective_rpc unknown method", "/collective_rpc", {"method": "nope"})
    return out


async def cached_tokens(call: Call, out: dict[str, Observation], step: str, model: str, route: str = "/v1/completions",
                        prompt: list[int] = LONG_PROMPT, rank: str | None = None, **extra: Any) -> None:
    """One short request of ``prompt`` (``rank``: its ``X-data-parallel-rank`` header), observed with the prompt tokens
    the prefix cache served (``usage.prompt_tokens_details.cached_tokens``, with ``--enable-prompt-tokens-details``)."""
    body: dict[str, Any] = ({"model": model, "prompt": prompt, "max_tokens": 2, "temperature": 0, **extra}
                            if route == "/v1/completions" else
                            {"token_ids": prompt, "sampling_params": {"max_tokens": 2, "temperature": 0}, **extra})
    response = await call(step, route, body, headers=None if rank is None else {"X-data-parallel-rank": rank})
    usage = response.json().get("usage") if response.status_code == 200 else None
    out[step]["cached_tokens"] = ((usage or {}).get("prompt_tokens_details") or {}).get("cached_tokens")


async def prefix_cache_steps(call: Call, client: httpx.AsyncClient, url: str, model: str,
                             out: dict[str, Observation]) -> None:
    """The prefix cache across what weight sync does (``fakes/vllm/prefix_cache.py``): hits in full blocks, the
    salt, a relabel and a reload (kept), the pauses with and without ``clear_cache`` (a pause clears it by default,
    in every mode, preempting what runs), the reset refused while a request runs on its blocks and forced with
    ``reset_running_requests``, a sleep."""
    async def hits(step: str, **extra: Any) -> None:
        await cached_tokens(call, out, "prefix: " + step, model, **extra)

    await hits("first")
    await hits("again")
    await hits("its first 200 tokens", prompt=LONG_PROMPT[:200])
    await hits("token-in/token-out route", route="/inference/v1/generate")
    await hits("salted", cache_salt="s1")
    await hits("salted again", cache_salt="s1")
    await hits("an empty salt", cache_salt="")
    await hits("a salt with a slash", cache_salt="a/b")
    await hits("token-in/token-out with an empty salt", route="/inference/v1/generate", cache_salt="")
    await hits("pinned to rank 0 (one rank)", rank="0")
    await hits("pinned to rank 1 (one rank)", rank="1")
    await hits("token-in/token-out pinned to rank 1 (one rank)", route="/inference/v1/generate", rank="1")
    await client.post(url + "/update_weight_version", json={"new_version": "v-prefix"})
    await hits("after a relabel")
    await client.post(url + "/collective_rpc", json={"method": "reload_weights"})
    await hits("after a reload")
    for step, query in (("pause keep without clear_cache", {"mode": "keep", "clear_cache": "false"}),
                        ("pause abort without clear_cache", {"mode": "abort", "clear_cache": "false"}),
                        ("pause keep", {"mode": "keep"}), ("pause wait", {"mode": "wait"})):
        await call("prefix: " + step, "/pause", **query)
        await client.post(url + "/resume")
        await hits("after " + step)
        await hits("again after " + step)

    async def reset_under(step: str, pause: dict[str, str] | None, **query: str) -> None:
        async def act(held: Held) -> bool:
            if pause is not None:
                await client.post(url + "/pause", params=pause)
            await call("prefix: reset " + step, "/reset_prefix_cache", **query)
            decoding_then = await engine_running(client, url)  # its gauges move only as the engine steps
            if pause is not None:
                await client.post(url + "/resume")
            return decoding_then

        out["prefix: request under the reset " + step], landed = await during_decode(
            lambda: decoding(client, url), act)
        out["prefix: reset " + step]["request decoding"] = landed

    await reset_under("while paused keep without clear_cache", {"mode": "keep", "clear_cache": "false"})
    await reset_under("while paused keep", {"mode": "keep"})
    await reset_under("while decoding", None)
    await reset_under("while decoding, reset_running_requests", None, reset_running_requests="true")
    await hits("after the forced reset")
    await call("prefix: sleep", "/sleep", level=1)
    await client.post(url + "/wake_up")
    await hits("after a sleep")


DP_FLAGS = ("--data-parallel-size", "2")
"""The data-parallel server: two engine cores behind one API server."""
DP_ENV = {"VLLM_CPU_OMP_THREADS_BIND": "0|0"}
"""Both ranks' workers on core 0, one bind list per rank (with the one-rank ``0``, rank 1 asserts at start-up that its
list is empty; with ``0|1`` both cores decode and the API server answered ``/metrics`` 19 s late, after the requests
it was to observe had ended)."""


RUNNING, GENERATED = "vllm:num_requests_running", "vllm:generation_tokens_total"
"""The per-rank metrics the data-parallel steps read: a gauge (it moves only as its rank steps) and a counter."""


async def per_rank(client: httpx.AsyncClient, url: str, metric: str, until: Callable[[list[float]], bool],
                   within_s: float = 10.0) -> list[float]:
    """Per rank (``engine`` label), ``metric`` on ``/metrics``, polled until ``until`` holds of it (at most
    ``within_s``)."""
    deadline = asyncio.get_running_loop().time() + within_s
    while True:
        values: dict[str, float] = {}
        for line in (await client.get(url + "/metrics")).text.splitlines():
            if line.startswith(metric + "{"):
                values[line.split('engine="', 1)[1].split('"', 1)[0]] = float(line.rsplit(" ", 1)[1])
        ranks = [values[k] for k in sorted(values)]
        if until(ranks) or asyncio.get_running_loop().time() >= deadline:
            return ranks
        await asyncio.sleep(0.01)  # polling the engine's own metrics, bounded by the deadline


async def run_vllm_dp_script(url: str, model: str, sent: list[Sent] | None = None) -> dict[str, Observation]:
    """Two data-parallel ranks behind one server: the world size, where the load balancer sends a prompt sent again
    (each rank has its own prefix cache), a rank named by ``X-data-parallel-rank`` (in range, out of it, not a
    number), the per-rank gauges with three requests decoding, a reset and a clearing pause over both ranks, and a
    second resume (verl#7846: both ranks serve after it)."""
    out: dict[str, Observation] = {}
    async with script_client(sent) as client:
        call = recording(client, url, out)

        async def hits(step: str, prompt: list[int] = LONG_PROMPT, **extra: Any) -> None:
            await cached_tokens(call, out, "dp: " + step, model, prompt=prompt, **extra)

        for step, query in (("world size", {}), ("world size without dp", {"include_dp": "false"})):
            response = await call("dp: " + step, "/get_world_size", method="GET", **query)
            out["dp: " + step]["world_size"] = response.json().get("world_size")
        for i in range(4):
            await hits(f"a prompt sent again, {i + 1}")
        other = LONG_PROMPT[1:]
        for step, rank in (("on rank 1", "1"), ("again on rank 1", "1"), ("on rank 0", "0"), ("again on rank 0", "0")):
            await hits("pinned " + step, prompt=other, rank=rank)
        for step, rank in (("rank 2", "2"), ("rank -1", "-1"), ("a rank not a number", "x")):
            await hits(step, prompt=LONG_PROMPT[2:], rank=rank)
        await hits("token-in/token-out rank 2", prompt=LONG_PROMPT[2:], route="/inference/v1/generate", rank="2")
        held = [Held(client, url) for _ in range(3)]
        out["dp: three requests decoding"] = {"running per rank": await per_rank(client, url, RUNNING, lambda g: sum(g) >= 3)}
        await call("dp: reset while both ranks decode", "/reset_prefix_cache")
        await call("dp: pause keep", "/pause", mode="keep")
        await call("dp: resume", "/resume")
        await call("dp: resume again (verl#7846)", "/resume")
        paused = await call("dp: paused after two resumes", "/is_paused", method="GET")
        out["dp: paused after two resumes"]["is_paused"] = paused.json().get("is_paused")
        for h in held:  # ended by their budget, so the gauges are true again (an abort leaves an idle engine's stale)
            await h.result()
        await hits("after the pause, rank 0", prompt=other, rank="0")
        await hits("after the pause, rank 1", prompt=other, rank="1")
        idle = await per_rank(client, url, RUNNING, lambda g: g == [0.0, 0.0])
        before = await per_rank(client, url, GENERATED, lambda g: True)
        one = Held(client, url, rank="1")
        after = await per_rank(client, url, GENERATED, lambda g: g[1] > before[1])  # rank 1 decodes it
        await call("dp: reset while rank 1 decodes", "/reset_prefix_cache")
        out["dp: reset while rank 1 decodes"].update({
            "running per rank before": idle, "rank 0 decoded meanwhile": after[0] > before[0],
            "running_at_call": after[1] > before[1] and not one.task.done()})
        await one.result()
        await hits("rank 0 after the reset rank 1 refused", prompt=other, rank="0")
        await hits("rank 1 after the reset it refused", prompt=other, rank="1")
    return out


async def run_vllm_lora_script(url: str, model: str, work: Path,
                               sent: list[Sent] | None = None) -> dict[str, Observation]:
    """Runtime LoRA on an engine started with :data:`LORA_FLAGS`: an adapter loaded from disk, loaded again under its
    name (and in place), listed, used by a completion, refused above ``--max-lora-rank`` and from a missing path,
    unloaded (twice), and named after its unload (``entrypoints/openai/models/serving.py``, 0.32.0); then the
    token-in/token-out route naming an adapter, and the disk reload from a path the trainer wrote
    (``collective_rpc`` kwargs ``weights_path``), from a missing one, and plain after each."""
    from conformance.reference.transports import write_checkpoint_atomic
    from conformance.scenarios.trainer import Trainer
    from gpu.weights import read_weights

    trainer = Trainer(read_weights(Path(model)), seed=0)

    def adapter_dir(name: str, rank: int = 2) -> str:
        adapter = trainer.lora(1, rank=rank)
        return str(write_checkpoint_atomic(work, name, adapter.tensors, adapter.config,
                                           weights_file="adapter_model.safetensors", config_file="adapter_config.json"))

    out: dict[str, Observation] = {}
    async with script_client(sent) as client:
        call = recording(client, url, out)

        async def complete(step: str, name: str) -> None:
            response = await call(step, "/v1/completions", {"model": name, "prompt": PROMPT, "max_tokens": 4,
                                                            "temperature": 0, "return_token_ids": True})
            out[step + " answer"] = choice(response.json())

        async def listed(step: str) -> None:
            models = (await client.get(url + "/v1/models")).json().get("data", [])
            out[step] = {"ids": sorted("<base>" if m.get("id") == model else m.get("id") for m in models),
                         "adapter parents are the base": all(m.get("parent") == model for m in models
                                                             if m.get("id") != model)}

        a1 = adapter_dir("a1")
        load = "/v1/load_lora_adapter"
        await call("lora load a1", load, {"lora_name": "a1", "lora_path": a1})
        await call("lora load a1 again", load, {"lora_name": "a1", "lora_path": a1})
        await call("lora load a1 again in place", load, {"lora_name": "a1", "lora_path": a1, "load_inplace": True})
        await listed("v1/models with a1")
        await complete("completion with a1", "a1")
        await lora_prefix_steps(call, out, model, work, trainer)
        await call("lora load rank 16 (above --max-lora-rank)", load,
                   {"lora_name": "big", "lora_path": adapter_dir("big", rank=16)})
        await call("lora load a missing path", load, {"lora_name": "gone", "lora_path": str(work / "gone")})
        await call("lora load without lora_path", load, {"lora_name": "x"})
        await call("lora load under the base model's name", load, {"lora_name": model, "lora_path": a1})
        await listed("v1/models after the refused loads")
        await call("lora unload a1", "/v1/unload_lora_adapter", {"lora_name": "a1"})
        await call("lora unload a1 again", "/v1/unload_lora_adapter", {"lora_name": "a1"})
        await complete("completion with a1 after its unload", "a1")
        await listed("v1/models after the unload")

        # -- the token-in/token-out route naming a model; the disk reload from a path of the trainer's --
        generate = {"token_ids": PROMPT, "sampling_params": {"max_tokens": 4, "temperature": 0}}
        await call("lora load a2", load, {"lora_name": "a2", "lora_path": adapter_dir("a2")})
        response = await call("generate with a2", "/inference/v1/generate", {**generate, "model": "a2"})
        out["generate with a2 answer"] = choice(response.json())
        await call("generate with an unknown model", "/inference/v1/generate", {**generate, "model": "nope"})

        def reload(path: Path | None) -> dict[str, Any]:
            return {"method": "reload_weights", **({"kwargs": {"weights_path": str(path)}} if path else {})}

        step1 = write_checkpoint_atomic(work, "step1", trainer.weights(1), {})
        served = await checksums(client, url)
        await call("reload_weights from a new path", "/collective_rpc", reload(step1))
        loaded = await checksums(client, url)
        out["weights after the reload from a new path"] = {"changed": loaded != served}
        await call("reload_weights after a reload from a new path", "/collective_rpc", reload(None))
        out["weights after a plain reload"] = {"the new path's": await checksums(client, url) == loaded}
        await call("reload_weights from a missing path", "/collective_rpc", reload(work / "gone"))
        response = await call("weight_checker after the failed reload", "/weight_checker", {"action": "checksum"})
        after = response.json().get("checksums") if response.status_code == 200 else None
        out["weights after the failed reload"] = {
            "unchanged": after == loaded, "keys unchanged": sorted(after or {}) == sorted(loaded or {}),
            "changed keys": len([k for k in (after or {}) if (loaded or {}).get(k) != after[k]])}
        await call("reload_weights after the failed reload", "/collective_rpc", reload(None))
        await call("reload_weights from the new path again", "/collective_rpc", reload(step1))
        out["weights after a reload from the new path again"] = {"the new path's": await checksums(client, url) == loaded}
        await native_transfer(call, client, url, out, trainer, loaded, lambda step: complete(step, model))
        # last: what a completion meets on the weights a failed reload left (it ends the server: run_engine records
        # whether the process exited, ENDED; asking /health once here raced the shutdown, 503 or no answer)
        await call("reload_weights from a missing path once more", "/collective_rpc", reload(work / "gone"))
        try:
            await complete("completion after a failed reload", model)
        except (httpx.HTTPError, ValueError) as err:
            out["completion after a failed reload"] = {"status": None, "error": type(err).__name__}
    return {f"{step} (lora)": seen for step, seen in out.items()}


async def lora_prefix_steps(call: Call, out: dict[str, Observation], model: str, work: Path, trainer: Any) -> None:
    """An adapter's cached blocks across its reloads in place: keyed by its name and path
    (``_gen_lora_extra_hash_keys``, 0.32.0), so a reload from the same path (new files written there) hits the KV
    the old adapter computed, and one from another path does not."""
    from conformance.reference.transports import write_checkpoint_atomic

    def write(name: str, version: int) -> str:
        adapter = trainer.lora(version, rank=2)
        return str(write_checkpoint_atomic(work, name, adapter.tensors, adapter.config,
                                           weights_file="adapter_model.safetensors", config_file="adapter_config.json"))

    load = "/v1/load_lora_adapter"
    await call("prefix lora: load p", load, {"lora_name": "p", "lora_path": write("p", 1)})
    await cached_tokens(call, out, "prefix lora: first", "p")
    await cached_tokens(call, out, "prefix lora: again", "p")
    await call("prefix lora: reload p in place, same path", load,
               {"lora_name": "p", "lora_path": write("p", 2), "load_inplace": True})
    await cached_tokens(call, out, "prefix lora: after a reload in place from the same path", "p")
    await call("prefix lora: reload p in place, another path", load,
               {"lora_name": "p", "lora_path": write("p-other", 3), "load_inplace": True})
    await cached_tokens(call, out, "prefix lora: after a reload in place from another path", "p")
    await call("prefix lora: unload p", "/v1/unload_lora_adapter", {"lora_name": "p"})


async def native_transfer(call: Call, client: httpx.AsyncClient, url: str, out: dict[str, Observation],
                          trainer: Any, served: Any, complete: Callable[[str], Awaitable[None]]) -> None:
    """vLLM's native weight transfer through the gloo engine (``--weight-transfer-config '{"backend": "gloo"}'``;
    on real vLLM :mod:`gpu.vllm_gloo`): this script joins as the trainer (rank 0 of a gloo group of 2), then one
    session that loads new weights and publishes a version, one whose last tensor has the wrong shape (the update
    fails; vLLM ends the session with the layers reset), a new session whose good update fails again (the failed
    layer kept what it buffered), a session reopened and finished, one more update, and the weights and answers
    after each (``served``: the checksums before)."""
    from fakes.distributed import distributed_metadata, trainer_group
    from gpu.engine import free_port

    port = free_port("127.0.0.1")
    init = {"init_info": {"master_address": "127.0.0.1", "master_port": port, "rank_offset": 1, "world_size": 2,
                          "group_name": "fidelity"}}
    joined = asyncio.create_task(asyncio.to_thread(trainer_group, "127.0.0.1", port, 2, "fidelity", 60.0))
    await call("native init", "/init_weight_transfer_engine", init)
    group = await joined
    try:
        async def update(step: str, named: dict[str, Any]) -> None:
            meta = distributed_metadata(named)
            info = {"names": meta["names"], "dtype_names": meta["dtypes"], "shapes": meta["shapes"]}
            sent = asyncio.create_task(asyncio.to_thread(group.send, named, 60.0))
            await call(step, "/update_weights", {"update_info": info})
            try:
                await sent
            except Exception as err:  # noqa: BLE001 - what the broadcast met is an observation too
                out[step + " broadcast"] = {"error": type(err).__name__}

        new = trainer.weights(2)
        await call("native start", "/start_weight_update")
        await update("native update", new)
        await call("native finish with a version", "/finish_weight_update", {"weight_version": "v-native"})
        out["weight_info after the native update"] = (await client.get(url + "/weight_info")).json()
        loaded = await checksums(client, url)
        out["weights after the native update"] = {"changed": loaded != served}
        await complete("completion after the native update")
        await call("native start again", "/start_weight_update")
        wrong = dict(trainer.weights(3))
        last = list(wrong)[-1]
        wrong[last] = wrong[last].reshape(-1)[:1].clone()  # a shape the model's parameter does not have
        await update("native update with a wrong shape", wrong)
        out["weight_info after the failed native update"] = (await client.get(url + "/weight_info")).json()
        await call("native finish after the failed update", "/finish_weight_update")
        await call("native start after the failed update", "/start_weight_update")
        await update("native update after the failed one", trainer.weights(4))
        await call("native start after the second failure", "/start_weight_update")
        await call("native finish of the reopened session", "/finish_weight_update")
        after = await checksums(client, url)
        out["weights after the failed native update"] = {"as after the good one": after == loaded,
                                                           "as served before": after == served}
        await call("native start once finished", "/start_weight_update")
        await update("native update once finished", trainer.weights(4))
        await call("native finish once finished", "/finish_weight_update")
        out["weights after the update once finished"] = {"changed": await checksums(client, url) != after}
    finally:
        await asyncio.to_thread(group.destroy)
    await call("native shutdown", "/shutdown_weight_transfer_engine")


# -- the differential: the script on the fake vLLM and on real vLLM, diffed --------------------------------------------

FAKE_PROGRAM = ("-m", "fakes.vllm.launch_server")
"""The fake vLLM, a drop-in for ``vllm.entrypoints.openai.api_server``."""
LAUNCH_FLAGS = ("--enable-scale-out", "--enable-prompt-tokens-details")
"""Beyond the CPU flags: the token-in/token-out route, the one that answers version spans, and the prompt tokens the
prefix cache served in every usage."""
LORA_FLAGS = ("--enable-lora", "--max-lora-rank", "8", "--max-loras", "2")
"""The LoRA lifetime's server: a second one, started with runtime LoRA on (rank 8 at most) and the gloo weight-transfer
engine (:data:`gpu.vllm_setup.GLOO_TRANSFER`: its native transfer runs there, :func:`native_transfer`)."""
FAKE_SPEED = ("--fake-tokens-per-second", "8000")
"""The fake decodes the held requests in seconds (its pace changes no answer the script compares)."""


def divergences_file(release: str) -> Path:
    return Path(__file__).resolve().parent / f"divergences-vllm-{release}.json"


def script_digest() -> str:
    """What a vLLM list was measured with: this script, the SGLang script's module it takes its client, normalisation
    and diff from, and every source of the fake (the fake vLLM runs on the shared state model)."""
    here = Path(__file__).resolve()
    root = here.parents[2]
    sources = [here, here.with_name("script.py"),
               *sorted(p for p in (root / "fakes").rglob("*") if p.suffix in (".py", ".json"))]
    digest = hashlib.sha256()
    for path in sources:
        digest.update(path.relative_to(root).as_posix().encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()[:12]


def run_engine(model_dir: Path, release: str, fake: bool, venv: Path | None, lora: bool = False,
               sent: list[Sent] | None = None, dp: bool = False) -> tuple[dict[str, Observation], float]:
    """Start the fake or real vLLM on ``model_dir`` with the same flags (with ``lora``, :data:`LORA_FLAGS` too; with
    ``dp``, :data:`DP_FLAGS`), run the script (or the LoRA or data-parallel script), stop it; the observations and
    the start time."""
    from gpu.engine import EXIT_WAIT_S, EngineProcess, EngineStartError
    from gpu.vllm_cpu import CPU_ENV, CPU_FLAGS, ENGINE_CORE, PROGRAM, pin_engine_cores, python_of
    from gpu.vllm_setup import GLOO_TRANSFER, REPO

    extra = (*(LORA_FLAGS + GLOO_TRANSFER if lora else ()), *(DP_FLAGS if dp else ()),
             *(("--fake-release", release, *FAKE_SPEED) if fake else ()))
    engine = EngineProcess(None, FAKE_PROGRAM if fake else PROGRAM,
                           env={**CPU_ENV, "PYTHONPATH": str(REPO), **(DP_ENV if dp else {})},
                           name=f"fidelity-vllm-{'fake' if fake else 'real'}-{release}{'-lora' if lora else ''}"
                                f"{'-dp' if dp else ''}",
                           python=None if fake or venv is None else str(python_of(venv)),
                           args=lambda host, port: ["--model", str(model_dir), "--host", host, "--port", str(port),
                                                    *CPU_FLAGS, "--max-model-len", str(MODEL_LEN), *LAUNCH_FLAGS,
                                                    *extra])
    started = time.monotonic()
    try:
        engine.start(START_TIMEOUT_S)
        start_s = time.monotonic() - started
        if not fake and not pin_engine_cores(engine.process.pid, {0}):  # beside the workers (CPU_ENV, DP_ENV)
            raise EngineStartError(f"no {ENGINE_CORE} process under the real vLLM server ({engine.describe()})")
        work = model_dir.parent / f"lora-{'fake' if fake else 'real'}"
        script = (run_vllm_lora_script(engine.url, str(model_dir), work, sent) if lora
                  else run_vllm_dp_script(engine.url, str(model_dir), sent) if dp
                  else run_vllm_script(engine.url, str(model_dir), sent))
        out = asyncio.run(script)
        if lora:
            out[ENDED] = {"exited": engine.exits_within(EXIT_WAIT_S)}
        return out, round(start_s, 1)
    finally:
        engine.stop()


START_TIMEOUT_S = 300.0
ENDED = "server exited after a completion on the failed reload (lora)"
"""The LoRA lifetime's last observation: whether the server process exited once its last completion met the engine a
failed reload killed (fact ``engine_death_ends_server``: vLLM shuts the API server down)."""
UNCOVERED = Path(__file__).resolve().parent / "uncovered-vllm.json"
"""The fake vLLM's routes no step compares, each with its reason (``python -m gpu.fidelity --engine vllm
--coverage``)."""


def surface(release: str) -> dict[str, frozenset[str]]:
    """The routes the fake vLLM serves on ``release`` (``fakes.vllm.app.ROUTES``: every release of its table serves
    all of them). Its handlers read body fields one by one, declared in no struct table: the report is by route."""
    from fakes.vllm.app import ROUTES

    return {path: frozenset() for path in ROUTES}


def coverage_main(releases: Sequence[str]) -> int:
    """Both lifetimes of the script on the fake vLLM alone, per release: the routes no step calls, against
    :data:`UNCOVERED` (exit 1 on an unexplained or stale entry)."""
    import tempfile

    from gpu.tiny_model import TinyModelConfig, write_model

    from .coverage import listed, report, uncovered_in

    found = {}
    with tempfile.TemporaryDirectory(prefix="weightsync-fidelity-vllm-") as tmp:
        model_dir = write_model(Path(tmp) / "model", TinyModelConfig(max_position_embeddings=MODEL_LEN))
        for release in releases:
            sent: list[Sent] = []
            for lora in (False, True):
                run_engine(model_dir, release, True, None, lora=lora, sent=sent)
            found[release] = uncovered_in(surface(release), sent)
    text, holds = report(found, listed(UNCOVERED), "vllm", surface, UNCOVERED)
    print(text)
    return 0 if holds else 1


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m gpu.fidelity --engine vllm --release V [--update] [--json FILE]``, or ``--coverage [--release
    V]`` (no real engine)."""
    import argparse
    import tempfile

    from gpu.engine import EngineStartError
    from gpu.tiny_model import TinyModelConfig, write_model
    from gpu.vllm_cpu import RELEASES, status

    from .lists import command_line, compare, is_race, key

    parser = argparse.ArgumentParser(prog="python -m gpu.fidelity --engine vllm")
    parsed = command_line(parser, argv, RELEASES, "vLLM", coverage_main, status, UNCOVERED)
    if isinstance(parsed, int):
        return parsed
    args, env = parsed
    with tempfile.TemporaryDirectory(prefix="weightsync-fidelity-vllm-") as tmp:
        model_dir = write_model(Path(tmp) / "model", TinyModelConfig(max_position_embeddings=MODEL_LEN))
        try:
            fake, fake_start = run_engine(model_dir, args.release, True, None)
            real, real_start = run_engine(model_dir, args.release, False, env.venv)
            fake.update(run_engine(model_dir, args.release, True, None, lora=True)[0])
            real.update(run_engine(model_dir, args.release, False, env.venv, lora=True)[0])
            fake.update(run_engine(model_dir, args.release, True, None, dp=True)[0])
            real.update(run_engine(model_dir, args.release, False, env.venv, dp=True)[0])
        except EngineStartError as error:
            print(f"gpu.fidelity: an engine did not start: {str(error).splitlines()[0]}", file=sys.stderr)
            return 1
    found = diff(fake, real)
    path = divergences_file(args.release)
    recorded = json.loads(path.read_text()) if path.exists() else {}
    print(f"vllm {args.release}: fake up in {fake_start} s, real up in {real_start} s; {len(found)} divergences")
    if recorded.get("script") != script_digest() and not args.update:
        print(f"  STALE   {path.name} was measured with another script or fake; re-measure with python -m "
              f"gpu.fidelity --engine vllm --release {args.release} --update")
    listed = {key(e): e for e in recorded.get("divergences", [])}
    new, gone = compare(found, list(listed.values()))
    for d in found:
        mark = "  NOT BUILT" if d.get("not_built") else "  NEW   " if d in new else "  listed"
        print(f"{mark} {d['step']} / {d['field']}: fake {json.dumps(d['fake'])} | real {json.dumps(d['real'])}")
    for e in gone:
        print(f"  GONE    {e['step']} / {e['field']}: listed, no longer diverges (remove it)")
    if args.json:
        args.json.write_text(json.dumps({"fake": fake, "real": real, "diff": found}, indent=1))
    if args.update:
        found_keys = {key(d) for d in found}
        races = [e for k, e in listed.items() if is_race(e) and k not in found_keys]
        entries = [{**d, "class": listed.get(key(d), {}).get("class", "TODO"),
                    "why": listed.get(key(d), {}).get("why", "TODO")} for d in found] + races
        path.write_text(json.dumps({"release": args.release, "script": script_digest(), "divergences": entries},
                                   indent=1) + "\n")
    return 1 if new or gone else 0
