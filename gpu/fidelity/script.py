"""The fidelity script: one fixed sequence of weight-sync calls, sent to an engine, each answer normalised.

:func:`run_script` drives one engine (the fake or real SGLang of one release, started with the same launch line)
through the weight-sync surface and returns ``{step: {field: value}}``: status codes, ``success``, the class of the
message (its text with numbers, paths and ids masked), ``finish_reason``, the ``meta_info`` keys present, version
labels and spans, ``num_paused_requests``, the fields of ``/model_info`` and ``/get_server_info`` the suite reads,
and after every update which checkpoint the engine holds (digests over ``/get_weights_by_name``). Two engines of
the same release must give the same observations; :func:`diff` lists where they do not.

A request "running" at a pause is made so: a streamed ``/generate`` whose first chunk arrived (it is in the
scheduler), with ``ignore_eos`` and a budget it cannot finish before the pause. Whether it was still running is
recorded when the pause is sent (``running_at_pause``; an abort-mode pause ends it, so it is read before), so a step
whose situation did not happen shows as such (``diff``: not built), never as agreement.
"""

from __future__ import annotations

import asyncio
import base64
import io
import json
import re
import sys
import time
import uuid
from datetime import timedelta
from pathlib import Path
from typing import Any, Awaitable, Callable, Mapping, NamedTuple, Protocol, TypeVar

import httpx
import torch

from fakes.facts import SGLANG
from fakes.tensor_payloads import encode_flattened_bucket, encode_weight_sync_payload
from gpu.weights import parameter_specs, read_weights

Observation = dict[str, Any]
LONG_TOKENS = 1000
"""Budget of the request held across a pause: the pause is sent as its first token arrives, so it is resident then
unless the engine decodes 1000 tokens in that moment (≈ 3 s at SGLang's 350 tokens/s on 2 quiet cores, 1 s on the
fake at the 1000 tokens/s :func:`gpu.fidelity.__main__.spec` gives it)."""
CALL_TIMEOUT_S = 120.0


def message_class(text: Any) -> str | None:
    """A message with what varies between runs masked: paths, ids, numbers, versions, quoted names."""
    if not isinstance(text, str):
        return None
    if "validation error" in text:  # pydantic's rendering of a bad body (wording differs between releases)
        return "<validation error>"
    text = re.sub(r"/[\w./-]+", "<path>", text)
    text = re.sub(r"\b[0-9a-f]{16,}\b", "<id>", text)
    text = re.sub(r"\bv\d+\b", "<v>", text)
    text = re.sub(r"\d+(\.\d+)?", "<n>", text)
    return text.strip()[:160]


_ERROR = re.compile(r"'type': '(\w+)', 'loc': \((.*?)\), 'msg'")


def validation_errors(text: Any) -> list[str] | None:
    """A validation error's errors as ``type at loc`` (what FastAPI's ``exc.errors()`` lists, in the message SGLang
    answers with: ``entrypoints/http_server.py`` ``validation_exception_handler``), sorted; None for other
    messages."""
    found = sorted({f"{kind} at {loc.rstrip(',')}" for kind, loc in _ERROR.findall(text)}) if isinstance(text, str) \
        else []
    return found or None


def normalise(response: httpx.Response) -> Observation:
    """Status, and for a JSON object its keys, ``success``, message class and the weight-sync fields."""
    seen: Observation = {"status": response.status_code}
    try:
        body = response.json()
    except ValueError:
        seen["text"] = message_class(response.text)
        return seen
    if isinstance(body, dict):
        seen["keys"] = sorted(body)
        for key in ("success", "num_paused_requests", "new_version", "status", "object", "type", "code"):
            if key in body:
                seen["body." + key] = body[key]
        if isinstance(body.get("loaded_adapters"), dict):
            seen["loaded adapters"] = sorted(body["loaded_adapters"])
        for key in ("message", "detail", "error", "error_message"):
            if key in body:
                seen["body." + key] = message_class(body[key] if isinstance(body[key], str) else json.dumps(body[key]))
                errors = validation_errors(body[key])
                if errors:
                    seen["validation errors"] = errors
    else:
        seen["body"] = "null" if body is None else type(body).__name__
    return seen


def generation(meta: Mapping[str, Any] | None, budget: int) -> Observation:
    """What a finished ``/generate`` says about versions and how it ended (not its tokens)."""
    if meta is None:
        return {"finished": False}
    finish = meta.get("finish_reason") or {}
    spans = meta.get("weight_versions")
    seen: Observation = {
        "meta_info keys": sorted(meta),
        "finish_reason.type": finish.get("type"),
        "finish_reason.message": message_class(finish.get("message")),
        "full budget": meta.get("completion_tokens") == budget,
        "weight_version": meta.get("weight_version"),
    }
    if spans is not None:
        seen["span versions"] = [s.get("version") for s in spans]
        seen["spans cover the output"] = (bool(spans) and spans[0].get("start") == 0
                                          and spans[-1].get("end") == meta.get("completion_tokens")
                                          and all(a.get("end") == b.get("start") for a, b in zip(spans, spans[1:])))
    for key in ("num_retractions", "total_retractions"):
        if key in meta:
            seen[key] = min(int(meta[key]), 1)
    for key in ("input_token_logprobs", "output_token_logprobs"):
        if isinstance(meta.get(key), list):
            entries = meta[key]
            seen[key] = {"entries": len(entries), "arity": sorted({len(e) for e in entries if isinstance(e, list)}),
                         "text": sorted({type(e[2]).__name__ for e in entries if isinstance(e, list) and len(e) > 2})}
    return seen


