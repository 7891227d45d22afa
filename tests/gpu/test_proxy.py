"""The recording proxy in front of a remote engine: forwards everything as it is, streams chunk by chunk, records
like the fake backend's recorder, and passes the client's disconnect on to the engine."""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time

import httpx
import pytest

from conformance.wire import PROBE_HEADER, WireLog
from fakes.asgi import read_body
from fakes.server import LoopbackServer
from gpu.proxy import RecordingProxy

pytestmark = pytest.mark.cpu


class Upstream:
    """A stand-in engine. ``/stream`` sends one SSE chunk, then the second only once ``release`` is set;
    ``/echo`` answers what it received; ``/hold`` waits for the client to go away and notes it."""

    def __init__(self) -> None:
        self.release = threading.Event()
        self.disconnected = threading.Event()
        self.seen: list[dict] = []

    async def __call__(self, scope: dict, receive, send) -> None:
        if scope["type"] != "http":
            return
        body = await read_body(receive)
        headers = {k.decode(): v.decode() for k, v in scope["headers"]}
        self.seen.append({"path": scope["path"], "headers": headers})
        if scope["path"] == "/stream":
            await send({"type": "http.response.start", "status": 200,
                        "headers": [(b"content-type", b"text/event-stream"), (b"x-engine", b"e0")]})
            await send({"type": "http.response.body", "body": b'data: {"text": "a"}\n\n', "more_body": True})
            while not self.release.is_set():
                await asyncio.sleep(0.005)
            await send({"type": "http.response.body", "body": b'data: {"text": "ab"}\n\ndata: [DONE]\n\n'})
        elif scope["path"] == "/hold":
            await send({"type": "http.response.start", "status": 200,
                        "headers": [(b"content-type", b"text/event-stream")]})
            await send({"type": "http.response.body", "body": b"data: {}\n\n", "more_body": True})
            while (await receive())["type"] != "http.disconnect":
                pass
            self.disconnected.set()
        else:
            raw = json.dumps({"method": scope["method"], "query": scope["query_string"].decode(),
                              "body": body.decode(), "x-sentinel": headers.get("x-sentinel")}).encode()
            await send({"type": "http.response.start", "status": 201,
                        "headers": [(b"content-type", b"application/json"), (b"set-cookie", b"a=1"),
                                    (b"set-cookie", b"b=2")]})
            await send({"type": "http.response.body", "body": raw})


@pytest.fixture
def upstream():
    app = Upstream()
    with LoopbackServer(app) as server:
        app.url = server.url
        yield app
    app.release.set()


@pytest.fixture
def proxied(upstream):
    wire = WireLog()
    proxy = RecordingProxy(upstream.url, 0, wire).start()
    yield proxy, wire
    proxy.stop()


def test_requests_and_answers_pass_through_with_every_header(upstream, proxied) -> None:
    proxy, wire = proxied
    r = httpx.post(proxy.url + "/echo?x=1&y=%20", content=b'{"k": [1, 2]}',
                   headers={"content-type": "application/json", "x-sentinel": "cycle-0"})
    assert r.status_code == 201
    assert r.json() == {"method": "POST", "query": "x=1&y=%20", "body": '{"k": [1, 2]}', "x-sentinel": "cycle-0"}
    assert r.headers.get_list("set-cookie") == ["a=1", "b=2"]
    assert upstream.seen[-1]["headers"]["content-type"] == "application/json"
    (call,) = wire.snapshot()
    assert (call.engine, call.method, call.path, call.status) == (0, "POST", "/echo", 201)
    assert call.payload == {"k": [1, 2]} and call.response["x-sentinel"] == "cycle-0"


def test_a_stream_arrives_chunk_by_chunk_and_is_recorded_whole(upstream, proxied) -> None:
    proxy, wire = proxied

    async def go() -> tuple[bytes, bytes, str]:
        async with httpx.AsyncClient(timeout=10) as client:
            async with client.stream("POST", proxy.url + "/stream", json={"stream": True}) as r:
                chunks = r.aiter_raw()
                first = await asyncio.wait_for(chunks.__anext__(), 5)  # while the engine holds the rest back
                assert wire.in_flight("/stream") == {0: 1}
                upstream.release.set()
                rest = b"".join([c async for c in chunks])
                return first, rest, r.headers["x-engine"]

    first, rest, engine_header = asyncio.run(go())
    assert first == b'data: {"text": "a"}\n\n' and rest.startswith(b'data: {"text": "ab"}')
    assert engine_header == "e0"
    (call,) = wire.snapshot()
    assert call.response == {"text": "ab"} and call.t_end is not None


