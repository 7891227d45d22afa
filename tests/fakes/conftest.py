"""Fixtures for the fake engine's wire tests: an in-process httpx client with deadlines on every call."""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import Any, AsyncIterator, Awaitable, Callable

import httpx
import pytest
import pytest_asyncio

from fakes.engine import FakeEngine

CALL_TIMEOUT_S = 15.0
"""The bound on every call to an in-process fake: a hang fails in seconds. A fresh environment's first calls (modules
imported and compiled lazily, under pytest-xdist on 2 cores) once took over 5 s; a warm call takes milliseconds."""
PROFILE_VERSIONS = ("0.5.4", "0.5.10", "0.5.23")


class Wire:
    """One fake engine reached over ``httpx.ASGITransport``; every await is bounded."""

    def __init__(self, engine: FakeEngine, client: httpx.AsyncClient) -> None:
        self.engine = engine
        self.client = client

    async def call(self, method: str, path: str, timeout: float = CALL_TIMEOUT_S, **kw: Any) -> httpx.Response:
        return await asyncio.wait_for(self.client.request(method, path, **kw), timeout)

    async def post(self, path: str, json: Any = None, **kw: Any) -> httpx.Response:
        return await self.call("POST", path, json=json, **kw)

    async def get(self, path: str, **kw: Any) -> httpx.Response:
        return await self.call("GET", path, **kw)

    def spawn(self, method: str, path: str, **kw: Any) -> asyncio.Task:
        """Start a call in the background (it may block on the engine); collect it with ``result``."""
        return asyncio.ensure_future(self.client.request(method, path, **kw))

    def spawn_generate(
        self, rid: str | None = None, max_new_tokens: int = 16, text: Any = "x", **extra: Any
    ) -> asyncio.Task:
        """Start one ``POST /generate`` in the background."""
        body = {"text": text, "sampling_params": {"max_new_tokens": max_new_tokens}, **extra}
        if rid is not None:
            body["rid"] = rid
        return self.spawn("POST", "/generate", json=body)

    @staticmethod
    async def result(task: Awaitable[Any], timeout: float = CALL_TIMEOUT_S) -> Any:
        return await asyncio.wait_for(task, timeout)

    async def wait(self, predicate: Callable[[], bool], timeout: float = 2.0) -> None:
        await self.engine.wait_until(predicate, timeout)

    async def start_generates(
        self, n: int, prefix: str = "r", max_new_tokens: int = 16, **extra: Any
    ) -> list[asyncio.Task]:
        """Start ``n`` /generate calls (rids ``{prefix}{i}``) and wait until the scheduler holds them all."""
        before = len(self.engine.scheduler.live())
        tasks = [self.spawn_generate(f"{prefix}{i}", max_new_tokens, f"prompt {i}", **extra) for i in range(n)]
        await self.wait(lambda: len(self.engine.scheduler.live()) >= before + n)
        return tasks

    async def results(self, tasks: list[asyncio.Task]) -> list[httpx.Response]:
        return await asyncio.wait_for(asyncio.gather(*tasks), CALL_TIMEOUT_S)

    async def step_until_done(self, tasks: list[asyncio.Task], timeout_s: float = CALL_TIMEOUT_S) -> list[httpx.Response]:
        """Step the engine until every task has its answer, for at most ``timeout_s``: not a number of steps, since a
        request may wait on a thread (an adapter read from disk) however many steps go by (CI flake: 500 steps went
        by before an implicit LoRA reload finished under xdist load, and the request then waited unstepped)."""
        deadline, steps = time.monotonic() + timeout_s, 0
        while not all(t.done() for t in tasks) and time.monotonic() < deadline:
            await self.engine.step()
            steps += 1
            await asyncio.sleep(0 if steps < 500 else 0.001)  # then leave the threads some time
        return await self.results(tasks)


@pytest_asyncio.fixture
async def connect() -> AsyncIterator[Callable[[FakeEngine], Awaitable[Wire]]]:
    """``wire = await connect(engine)``; clients and engines are closed at teardown."""
    stack = contextlib.AsyncExitStack()
    engines: list[FakeEngine] = []

    async def _connect(engine: FakeEngine) -> Wire:
        transport = httpx.ASGITransport(app=engine.app)
        client = await stack.enter_async_context(
            httpx.AsyncClient(transport=transport, base_url="http://fake", timeout=CALL_TIMEOUT_S)
        )
        engines.append(engine)
        return Wire(engine, client)

    yield _connect
    for engine in engines:
        await asyncio.wait_for(engine.aclose(), CALL_TIMEOUT_S)
    await stack.aclose()


@pytest.fixture(params=PROFILE_VERSIONS)
def profile_version(request: pytest.FixtureRequest) -> str:
    return request.param