class Held:
    """A streamed ``/generate`` kept running in the background; :meth:`started` once its first chunk arrived."""

    def __init__(self, client: httpx.AsyncClient, url: str, budget: int = LONG_TOKENS, rid: str | None = None) -> None:
        self.budget, self.rid = budget, rid
        self.rid_seen: str | None = None
        self.first = asyncio.Event()
        self.meta: dict[str, Any] | None = None
        self.status: int | None = None
        self.last_chunk = 0.0
        """When its last chunk arrived (``time.monotonic``)."""
        self.task = asyncio.ensure_future(self._run(client, url))

    async def _run(self, client: httpx.AsyncClient, url: str) -> None:
        body = {"input_ids": [5, 6, 7, 8], "stream": True,
                "sampling_params": {"max_new_tokens": self.budget, "temperature": 0, "ignore_eos": True},
                **({"rid": self.rid} if self.rid else {})}
        try:
            async with client.stream("POST", url + "/generate", json=body) as response:
                self.status = response.status_code
                async for line in response.aiter_lines():
                    if not line.startswith("data:") or line.strip() == "data: [DONE]":
                        continue
                    chunk = json.loads(line[5:])
                    self.last_chunk = time.monotonic()
                    self.first.set()
                    self.meta = chunk.get("meta_info", self.meta)
                    self.rid_seen = (self.meta or {}).get("id")
        except httpx.HTTPError:
            pass  # the server went away mid-answer: result() shows it unfinished
        finally:
            self.first.set()

    async def started(self) -> bool:
        await asyncio.wait_for(self.first.wait(), CALL_TIMEOUT_S)
        return not self.task.done()

    async def result(self) -> Observation:
        try:
            await asyncio.wait_for(asyncio.shield(self.task), CALL_TIMEOUT_S)
        except (httpx.HTTPError, asyncio.TimeoutError) as error:
            return {"error": type(error).__name__}
        done = self.meta is not None and (self.meta.get("finish_reason") is not None)
        return generation(self.meta if done else None, self.budget)


Holder = TypeVar("Holder", bound="HasResult")


class HasResult(Protocol):
    """A held request of either script: what became of it."""

    async def result(self) -> Observation: ...


async def during_decode(start: Callable[[], Awaitable[tuple[Holder, bool]]], act: Callable[[Holder], Awaitable[bool]],
                        undo: Callable[[], Awaitable[Any]] | None = None, tries: int = 5) -> tuple[Observation, bool]:
    """Run ``act`` while a held request decodes on the engine (``start``: a held request and whether it was seen
    decoding), and again (after ``undo``, if any) while it did not land mid-decode: ``act`` makes its call and says,
    from what it measured once answered, whether the request was still decoding when the engine took the call up (a
    call the engine takes up late may find the request finished). The held request's result and whether the
    situation happened (a step that never built it shows as such in the diff, never as agreement)."""
    for attempt in range(tries):
        held, running = await start()
        acted = await act(held)  # made also when the request was never seen decoding: the step is still observed
        landed = running and acted
        result = await held.result()
        if landed or attempt == tries - 1:
            return result, landed
        print(f"  ({getattr(act, '__name__', 'act')}, try {attempt + 1} of {tries}: "
              f"{'the call found the held request finished' if running else 'the held request never seen decoding'};"
              f" again)", file=sys.stderr)
        if undo is not None:
            await undo()
    raise AssertionError("tries must be at least 1")


class Checkpoints:
    """The checkpoints the script loads: the served one (``m0``) and perturbed copies written beside it."""

    def __init__(self, model_dir: Path, work: Path) -> None:
        self.model_dir = Path(model_dir)
        self.weights = {"m0": read_weights(self.model_dir)}
        self.specs = parameter_specs(self.weights["m0"])
        self.paths = {"m0": self.model_dir}
        for label, scale in (("m1", 1.5), ("m2", -1.0)):
            self.weights[label] = {n: (t.float() * scale).to(t.dtype) for n, t in self.weights["m0"].items()}
            self.paths[label] = self._write(work / label, self.weights[label])
        self.digests = {label: {n: _digest(t) for n, t in w.items()} for label, w in self.weights.items()}
        last = list(self.weights["m0"])[-1]
        wrong = {**self.weights["m1"], last: torch.zeros(*(d + 1 for d in self.weights["m0"][last].shape),
                                                         dtype=self.weights["m0"][last].dtype)}
        self.paths["wrong shape"] = self._write(work / "wrong-shape", wrong)  # its last parameter does not fit

    def _write(self, path: Path, weights: Mapping[str, torch.Tensor]) -> Path:
        import shutil

        from safetensors.torch import save_file

        path.mkdir(parents=True, exist_ok=True)
        for f in self.model_dir.iterdir():
            if f.suffix != ".safetensors" and f.is_file():
                shutil.copy(f, path / f.name)
        save_file(dict(weights), str(path / "model.safetensors"), metadata={"format": "pt"})
        return path

    def held(self, digests: Mapping[str, str]) -> str:
        """Which checkpoint the engine holds, parameter by parameter ("m1", or "m0 except 3 of m2", ...)."""
        labels = {}
        for name, digest in digests.items():
            labels[name] = next((label for label, d in self.digests.items() if d.get(name) == digest), "other")
        counts: dict[str, int] = {}
        for label in labels.values():
            counts[label] = counts.get(label, 0) + 1
        held = ", ".join(f"{label}:{n}" for label, n in sorted(counts.items()))
        others = sorted(name for name, label in labels.items() if label == "other")
        return held + (f" ({', '.join(others[:3])})" if others else "")