def test_probes_pass_unrecorded_and_refusals_never_reach_the_engine(upstream, proxied) -> None:
    proxy, wire = proxied
    assert httpx.get(proxy.url + "/echo", headers={PROBE_HEADER: "1"}).status_code == 201
    assert wire.snapshot() == [] and len(upstream.seen) == 1
    proxy.control.refuse(0, "/update_weights_from_disk", 400, {"success": False, "message": "injected"})
    r = httpx.post(proxy.url + "/update_weights_from_disk", json={"model_path": "/ckpt"})
    assert (r.status_code, r.json()) == (400, {"success": False, "message": "injected"})
    assert len(upstream.seen) == 1
    assert [(c.path, c.status) for c in wire.snapshot()] == [("/update_weights_from_disk", 400)]


def test_the_clients_disconnect_reaches_the_engine(upstream, proxied) -> None:
    proxy, wire = proxied

    async def go() -> None:
        async with httpx.AsyncClient(timeout=10) as client:
            async with client.stream("POST", proxy.url + "/hold", json={}) as r:
                await asyncio.wait_for(r.aiter_raw().__anext__(), 5)
    asyncio.run(go())  # leaves the stream unfinished: the connection closes
    assert upstream.disconnected.wait(5), "the engine never saw the client go away"
    deadline = time.monotonic() + 5
    while wire.in_flight("/hold"):
        assert time.monotonic() < deadline, "the call stays open on the wire"
        time.sleep(0.01)


def test_an_unreachable_or_failed_engine_answers_502_with_the_reason() -> None:
    with LoopbackServer(Upstream()) as gone:
        url = gone.url
    wire = WireLog()
    proxy = RecordingProxy(url, 1, wire).start()
    try:
        r = httpx.post(proxy.url + "/generate", json={"text": "x"})
        assert r.status_code == 502 and f"engine at {url} unreachable" in r.json()["error"]
        proxy.proxy.fail("engine 1 (node n1) failed: its actor died")
        r = httpx.post(proxy.url + "/generate", json={"text": "x"})
        assert (r.status_code, r.json()) == (502, {"error": "engine 1 (node n1) failed: its actor died"})
        assert [c.status for c in wire.snapshot()] == [502, 502]
    finally:
        proxy.stop()


@pytest.mark.slow  # waits out the engines' idle limit (5 s)
def test_the_proxy_keeps_an_idle_connection_open_past_the_engines_idle_limit(upstream, proxied) -> None:
    """The proxy runs in the suite's process, whose loops a busy machine stalls for seconds: a client that read an
    answer 3 s late (its own expiry, 2 s, counts from then) would send its next request as an engine-like 5-s limit
    closes the connection, and the request would be lost unanswered (the real-vLLM CI stage, once). So the proxy
    holds idle connections for ``gpu.proxy.KEEP_ALIVE_S``: a connection idle for longer than the engine's own
    limit still carries the next request."""
    from fakes.facts import FAMILIES

    proxy, wire = proxied
    host, port = proxy.url.removeprefix("http://").split(":")
    request = b"POST /echo HTTP/1.1\r\nhost: proxy\r\ncontent-type: application/json\r\ncontent-length: 2\r\n\r\n{}"
    with socket.create_connection((host, int(port)), timeout=10.0) as conn:
        conn.sendall(request)
        assert conn.recv(65536).startswith(b"HTTP/1.1 201")
        time.sleep(max(f.keep_alive_s for f in FAMILIES.values()) + 0.5)  # the idle time is what is tested
        conn.sendall(request)
        assert conn.recv(65536).startswith(b"HTTP/1.1 201"), "the proxy closed the idle connection"
    assert [c.status for c in wire.snapshot()] == [201, 201]
