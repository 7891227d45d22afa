"""fakes/server.py: the fake served over loopback (thread and process mode) and in-process (ASGI, respx).

Every wait has a deadline; nothing sleeps to synchronise (the engine's `wait_until` and uvicorn's startup
condition do the waiting).
"""

from __future__ import annotations

import asyncio
import socket
import threading
import time

import httpx
import pytest

from fakes.engine import FakeEngine
from fakes.server import LoopbackServer, asgi_client, mount_respx

pytestmark = pytest.mark.cpu

PROMPT = {"text": "the quick brown fox", "sampling_params": {"max_new_tokens": 6}}


def _loopback_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("fakes-loopback-")]


def _port_is_free(port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _assert_generated(body: dict) -> None:
    assert body["meta_info"]["finish_reason"] == {"type": "length", "length": 6}
    assert len(body["output_ids"]) == 6 and body["meta_info"]["weight_version"] == "default"


def test_thread_mode_serves_requests_httpx_and_aiohttp_then_stops_clean() -> None:
    import requests
    import httpx
    import aiohttp
    engine = FakeEngine(tokens_per_second=2000)
    with LoopbackServer(engine.app) as server:
        port = int(server.url.rsplit(":", 1)[1])
        assert port != 0 and server.url == f"http://127.0.0.1:{port}" and server.running
        _assert_generated(requests.post(server.url + "/generate", json=PROMPT, timeout=10).json())
        _assert_generated(httpx.post(server.url + "/generate", json=PROMPT, timeout=10).json())

        async def with_aiohttp() -> dict:
            async with aiohttp.ClientSession() as session:
                async with session.post(server.url + "/generate", json=PROMPT,
                                        timeout=aiohttp.ClientTimeout(total=10)) as resp:
                    assert resp.status == 200
                    return await resp.json()

        _assert_generated(asyncio.run(with_aiohttp()))

        async def with_httpx_async() -> dict:
            async with httpx.AsyncClient(base_url=server.url, timeout=10) as client:
                return (await client.post("/generate", json=PROMPT)).json()

        _assert_generated(asyncio.run(with_httpx_async()))
        assert len(engine.events.of_kind("request.finish")) == 4
    assert not server.running and _loopback_threads() == []
    assert _port_is_free(port), "the port is released after stop"
    server.stop()  # idempotent


def test_thread_mode_run_coroutine_drives_a_manual_clock_engine() -> None:
    import requests
    engine = FakeEngine()  # manual clock: nothing decodes until the test steps it
    with LoopbackServer(engine.app) as server:
        results: list[dict] = []
        client = threading.Thread(
            target=lambda: results.append(requests.post(server.url + "/generate", json=PROMPT, timeout=10).json()))
        client.start()
        server.run_coroutine(engine.wait_until(lambda: bool(engine.scheduler.waiting or engine.scheduler.running),
                                               timeout=5), timeout=6)
        server.run_coroutine(engine.step(10), timeout=5)
        client.join(10)
        assert not client.is_alive()
        _assert_generated(results[0])
        assert server.loop is not None and server.loop.is_running()
    assert _loopback_threads() == []


def test_thread_mode_factory_builds_the_app_inside_the_server_loop() -> None:
    import httpx
    seen: list[asyncio.AbstractEventLoop] = []

    def factory():
        seen.append(asyncio.get_running_loop())
        return FakeEngine(tokens_per_second=2000).app

    with LoopbackServer(factory=factory) as server:
        assert seen == [server.loop]
        _assert_generated(httpx.post(server.url + "/generate", json=PROMPT, timeout=10).json())


def test_stop_is_bounded_with_a_request_hanging_in_flight() -> None:
    """A /generate parked on a paused engine never answers; stop still returns within its bound."""
    import requests
    engine = FakeEngine(profile="0.5.23")
    server = LoopbackServer(engine.app, stop_timeout=0.5).start()
    assert requests.post(server.url + "/pause_generation", json={"mode": "retract"}, timeout=5).status_code == 200
    errors: list[BaseException] = []

    def parked() -> None:
        try:
            requests.post(server.url + "/generate", json=PROMPT, timeout=10)
        except Exception as e:  # noqa: BLE001 - the connection is cut at stop
            errors.append(e)

    client = threading.Thread(target=parked, daemon=True)
    client.start()
    server.run_coroutine(engine.wait_until(lambda: bool(engine.snapshot()["parked"]), timeout=5), timeout=6)
    started = time.monotonic()
    server.stop()
    assert time.monotonic() - started < 4.0
    client.join(5)
    assert not client.is_alive() and _loopback_threads() == []


def test_a_server_thread_that_does_not_stop_is_named_with_where_it_is_stuck() -> None:
    """An app that blocks its event loop (a synchronous wait in a handler) keeps the thread from stopping: stop()
    says so, with the thread's stack as the witness."""
    entered, release = threading.Event(), threading.Event()

    async def blocks_the_loop(scope: dict, receive: object, send: object) -> None:
        if scope["type"] == "http":
            entered.set()
            release.wait(30)  # synchronous: the loop cannot run until it returns

    server = LoopbackServer(blocks_the_loop, stop_timeout=0.2).start()
    client = threading.Thread(target=lambda: _post_ignoring_errors(server.url), daemon=True)
    client.start()
    assert entered.wait(10)
    try:
        with pytest.raises(RuntimeError, match="did not stop; it is at:") as error:
            server.stop()
        assert "blocks_the_loop" in str(error.value) and "release.wait(30)" in str(error.value)
    finally:
        release.set()
        server.stop()
        client.join(10)
    assert _loopback_threads() == []


def _post_ignoring_errors(url: str) -> None:
    try:
        httpx.post(url + "/x", timeout=5)
    except httpx.HTTPError:
        pass


@pytest.mark.slow  # a second Python process
def test_process_mode_reads_the_printed_url_and_exits_zero() -> None:
    import requests
    server = LoopbackServer(mode="process", cli_args=["--engines", "1", "--tokens-per-second", "2000"])
    with server:
        assert server.process is not None and server.url.startswith("http://127.0.0.1:")
        _assert_generated(requests.post(server.url + "/generate", json=PROMPT, timeout=10).json())
    assert server.returncode == 0, server.stderr_tail()


def test_constructor_refuses_nonsense() -> None:
    with pytest.raises(ValueError):
        LoopbackServer(None)
    with pytest.raises(ValueError):
        LoopbackServer(FakeEngine().app, mode="process")
    with pytest.raises(ValueError):
        LoopbackServer(FakeEngine().app, mode="fork")


@pytest.mark.asyncio
async def test_asgi_client_in_process() -> None:
    engine = FakeEngine(tokens_per_second=2000)
    async with asgi_client(engine.app) as client:
        _assert_generated((await client.post("/generate", json=PROMPT)).json())
        info = (await client.get("/model_info")).json()
        assert info["weight_version"] == "default"


@pytest.mark.asyncio
async def test_mount_respx_routes_a_base_url_to_the_app() -> None:
    import respx
    import httpx
    engine = FakeEngine(tokens_per_second=2000)
    with respx.mock(assert_all_called=True) as router:
        mount_respx(router, "http://engine-0:30000", engine.app)
        async with httpx.AsyncClient(timeout=10) as client:
            _assert_generated((await client.post("http://engine-0:30000/generate", json=PROMPT)).json())
            resp = await client.post("http://engine-0:30000/update_weight_version",
                                     json={"new_version": "7", "abort_all_requests": False})
            assert resp.json() == {"success": True, "message": "Weight version updated to 7", "new_version": "7"}
    assert engine.weight_version == "7"
