"""The wire recorder: what it records, and the refusals it injects in front of an engine."""

from __future__ import annotations

import asyncio

import httpx
import pytest

from conformance.wire import PROBE_HEADER, WireLog, WireRecorder

pytestmark = pytest.mark.cpu


class CountingApp:
    """A stand-in engine: answers 200 ``{"success": true}`` and counts the requests that reach it."""

    def __init__(self) -> None:
        self.seen: list[str] = []

    async def __call__(self, scope: dict, receive, send) -> None:
        await receive()
        self.seen.append(scope["path"])
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"application/json")]})
        await send({"type": "http.response.body", "body": b'{"success": true}'})


def _post(app, path: str, payload: dict, headers: dict | None = None) -> httpx.Response:
    async def go() -> httpx.Response:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://engine") as client:
            return await client.post(path, json=payload, headers=headers)
    return asyncio.run(asyncio.wait_for(go(), 10))


def test_calls_are_recorded_with_payload_status_and_response_but_probes_are_not() -> None:
    log, engine = WireLog(), CountingApp()
    app = WireRecorder(engine, 3, log)
    assert _post(app, "/update_weights_from_disk", {"model_path": "/ckpt/1"}).status_code == 200
    assert _post(app, "/model_info", {}, headers={PROBE_HEADER: "1"}).status_code == 200
    [call] = log.snapshot()
    assert (call.engine, call.path, call.payload, call.status, call.response) == \
        (3, "/update_weights_from_disk", {"model_path": "/ckpt/1"}, 200, {"success": True})
    assert call.ok and call.t_end is not None and engine.seen == ["/update_weights_from_disk", "/model_info"]


def test_a_refusal_answers_once_without_reaching_the_engine_and_is_recorded() -> None:
    log, engine = WireLog(), CountingApp()
    app = WireRecorder(engine, 1, log)
    body = {"success": False, "message": "Failed to update weights: injected.", "num_paused_requests": 0}
    log.refuse(1, "/update_weights_from_disk", 400, body)
    log.refuse(0, "/update_weights_from_disk", 400, body)  # another engine's: never used here
    refused = _post(app, "/update_weights_from_disk", {"model_path": "/ckpt/2"})
    assert (refused.status_code, refused.json()) == (400, body)
    assert engine.seen == []
    assert _post(app, "/update_weights_from_disk", {"model_path": "/ckpt/2"}).status_code == 200  # consumed once
    assert engine.seen == ["/update_weights_from_disk"]
    first, second = log.snapshot()
    assert (first.status, first.response, first.ok) == (400, body, False) and second.ok
    assert log.clear_refusals() == [(0, "/update_weights_from_disk")]
    assert log.clear_refusals() == []