def _digest(tensor: torch.Tensor) -> str:
    from fakes.weights import TensorBlob

    return TensorBlob.from_torch(tensor).digest()


def forking_pickle_b64(named: list[tuple[str, torch.Tensor]] | dict[str, torch.Tensor]) -> str:
    """SGLang's ``MultiprocessingSerializer.serialize(named, output_str=True)`` from this process: a ForkingPickler
    pickle (tensors in shared memory, ``file_system`` strategy: doc §8), base64; a weight update sends a list of
    pairs, an adapter a dict."""
    import torch.multiprocessing as mp
    from multiprocessing.reduction import ForkingPickler

    mp.set_sharing_strategy("file_system")
    buffer = io.BytesIO()
    ForkingPickler(buffer).dump(named)
    return base64.b64encode(buffer.getvalue()).decode()


def safetensors_b64(named: list[tuple[str, torch.Tensor]]) -> str:
    """A safetensors buffer as a tensor payload: what ``MultiprocessingSerializer.deserialize`` cannot read."""
    from safetensors.torch import save

    return base64.b64encode(save({n: t.contiguous() for n, t in named})).decode()


Call = Callable[..., Awaitable[httpx.Response]]


class Sent(NamedTuple):
    """A request the script sent: method, path, the top-level fields of its JSON body, and the engine state it was
    sent in where the state matrix names it (:data:`STATE_HEADER`)."""

    method: str
    path: str
    fields: frozenset[str]
    state: str | None = None


STATE_HEADER = "x-fidelity-state"
"""Names the engine state a call of the state matrix (:mod:`gpu.fidelity.matrix`) was sent in."""


def sent_by(request: httpx.Request) -> Sent:
    """What ``request`` sent (no fields when its body is not a JSON object)."""
    try:
        body = json.loads(request.content) if request.content else None
    except (ValueError, UnicodeDecodeError):
        body = None
    return Sent(request.method, request.url.path, frozenset(body) if isinstance(body, dict) else frozenset(),
                request.headers.get(STATE_HEADER))


CONNECT_S = 30.0
"""How long a call may wait for the server to accept its connection (it accepts late while it decodes a long request
on a busy machine)."""


def script_client(sent: list[Sent] | None) -> httpx.AsyncClient:
    """The scripts' client (SGLang's and vLLM's): a connection per call, so no call is lost to a kept-alive connection
    its server closes. An idle connection reused in the instant the server's idle limit (5 s, uvicorn's
    ``timeout_keep_alive`` in both engines) closes it gets no answer, and the lifetime ended there as if the server
    were lost (the fake SGLang's state matrix under load, in the slow tier's coverage check: every later state
    uncompared); and after a 500 a handler raised, vLLM's uvicorn closes the connection itself (measured, 0.32.0).
    Every request it sends is appended to ``sent`` (the coverage report's input)."""
    async def record(request: httpx.Request) -> None:
        if sent is not None:
            sent.append(sent_by(request))
    return httpx.AsyncClient(timeout=httpx.Timeout(CALL_TIMEOUT_S, connect=CONNECT_S),
                             limits=httpx.Limits(max_keepalive_connections=0), event_hooks={"request": [record]})


