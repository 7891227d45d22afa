"""Backends: one is added with a module and a row of the backend table; the fake backend's stepped clock (held, it
decodes nothing; stepped, exactly the steps asked for)."""

from __future__ import annotations

import contextlib
import asyncio
from pathlib import Path

import httpx
import pytest

import conformance.reference  # noqa: F401  imported here, so the in-process session below shares it
import conformance.suite  # noqa: F401

with contextlib.suppress(ImportError):  # lazily imported by the scenarios; a second import in one process fails
    import torch  # noqa: F401
from conformance.backend_table import BACKENDS, BackendRow
from conformance.backends import FakeBackend, FakeBackendConfig
from conformance.cases import CASES
from conformance.expectations import load_expectations
from conformance.breaks import ScenarioTimeout
from conformance.situations.waiting import wait_for

pytestmark = pytest.mark.cpu


def test_a_stepped_backend_decodes_only_the_steps_asked_for_while_held() -> None:
    backend = FakeBackend(FakeBackendConfig(engines=1, tokens_per_second=200.0, stepped=True))
    backend.start()

    async def scenario() -> None:
        async with httpx.AsyncClient(timeout=10.0) as client:
            answer = asyncio.create_task(client.post(backend.urls[0] + "/generate", json={
                "rid": "r0", "input_ids": [1, 2, 3], "sampling_params": {"max_new_tokens": 40}}))
            await wait_for(lambda: 0 < backend.tokens_left().get("r0", 0) < 35, 5.0, "r0 decoding")
            async with backend.held():
                left = backend.tokens_left()["r0"]
                with pytest.raises(ScenarioTimeout):  # ten ticks' time: the clock stands still
                    await wait_for(lambda: backend.tokens_left()["r0"] != left, 0.05, "a token")
                await backend.step(left - 2)
                assert backend.tokens_left() == {"r0": 2}
            body = (await asyncio.wait_for(answer, 5.0)).json()
        assert body["meta_info"]["finish_reason"]["type"] == "length" and body["meta_info"]["completion_tokens"] == 40
        with pytest.raises(RuntimeError, match="inside FakeBackend.held"):
            await backend.step()

    try:
        asyncio.run(scenario())
    finally:
        backend.stop()


def test_a_real_time_backend_cannot_be_held() -> None:
    backend = FakeBackend(FakeBackendConfig(engines=1))

    async def hold() -> None:
        async with backend.held():
            pass

    with pytest.raises(RuntimeError, match="stepped=True"):
        asyncio.run(hold())


def test_a_restarted_engine_answers_what_it_held_as_a_crash_and_comes_back_from_its_start_up_weights() -> None:
    backend = FakeBackend(FakeBackendConfig(engines=2, tokens_per_second=200.0))
    backend.start()
    initial = backend.digests()

    async def scenario() -> None:
        url = backend.urls[1]
        async with httpx.AsyncClient(timeout=10.0) as client:
            answer = asyncio.create_task(client.post(url + "/generate", json={
                "rid": "held", "input_ids": [1, 2, 3], "sampling_params": {"max_new_tokens": 400}}))
            await wait_for(lambda: "held" in backend.tokens_left(), 5.0, "the request decoding")
            await (await client.post(url + "/update_weight_version", json={"new_version": "3", "abort_all_requests": False})).aread()
            await asyncio.to_thread(backend.restart, 1)
            crashed = await asyncio.wait_for(answer, 5.0)
            assert crashed.status_code == 500 and "engine crashed" in crashed.text, crashed.text
            body = (await client.post(url + "/generate", json={
                "rid": "after", "input_ids": [1], "sampling_params": {"max_new_tokens": 2}})).json()
            assert body["meta_info"]["weight_version"] == "default"
            assert (await client.get(url + "/model_info")).json()["weight_version"] == "default"

    try:
        asyncio.run(scenario())
        assert backend.digests() == initial and backend.urls[1].startswith("http://127.0.0.1:")
        kinds = [e["kind"] for e in backend.truth()["engine_events"][1]]
        assert kinds.count("engine.crash") == 1 and kinds.index("engine.crash") < len(kinds) - 1, kinds
    finally:
        backend.stop()


TRIVIAL_BACKEND = '''
"""A trivial backend: one fake engine per scenario."""
from conformance.backends import FakeBackend, FakeBackendConfig


class OneEngine(FakeBackend):
    name = "one-engine"


class OneEngineSetup:
    def __init__(self, seed):
        self.seed = seed

    def skip_reason(self):
        return None

    def backend_factory(self):
        return lambda: OneEngine(FakeBackendConfig(engines=1, seed=self.seed))

    def close(self):
        pass
'''
ADOPTER = '''
from conformance.suite import ConformanceSuite


class TestOnOneEngine(ConformanceSuite):
    backends = ("one-engine",)
    scenarios = ("first-drain",)
    invariants = ("V3",)
'''


def test_a_backend_is_one_module_and_one_table_row(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch,
                                                   tmp_path: Path) -> None:
    """A row pointing at a module written here: its marker is registered, its case is collected and runs (and
    passes) on it, and an expectations entry may name it."""
    (tmp_path / "one_engine_backend.py").write_text(TRIVIAL_BACKEND)
    monkeypatch.syspath_prepend(tmp_path)
    monkeypatch.setitem(BACKENDS, "one-engine", BackendRow(
        "one-engine", "one_engine", "one fake engine (a test's backend)", "one_engine_backend:OneEngineSetup",
        options=("seed",)))
    pytester.makeini("[pytest]\nasyncio_default_fixture_loop_scope = function\n")
    pytester.makepyfile(test_one_engine=ADOPTER)
    args = ("-p", "no:cacheprovider", "-p", "no:xdist", "-p", "no:benchmark", "--strict-markers", "-v")
    result = pytester.runpytest_inprocess(*args, "-m", "one_engine")
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(["*TestOnOneEngine::test_case?V3-first-drain-one-engine? PASSED*"])
    entry = tmp_path / "expectations.toml"
    entry.write_text('[[xfail]]\ncase = "V3-first-drain"\nreason = "r"\nbackend = "one-engine"\n')
    assert load_expectations(entry, [c.id for c in CASES]).lookup("V3-first-drain", "one-engine") is not None
