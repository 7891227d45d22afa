"""The suite always returns a verdict: an integration that swallows cancellation or blocks in a worker thread gets a
``hang`` witness naming the calls it was stuck on, and the session goes on with the next scenario."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any, Mapping

import pytest

from conformance.cases import fake_backend_factory, run_one
from conformance.interface import LoraAdapter
from conformance.loop import run_abandonable
from conformance.reference import ReferenceIntegration, ReferenceUpdater
from conformance.scenarios import Deadlines

pytestmark = pytest.mark.cpu

SHORT = Deadlines(update_s=1.0, drain_s=5.0, wait_s=5.0, script_s=20.0)
RELEASE = threading.Event()
"""Set at the end of the module: lets the abandoned worker threads of these tests end."""


class SwallowsCancellation(ReferenceUpdater):
    """A retry loop in a bare ``except:``: pauses every engine, then waits for ever, cancellation included."""

    async def update(self, weights: Mapping[str, Any] | None = None, *, transport: str = "tensor",
                     lora: LoraAdapter | None = None) -> int:
        await self.pause_all()
        while not RELEASE.is_set():
            try:
                await asyncio.sleep(0.05)
            except BaseException:  # noqa: BLE001 - the bug under test
                continue
        return self.version


class BlocksInThread(ReferenceUpdater):
    """A blocking client call run in a worker thread that never returns (a lost socket without a timeout)."""

    async def update(self, weights: Mapping[str, Any] | None = None, *, transport: str = "tensor",
                     lora: LoraAdapter | None = None) -> int:
        await self.pause_all()
        await asyncio.to_thread(RELEASE.wait)
        return self.version


swallowing = ReferenceIntegration(name="swallows-cancellation", updater_cls=SwallowsCancellation)
blocking = ReferenceIntegration(name="blocks-in-thread", updater_cls=BlocksInThread)


@pytest.fixture(scope="module", autouse=True)
def _release_abandoned() -> Any:
    yield
    RELEASE.set()


@pytest.mark.parametrize("integration", [swallowing, blocking], ids=lambda i: i.name)
def test_a_hung_integration_gets_a_hang_witness_and_the_run_returns(integration) -> None:
    started = time.monotonic()
    result = run_one("steady-tensor-retract", integration, fake_backend_factory(), deadlines=SHORT)
    elapsed = time.monotonic() - started
    assert elapsed < 30, f"run_one took {elapsed:.1f}s"
    history = result.history
    assert history is not None and history.breaks, "no breakage recorded"
    hang = history.breaks[0]
    assert hang.kind == "hang" and "Updater.update() (cycle 0, tensor)" in hang.message, hang.message
    # stuck after pausing: nothing of the integration's was open, but its paused engines hold the sentinels
    lines = "\n".join(hang.describe())
    assert "did not return within 1s" in lines
    v = result.verdicts["I6"]
    assert v.status == "fail" and v.run_broke and any("hang:" in w for w in v.witness), v.explain()
    if integration is swallowing:  # the task that ignores cancellation was left behind with its loop
        assert any("did not stop when cancelled" in b.message and "SwallowsCancellation.update" in b.message
                   for b in history.breaks), [b.message for b in history.breaks]


def test_the_next_scenario_runs_after_an_abandoned_one() -> None:
    first = run_one("steady-tensor-retract", swallowing, fake_backend_factory(), deadlines=SHORT)
    assert first.history is not None and first.history.breaks
    second = run_one("steady-tensor-retract", ReferenceIntegration(), fake_backend_factory(), deadlines=SHORT)
    assert second.history is not None and not second.history.breaks, second.history.breaks
    assert all(v.passed for v in second.verdicts.values()), {k: v.explain() for k, v in second.verdicts.items()}


def test_run_abandonable_returns_results_errors_and_gives_up_on_a_blocked_loop() -> None:
    async def value() -> int:
        return 7

    async def fails() -> None:
        raise ValueError("boom")

    async def forever() -> None:
        while True:
            try:
                await asyncio.sleep(1)  # sleep-ok: the coroutine under test idles; nothing waits on it
            except asyncio.CancelledError:
                pass

    async def blocks_the_loop() -> None:
        RELEASE.wait(5.0)  # a synchronous call in a coroutine: the loop itself cannot run

    assert run_abandonable(value(), 5).get() == 7
    with pytest.raises(ValueError, match="boom"):
        run_abandonable(fails(), 5).get()
    started = time.monotonic()
    out = run_abandonable(forever(), 0.2, grace_s=0.2)
    assert not out.finished and isinstance(out.error, TimeoutError) and out.abandoned == [
        "test_run_abandonable_returns_results_errors_and_gives_up_on_a_blocked_loop.<locals>.forever"]
    out = run_abandonable(blocks_the_loop(), 0.2, grace_s=0.2)
    assert not out.finished and "does not answer" in str(out.error)
    assert time.monotonic() - started < 5


@pytest.mark.slow
@pytest.mark.parametrize("workers", [("-p", "no:xdist"), ("-n", "2")], ids=["one-process", "xdist"])
def test_a_session_goes_on_after_a_scenario_that_hangs_for_good(pytester: pytest.Pytester, monkeypatch,
                                                                  workers) -> None:
    """Through the plugin, in a session of its own: the staleness scenario hangs in ``Manager.start()`` for good
    (cancellation swallowed); its case fails with a hang witness naming the call, the failover scenario still runs
    and passes, and the report is written, with and without ``-n``. Deadlines scaled down to a fifth."""
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    monkeypatch.setenv("WEIGHTSYNC_DEADLINE_SCALE", "0.2")
    monkeypatch.setenv("PYTHONPATH", str(root))
    result = pytester.runpytest_subprocess(
        str(root / "conformance" / "suite"), "-p", "no:cacheprovider", "-m", "cpu", "--conformance-integration",
        "tests.hanging_adapter:integration", "-k", "S3-staleness or V1-failover",
        "--conformance-report", str(pytester.path / "result.json"), *workers, timeout=120)
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines(["*hang: Manager.start() did not return within 2s*"])
    assert "did not stop when cancelled" in result.stdout.str()
    assert (pytester.path / "result.json").exists()


@pytest.mark.slow
@pytest.mark.timeout(600)
@pytest.mark.parametrize("workers", [("-p", "no:xdist"), ("-n", "2")], ids=["one-process", "xdist"])
def test_an_integration_that_blocks_its_event_loop_costs_one_bound_and_each_case_gets_the_hang_witness(
        pytester: pytest.Pytester, monkeypatch, workers) -> None:
    """A synchronous poll inside the async update cycle: the scenario's loop never answers again, so the scenario is
    judged once, after its bound (deadlines scaled to a quarter: 15 s + the 15 s teardown margin; under ``-n`` after
    the release check's shorter one, 10 s), and both of its cases fail with the hang witness, not a pytest-timeout
    error; with and without ``-n``. The bound is paid by the first case's call; the second's costs nothing."""
    import re
    from pathlib import Path

    from conformance.cases import scenario_bound_s
    from conformance.preflight import probe_bound_s
    from conformance.situations.timing import Deadlines

    root = Path(__file__).resolve().parents[1]
    monkeypatch.setenv("WEIGHTSYNC_DEADLINE_SCALE", "0.25")
    monkeypatch.setenv("PYTHONPATH", str(root))
    bound, probe = scenario_bound_s(Deadlines().scaled(0.25)), probe_bound_s(Deadlines().scaled(0.25))
    result = pytester.runpytest_subprocess(
        str(root / "conformance" / "suite"), "-p", "no:cacheprovider", "-m", "cpu", "--conformance-integration",
        "tests.hanging_adapter:loop_blocking", "-k", "S3-staleness or S2-staleness", "--durations=0",
        "--durations-min=0", *workers, timeout=probe + 3 * bound)
    result.assert_outcomes(failed=2)
    out = result.stdout.str()
    assert out.count("its event loop does not answer") >= 2, out[-3000:]
    assert "Timeout" not in out and "Failed: Timeout" not in out
    calls = sorted(float(s) for s in re.findall(r"^([0-9.]+)s call .*test_case\[S[23]-staleness", out, re.M))
    assert len(calls) == 2 and calls[0] < 1.0 and calls[1] >= bound, (calls, bound)  # one bound, not one per case


def test_pytest_timeout_never_pre_empts_the_suites_own_bound_on_a_scenario(request: pytest.FixtureRequest) -> None:
    """This project's ini sets pytest-timeout at 120 s, no more than the suite's bound on a scenario: each case
    carries a timeout a minute beyond the bounds on what it may wait for (the release check, then its scenario), so a
    hung scenario is judged once by the suite (its cases get the hang witness), never killed by pytest-timeout; a
    larger --timeout stands."""
    from conformance.cases import scenario_bound_s
    from conformance.preflight import probe_bound_s
    from conformance.suite import case_timeout_s

    assert float(request.config.getini("timeout")) <= scenario_bound_s()
    assert case_timeout_s(request.config) == probe_bound_s() + scenario_bound_s() + 60.0
    before, request.config.option.timeout = request.config.option.timeout, 10_000.0
    try:
        assert case_timeout_s(request.config) == 10_000.0
    finally:
        request.config.option.timeout = before