class Steps:
    """One server lifetime of the script: the client, what was observed, and the helpers every step uses."""

    def __init__(self, client: httpx.AsyncClient, url: str, ckpt: "Checkpoints", work: Path, release: str,
                 out: dict[str, Observation], sent: list[Sent]) -> None:
        self.client, self.url, self.ckpt, self.work, self.release, self.out = client, url, ckpt, work, release, out
        self.sent = sent
        self.sessions = bool(SGLANG.fact("weight_update_sessions", release))

    async def call(self, step: str, path: str, body: Any = None, method: str = "POST",
                   headers: Mapping[str, str] | None = None, **extra: Any) -> httpx.Response:
        """Send ``body`` (JSON, or raw ``bytes`` as JSON's content type) and record the answer, with ``extra``."""
        kwargs: dict[str, Any] = {"json": body} if body is not None and not isinstance(body, bytes) else {}
        if isinstance(body, bytes):
            kwargs = {"content": body, "headers": {"content-type": "application/json"}}
        if headers:
            kwargs["headers"] = {**kwargs.get("headers", {}), **headers}
        try:
            response = await self.client.request(method, self.url + path, **kwargs)
        except httpx.HTTPError as error:
            self.out[step] = {"error": type(error).__name__}
            raise
        self.out[step] = {**normalise(response), **extra}
        return response

    async def weights(self, step: str) -> None:
        from gpu.weights import read_engine_digests

        self.out[step] = {"holds": self.ckpt.held(await read_engine_digests(self.url, self.ckpt.specs))}
        self.sent.append(Sent("POST", "/get_weights_by_name", frozenset({"name", "truncate_size"})))  # its own client

    async def label(self, step: str) -> None:
        info = (await self.client.get(self.url + "/model_info")).json()
        self.out[step] = {"weight_version": info.get("weight_version")}

    async def aborting(self, step: str, path: str, body: Any, request_step: str, rid: str | None = None,
                       precondition: str = "running_at_call",
                       undo: Callable[[], Awaitable[Any]] | None = None) -> Held:
        """``step``, a call that aborts what runs, made while a held request decodes, and made again (a fresh held
        request each time) when the request ran to its full budget before the abort reached it: the engine decodes
        ahead of its client, and a busy machine can delay the call past the budget's end (measured: 0.5.10 and
        0.5.15, once in five runs each). What became of the request goes in ``request_step``; whether the call
        caught it, in ``precondition``; ``undo`` runs before a call is made again. The last held request is returned (its
        rid as seen)."""
        last: list[Held] = []

        async def start() -> tuple[Held, bool]:
            last.append(Held(self.client, self.url, rid=rid))
            return last[-1], await last[-1].started()

        async def act(held: Held) -> bool:
            await self.call(step, path, body)
            return not (await held.result()).get("full budget")

        self.out[request_step], landed = await during_decode(start, act, undo, tries=3)
        self.out[step][precondition] = landed
        return last[-1]

    async def held_pause(self, mode: str, step: str) -> Held:
        """Pause in ``mode`` while a held request decodes; ``running_at_pause`` says whether it had started and had not
        ended when the pause answered (the pause landed on it; what became of it: the held request's result)."""
        held = Held(self.client, self.url)
        running = await held.started()
        await self.call(step, "/pause_generation", {"mode": mode})
        self.out[step]["running_at_pause"] = running and not held.task.done()
        return held


async def main_steps(steps: Steps, model_dir: Path, lora: bool) -> None:
    """Everything but the calls that may end a server."""
    call, weights, label, held_pause, out, ckpt = (steps.call, steps.weights, steps.label, steps.held_pause,
                                                   steps.out, steps.ckpt)
    sessions, work, release = steps.sessions, steps.work, steps.release
    # -- what the engine reports at start --
    await call("health", "/health", method="GET")
    info = (await call("model_info", "/model_info", method="GET")).json()
    out["model_info"].update({k: info.get(k) for k in ("weight_version", "is_generation")})
    out["model_info"]["model_path is the served dir"] = info.get("model_path") == str(model_dir)
    server = (await call("get_server_info", "/get_server_info", method="GET")).json()
    out["get_server_info"] = {"status": out["get_server_info"]["status"], "version": server.get("version"),
                              "weight_version": server.get("weight_version"), "tp_size": server.get("tp_size"),
                              "dp_size": server.get("dp_size"),
                              "model_path is the served dir": server.get("model_path") == str(model_dir)}
    await call("get_weight_version", "/get_weight_version", method="GET")
    for path in ("/weight_version", "/health_generate", "/ready", "/v1/models", "/v1/models/nope"):
        await call(f"GET {path}", path, method="GET")
    for path, alias in (("/get_model_info", "model_info"), ("/server_info", "get_server_info")):  # the same answer
        body = (await call(f"GET {path}", path, method="GET")).json()
        out[f"GET {path}"] = {"status": out[f"GET {path}"]["status"],
                              "same as " + alias: all(body.get(k) == out[alias].get(k) for k in (
                                  "weight_version", "is_generation", "version", "tp_size", "dp_size")
                                  if k in out[alias])}
    served = str(info.get("served_model_name") or model_dir)
    await call("GET /v1/models/<served model>", f"/v1/models/{served}", method="GET")
    await weights("weights at start")

    # -- generate --
    for step, body in (("generate text", {"text": "hello", "sampling_params": {"max_new_tokens": 8,
                                                                               "temperature": 0}}),
                       ("generate input_ids", {"input_ids": [1, 2, 3], "sampling_params": {
                           "max_new_tokens": 4, "temperature": 0, "ignore_eos": True}})):
        response = await call(step, "/generate", body)
        budget = body["sampling_params"]["max_new_tokens"]
        out[step].update(generation(response.json().get("meta_info"), budget))
        out[step]["output_ids length"] = len(response.json().get("output_ids", []))
    response = await call("generate with logprobs and a rid", "/generate", {
        "input_ids": [1, 2, 3], "rid": "fidelity-logprobs", "return_logprob": True, "return_text_in_logprobs": True,
        "sampling_params": {"max_new_tokens": 3, "temperature": 0, "ignore_eos": True}})
    if response.status_code == 200:
        meta = response.json().get("meta_info")
        out["generate with logprobs and a rid"].update(generation(meta, 3))
        out["generate with logprobs and a rid"]["id is the rid sent"] = (meta or {}).get("id") == "fidelity-logprobs"
    await call("generate without prompt", "/generate", {"sampling_params": {"max_new_tokens": 2}})
    await call("generate with text and input_ids", "/generate",
               {"text": "a", "input_ids": [1], "sampling_params": {"max_new_tokens": 2}})

    # -- pause in_place, relabel, disk update without flush, continue --
    held = await held_pause("in_place", "pause in_place (request running)")
    await call("relabel v1 without abort (paused)", "/update_weight_version",
               {"new_version": "v1", "abort_all_requests": False})
    await call("disk m1 flush_cache false (paused in place)", "/update_weights_from_disk",
               {"model_path": str(ckpt.paths["m1"]), "flush_cache": False})
    await weights("weights after disk m1")
    await call("flush_cache (paused in place, request resident)", "/flush_cache")
    await call("continue after in_place", "/continue_generation", {})
    out["request held across in_place"] = await held.result()
    await label("label after v1")

    # -- retract --
    held = await held_pause("retract", "pause retract (request running)")
    await call("relabel v2 without abort (retracted)", "/update_weight_version",
               {"new_version": "v2", "abort_all_requests": False})
    await call("flush_cache (paused retract)", "/flush_cache")
    await call("continue after retract", "/continue_generation", {})
    out["request held across retract"] = await held.result()

    # -- abort pause, default-abort relabel --
    await steps.aborting("pause abort (request running)", "/pause_generation", {"mode": "abort"},
                         "request under pause abort", precondition="running_at_pause",
                         undo=lambda: steps.client.post(steps.url + "/continue_generation", json={}))
    await call("continue after abort", "/continue_generation", {})
    await steps.aborting("relabel v3 (abort_all_requests default)", "/update_weight_version", {"new_version": "v3"},
                         "request under default relabel")
    await label("label after v3")

    # -- abort_request: one request by its rid, then every request --
    held = await steps.aborting("abort_request by rid", "/abort_request", {"rid": "fidelity-held"},
                                "request aborted by rid", rid="fidelity-held")
    out["request aborted by rid"]["id is the rid sent"] = held.rid_seen == "fidelity-held"
    await steps.aborting("abort_request abort_all", "/abort_request", {"abort_all": True},
                         "request aborted by abort_all")

    # -- tensor updates --
    named = [(n, t) for n, t in ckpt.weights["m2"].items()]
    if sessions:
        await call("tensor outside a session", "/update_weights_from_tensor",
                   {"serialized_named_tensors": [forking_pickle_b64(named)], "flush_cache": False})
        await call("begin_weight_update", "/begin_weight_update", {})
        await call("begin_weight_update again", "/begin_weight_update", {})
    await call("tensor m2 (ForkingPickler, file_system)", "/update_weights_from_tensor",
               {"serialized_named_tensors": [forking_pickle_b64(named)], "flush_cache": False,
                "weight_version": "v4"})
    await weights("weights after tensor m2")
    await label("label after tensor v4")
    bucket = encode_flattened_bucket(ckpt.weights["m1"], fmt="pickle")  # encoded before a request is held
    await steps.aborting("tensor m1 flattened_bucket, abort_all_requests (request running)",
                         "/update_weights_from_tensor",
                         {"serialized_named_tensors": [bucket], "load_format": "flattened_bucket",
                          "abort_all_requests": True, "flush_cache": False},
                         "request under the aborting tensor update")
    await weights("weights after tensor m1 flattened_bucket")
    await call("tensor m2 weight_sync LocalSerializedTensor", "/update_weights_from_tensor",
               {"serialized_named_tensors": encode_weight_sync_payload(ckpt.weights["m2"], fmt="pickle",
                                                                       release=release),
                "flush_cache": False})
    await weights("weights after tensor m2 weight_sync")

    # -- distributed (gloo) --
    await distributed_steps(call, ckpt, weights)
    await label("label after distributed v4d")
    if sessions:
        await call("end_weight_update", "/end_weight_update", {})
        await call("end_weight_update again", "/end_weight_update", {})

    # -- misc control surface --
    await call("flush_cache idle", "/flush_cache")
    await call("get_weights_by_name unknown", "/get_weights_by_name", {"name": "no.such.weight"})
    await call("release_memory_occupation", "/release_memory_occupation", {})
    await call("resume_memory_occupation", "/resume_memory_occupation", {})
    await call("release_memory_occupation kv_cache", "/release_memory_occupation", {"tags": ["kv_cache"]})
    await call("resume_memory_occupation kv_cache", "/resume_memory_occupation", {"tags": ["kv_cache"]})
    await call("weights_checker checksum", "/weights_checker", {"action": "checksum"})
    await call("relabel with a number", "/update_weight_version", {"new_version": 7})
    await call("relabel without body", "/update_weight_version", b"")
    await call("pause with a bad mode", "/pause_generation", {"mode": "bogus"})
    await call("disk not json", "/update_weights_from_disk", b"{not json")
    await call("disk missing path", "/update_weights_from_disk", {"model_path": str(work / "absent")})
    await call("disk m0 flush_cache false (idle)", "/update_weights_from_disk",
               {"model_path": str(ckpt.paths["m0"]), "flush_cache": False, "weight_version": "v5"})
    await weights("weights after disk m0")
    await label("label after disk v5")
    await steps.aborting("disk m2 load_format auto, abort_all_requests (request running)",
                         "/update_weights_from_disk",
                         {"model_path": str(ckpt.paths["m2"]), "load_format": "auto", "abort_all_requests": True,
                          "flush_cache": False}, "request under the aborting disk update")
    await weights("weights after disk m2")
    await concurrency_steps(steps)
    if lora:
        await lora_steps(call, ckpt, work, release, out)


async def concurrency_steps(steps: Steps) -> None:
    """Control calls at once, and during a stream. SGLang runs a weight update under the writer side of its
    ``model_update_lock`` while every ``/generate`` holds the reader side to its end (``utils/aio_rwlock.py``,
    ``managers/tokenizer_manager.py``); relabels and flushes take no lock. Each stream is a fresh held request, so
    whether one call waited for its stream cannot leave the next without one."""
    call, out, ckpt, n = steps.call, steps.out, steps.ckpt, len(steps.ckpt.specs)
    relabel = "/update_weight_version"
    await asyncio.gather(call("relabel c1 (two at once)", relabel, {"new_version": "c1", "abort_all_requests": False}),
                         call("relabel c2 (two at once)", relabel, {"new_version": "c2", "abort_all_requests": False}))
    info = (await steps.client.get(steps.url + "/model_info")).json()
    out["label after two relabels at once"] = {"one of the two": info.get("weight_version") in ("c1", "c2")}
    # which of the two came last is the wire's doing: the streams below start from one label on both engines
    await steps.client.post(steps.url + relabel, json={"new_version": "c2", "abort_all_requests": False})
    await asyncio.gather(*(call(f"disk {m} (two at once)", "/update_weights_from_disk",
                                {"model_path": str(ckpt.paths[m]), "flush_cache": False}) for m in ("m1", "m2")))
    await steps.weights("weights after two disk updates at once")
    holds = out["weights after two disk updates at once"].pop("holds")
    out["weights after two disk updates at once"]["one of the two, whole"] = holds in (f"m1:{n}", f"m2:{n}")
    for step, path, body in (
            ("relabel c3 during a stream", relabel, {"new_version": "c3", "abort_all_requests": False}),
            ("flush_cache during a stream", "/flush_cache", None),
            ("disk m0 during a stream", "/update_weights_from_disk",
             {"model_path": str(ckpt.paths["m0"]), "flush_cache": False, "weight_version": "c4"})):
        held = Held(steps.client, steps.url, budget=3 * LONG_TOKENS)  # ~9 s on real SGLang: the call lands mid-stream
        running = await held.started()                                 # even when this machine stalls the client
        await call(step, path, body, running_at_call=running)
        out[f"the stream under {step.removesuffix(' during a stream')}"] = await held.result()
    await steps.weights("weights after the disk update during a stream")
    await steps.label("label after the disk update during a stream")


# -- the calls that may end a real server, each in a server lifetime of its own (the driver starts a fresh server
# for each and records whether it exited), so none is dead behind another. Why each exits, in SGLang's table
# (fakes.facts.SGLANG): the flushing update where post_update_flush_failure is "crash", the unknown group where
# distributed_receive_errors_answered is false, the wrong shape and the tensor payloads by load_failure_kills.


async def _flushing_disk_update(steps: Steps) -> None:
    held = await steps.held_pause("in_place", "pause in_place before the flushing disk update")
    await steps.call("disk m1 flush_cache default (paused in place, request running)", "/update_weights_from_disk",
                     {"model_path": str(steps.ckpt.paths["m1"]), "weight_version": "v6"})
    await steps.label("label after the flushing disk update")
    await steps.weights("weights after the flushing disk update")
    await steps.call("continue after the flushing disk update", "/continue_generation", {})
    steps.out["request held across the flushing disk update"] = await held.result()


async def _in_a_session(steps: Steps, lifetime: str) -> None:
    if steps.sessions:
        await steps.call(f"begin_weight_update ({lifetime})", "/begin_weight_update", {})


async def _unknown_group(steps: Steps) -> None:
    await _in_a_session(steps, "unknown group")
    await steps.call("distributed unknown group", "/update_weights_from_distributed",
                     {"names": ["model.norm.weight"], "dtypes": ["bfloat16"], "shapes": [[8]], "group_name": "nope",
                      "flush_cache": False})


async def _wrong_shape(steps: Steps) -> None:
    await steps.call("disk wrong shape", "/update_weights_from_disk",
                     {"model_path": str(steps.ckpt.paths["wrong shape"]), "flush_cache": False})


async def _bad_base64(steps: Steps) -> None:
    await _in_a_session(steps, "bad base64")
    await steps.call("tensor bad base64", "/update_weights_from_tensor",
                     {"serialized_named_tensors": ["not base64!"], "flush_cache": False})


async def _direct_checkpoint_names(steps: Steps) -> None:
    await _in_a_session(steps, "direct with checkpoint names")
    named = list(steps.ckpt.weights["m2"].items())
    await steps.call("tensor load_format direct with checkpoint names", "/update_weights_from_tensor",
                     {"serialized_named_tensors": [forking_pickle_b64(named)], "load_format": "direct",
                      "flush_cache": False})  # the model's parameters are stacked (qkv_proj): a KeyError


async def _safetensors_payload(steps: Steps) -> None:
    await _in_a_session(steps, "safetensors payload")
    named = list(steps.ckpt.weights["m2"].items())[:1]
    await steps.call("tensor safetensors payload", "/update_weights_from_tensor",
                     {"serialized_named_tensors": [safetensors_b64(named)], "flush_cache": False})


async def _local_tensor_of_another_release(steps: Steps) -> None:
    """The weight_sync helper's payload as another SGLang release pickles it (LocalSerializedTensor under the module
    it lives in there): a trainer whose sglang is not the engine's."""
    await _in_a_session(steps, "LocalSerializedTensor of another release")
    fact = "local_serialized_tensor_module"
    other = next(r for r in reversed(SGLANG.releases) if SGLANG.fact(fact, r) != SGLANG.fact(fact, steps.release))
    await steps.call("tensor weight_sync LocalSerializedTensor pickled by another release", "/update_weights_from_tensor",
                     {"serialized_named_tensors": encode_weight_sync_payload(
                         dict(list(steps.ckpt.weights["m2"].items())[:1]), fmt="pickle", release=other),
                      "flush_cache": False})


ENDINGS: dict[str, Callable[[Steps], Awaitable[None]]] = {
    "flushing disk update": _flushing_disk_update,
    "unknown group": _unknown_group,
    "wrong shape": _wrong_shape,
    "bad base64": _bad_base64,
    "safetensors payload": _safetensors_payload,
    "direct with checkpoint names": _direct_checkpoint_names,
    "LocalSerializedTensor of another release": _local_tensor_of_another_release,
}
"""The calls that may end a real server, by the lifetime each runs in."""
async def distributed_steps(call: Call, ckpt: Checkpoints, weights: Callable[[str], Awaitable[None]]) -> None:
    """A one-engine gloo group (this process is rank 0, keyed as SGLang keys its ranks), m1 broadcast into it, then
    m2 with its last parameter a size too big (SGLang loads parameter by parameter: the ones before it load, and the
    answer says the weights are partially updated); the weights read after each."""
    import torch.distributed as dist

    from conformance.reference.transports import DistributedTransport

    transport = DistributedTransport(timeout_s=60.0)
    name = f"fidelity_{uuid.uuid4().hex[:8]}"
    store = dist.TCPStore("127.0.0.1", 0, None, True, timedelta(seconds=60), wait_for_workers=False)
    loop = asyncio.get_running_loop()
    rank0 = loop.run_in_executor(None, transport._new_group, store, name, 2)
    await call("init_weights_update_group (gloo)", "/init_weights_update_group", {
        "master_address": "127.0.0.1", "master_port": store.port, "rank_offset": 1, "world_size": 2,
        "group_name": name, "backend": "gloo"})
    group = await asyncio.wait_for(rank0, 60.0)
    names = list(ckpt.weights["m1"])
    tensors = [ckpt.weights["m1"][n].contiguous() for n in names]
    body = {"names": names, "dtypes": [str(t.dtype).removeprefix("torch.") for t in tensors],
            "shapes": [list(t.shape) for t in tensors], "group_name": name, "flush_cache": False,
            "weight_version": "v4d", "abort_all_requests": False}
    broadcast = loop.run_in_executor(None, transport._broadcast, group, tensors)
    await call("distributed m1", "/update_weights_from_distributed", body)
    await asyncio.wait_for(broadcast, 60.0)
    await weights("weights after distributed m1")
    wrong = [ckpt.weights["m2"][n].contiguous() for n in names]
    wrong[-1] = torch.zeros(*(d + 1 for d in wrong[-1].shape), dtype=wrong[-1].dtype)
    broadcast = loop.run_in_executor(None, transport._broadcast, group, wrong)
    await call("distributed m2, its last parameter a size too big", "/update_weights_from_distributed",
               {**{k: v for k, v in body.items() if k != "weight_version"}, "shapes": [list(t.shape) for t in wrong]})
    await asyncio.wait_for(broadcast, 60.0)
    await weights("weights after the distributed update that failed part-way")
    await call("destroy group", "/destroy_weights_update_group", {"group_name": name})
    await call("destroy group again", "/destroy_weights_update_group", {"group_name": name})
    group.shutdown()


def lora_adapter_dir(ckpt: Checkpoints, root: Path, name: str, rank: int = 2,
                     modules: tuple[str, ...] = ("q_proj",)) -> str:
    """A PEFT adapter directory of the served model written under ``root`` (its config naming ``modules``)."""
    from conformance.reference.transports import write_checkpoint_atomic
    from conformance.scenarios.trainer import Trainer

    adapter = Trainer(ckpt.weights["m0"], seed=0).lora(1, rank=rank)
    config = {**adapter.config, "target_modules": list(modules)}
    return str(write_checkpoint_atomic(root, name, adapter.tensors, config,
                                       weights_file="adapter_model.safetensors", config_file="adapter_config.json"))


def lora_tensors_body(ckpt: Checkpoints, release: str, name: str, pairs: bool = False) -> dict[str, Any] | None:
    """A ``/load_lora_adapter_from_tensors`` body for an adapter of the served model (its tensors pickled as a dict,
    or as a list of pairs), or None where the release has no such route."""
    from conformance.scenarios.trainer import Trainer

    field = SGLANG.fact("lora_from_tensors_field", release)
    if field is None:
        return None
    adapter = Trainer(ckpt.weights["m0"], seed=0).lora(2)
    payload = forking_pickle_b64(list(adapter.tensors.items()) if pairs else dict(adapter.tensors))
    return {"lora_name": name, "config_dict": dict(adapter.config),
            field: payload if field == "serialized_tensors" else [payload]}


async def lora_steps(call: Call, ckpt: Checkpoints, work: Path,
                     release: str, out: dict[str, Observation]) -> None:
    """LoRA on an engine started with ``--enable-lora`` (rank ≤ 8, attention projections): adapters loaded from
    disk and from tensors, used by ``/generate``, refused by the memory-pool checks, unloaded."""
    root = work / "lora"

    def adapter_dir(name: str, rank: int = 2, modules: tuple[str, ...] = ("q_proj",)) -> str:
        return lora_adapter_dir(ckpt, root, name, rank, modules)

    def generate(lora_path: str) -> dict[str, Any]:
        return {"input_ids": [1, 2, 3], "lora_path": lora_path,
                "sampling_params": {"max_new_tokens": 4, "temperature": 0, "ignore_eos": True}}

    a1 = adapter_dir("a1")
    await call("lora load a1 from disk", "/load_lora_adapter", {"lora_name": "a1", "lora_path": a1, "pinned": True})
    await call("lora load a1 again", "/load_lora_adapter", {"lora_name": "a1", "lora_path": a1})
    response = await call("generate with lora a1", "/generate", generate("a1"))
    if response.status_code == 200:
        out["generate with lora a1"].update(generation(response.json().get("meta_info"), 4))
    await call("generate with an adapter not loaded", "/generate", generate("nope"))
    await call("lora load rank 16 (above --max-lora-rank)", "/load_lora_adapter",
               {"lora_name": "big", "lora_path": adapter_dir("big", rank=16)})
    await call("lora load a module outside --lora-target-modules", "/load_lora_adapter",
               {"lora_name": "mlp", "lora_path": adapter_dir("mlp", modules=("gate_proj",))})
    await call("lora load a missing path", "/load_lora_adapter", {"lora_name": "gone", "lora_path": str(root / "gone")})
    pairs = lora_tensors_body(ckpt, release, "pairs", pairs=True)
    if pairs is not None:
        await call("lora load from tensors sent as pairs", "/load_lora_adapter_from_tensors", pairs)
        await call("lora load a2 from tensors", "/load_lora_adapter_from_tensors",
                   {**lora_tensors_body(ckpt, release, "a2"), "pinned": False, "load_format": None})
        await call("generate with lora a2", "/generate", generate("a2"))
        await call("lora unload a2", "/unload_lora_adapter", {"lora_name": "a2"})
    await call("lora unload a1", "/unload_lora_adapter", {"lora_name": "a1"})
    await call("lora unload a1 again", "/unload_lora_adapter", {"lora_name": "a1"})
    await call("generate with a1 after its unload", "/generate", generate("a1"))


PRECONDITIONS = ("running_at_pause", "running_at_call")
"""Fields that record whether a step's situation happened (False: it did not)."""


def diff(fake: Mapping[str, Observation], real: Mapping[str, Observation]) -> list[dict[str, Any]]:
    """Every (step, field) where the two engines answered differently, with both answers; and every step whose
    situation happened on neither side (a precondition False on both: ``not_built``), which never agrees."""
    found = []
    for step in list(dict.fromkeys([*real, *fake])):
        a, b = fake.get(step, {"absent": True}), real.get(step, {"absent": True})
        for field in list(dict.fromkeys([*b, *a])):
            if a.get(field, "<absent>") != b.get(field, "<absent>"):
                found.append({"step": step, "field": field, "fake": a.get(field, "<absent>"),
                              "real": b.get(field, "<absent>")})
            elif field in PRECONDITIONS and a.get(field) is False:
                found.append({"step": step, "field": field, "fake": False, "real": False, "not_built": True})
    return found
