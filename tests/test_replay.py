"""The production-scale replay (conformance/replay): virtual time, the reduced replay's costs for the reference
and for the seed-000 bug, determinism, and the command line. The full size is a benchmark
(benchmarks/replay_scale.py)."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import pytest

from conformance.cases import load_integration
from conformance.replay import REDUCED, ReplayConfig, cost_table, replay
from conformance.replay import vtime
from reports import replay as cli

pytestmark = pytest.mark.cpu

MAX_ABORTED_SAMPLE_RATE = 0.01
"""The bound every pause-in-place integration must keep (the GPU suite's ``--max-aborted-rate``)."""
MIN_MIXED_TURNS = 0.05
"""Turns decoding when an update lands finish under the new weights (in place, nothing aborted): the reduced run
puts about a tenth of its trained turns there."""
REFERENCE, BUG = "conformance.reference:integration", "conformance.mutants:version_bump_aborts"
REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def reduced() -> dict[str, tuple]:
    config = ReplayConfig(**REDUCED)
    runs = {spec: replay(load_integration(spec), config) for spec in (REFERENCE, BUG)}
    return {spec: (run, cost_table(run)) for spec, run in runs.items()}


def test_virtual_time_runs_hours_in_milliseconds() -> None:
    async def main() -> float:
        loop = asyncio.get_running_loop()
        await asyncio.gather(*(asyncio.sleep(600 * i) for i in range(13)))  # sleep-ok: virtual time
        with pytest.raises(asyncio.TimeoutError):
            await asyncio.wait_for(asyncio.Event().wait(), 3600)
        await asyncio.to_thread(time.sleep, 0.01)  # executor work takes no virtual time
        return loop.time()

    t0 = time.perf_counter()
    assert vtime.run_virtual(main()) == pytest.approx(7200 + 3600)
    assert time.perf_counter() - t0 < 2


def test_virtual_deadlock_is_reported(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(vtime, "DEADLOCK_S", 0.05)
    with pytest.raises(vtime.VirtualDeadlock, match="deadlock in virtual time"):
        vtime.run_virtual(asyncio.Event().wait())


def test_reference_keeps_in_flight_turns_across_updates(reduced: dict) -> None:
    """The conformance case: the reference's aborted-sample rate stays under the bound and the turns an update lands
    on finish under mixed versions, measured on a run where requests were decoding at every update."""
    run, table = reduced[REFERENCE]
    v = table.values
    assert not run.broke, run.history.breaks
    assert v["simulated"][1] == REDUCED["updates"]
    assert v["decoding_at_update"][1] > 0, "an update landed with nothing decoding: the run shows nothing there"
    assert v["aborted_sample_rate"] <= MAX_ABORTED_SAMPLE_RATE
    assert v["aborts_per_update"][2] == 0
    assert v["mixed_version_turns"] >= MIN_MIXED_TURNS
    assert v["groups_discarded_per_step"][2] == 0
    assert run.verdicts["I1-I2"].status == "pass" and run.verdicts["I3"].status == "pass"


def test_the_seed_bug_fails_the_same_case(reduced: dict) -> None:
    """version_bump_aborts (seed 000) breaks both figures the case asserts, and I1-I2 says why."""
    run, table = reduced[BUG]
    v = table.values
    assert not run.broke, run.history.breaks
    assert v["aborted_sample_rate"] > MAX_ABORTED_SAMPLE_RATE
    assert v["mixed_version_turns"] < MIN_MIXED_TURNS
    at_pause, during, finalize, elsewhere = v["abort_window"]
    assert at_pause == during == elsewhere == 0 and finalize > 0  # at the version bump, after the transfer
    assert v["abort_after_pause_s"][0] >= REDUCED["transfer_s"] - REDUCED["transfer_spread"]
    assert v["groups_discarded_per_step"][0] > 0
    verdict = run.verdicts["I1-I2"]
    assert verdict.status == "fail"
    assert any("/update_weight_version" in w and "abort_all_requests" in w for w in verdict.witness)


_AGAIN = """
import json
from conformance.cases import load_integration
from conformance.replay import REDUCED, ReplayConfig, cost_table, replay
t = cost_table(replay(load_integration({spec!r}), ReplayConfig(**REDUCED)))
print(json.dumps([t.rows(), t.series]))
"""


def test_updates_one_engine_refuses_cost_the_samples_served_on_unpublished_weights() -> None:
    """Every second update the last engine refuses its transfer: the others hold weights nobody published. The
    reference keeps them out of service (0 samples served on them, P8 passes); resuming them serves samples on them
    (counted, P8 fails with the engine named)."""
    config = ReplayConfig(**{**REDUCED, "updates": 4, "refuse_every": 2})
    careful = replay(load_integration(REFERENCE), config)
    assert not careful.broke and [c.ok for c in careful.history.cycles] == [True, False, True, False]
    assert cost_table(careful).values["unpublished_samples"] == 0 and careful.verdicts["P8"].passed
    resumed = replay(load_integration("conformance.mutants:resumes_on_partial_weights"), config)
    assert cost_table(resumed).values["unpublished_samples"] > 0, cost_table(resumed).rows()
    assert resumed.verdicts["P8"].status == "fail" and "engine 0" in resumed.verdicts["P8"].witness[0]


@pytest.mark.slow  # a second Python process
def test_same_seed_same_table(reduced: dict) -> None:
    """Run to run, in another process with another hash seed (sets iterate differently there)."""
    proc = subprocess.run([sys.executable, "-c", _AGAIN.format(spec=BUG)], capture_output=True, text=True,
                          timeout=120, cwd=REPO, env={**os.environ, "PYTHONHASHSEED": "12345"})
    assert proc.returncode == 0, proc.stderr[-2000:]
    rows, series = json.loads(proc.stdout.strip().splitlines()[-1])
    first = reduced[BUG][1]
    assert [tuple(r) for r in rows] == first.rows() and series == first.series
    other = cost_table(replay(load_integration(BUG), replace(ReplayConfig(**REDUCED), seed=1)))
    assert other.series != first.series  # the seed is what decides


def test_command_prints_side_by_side_and_writes_the_report(tmp_path, capsys) -> None:
    out = tmp_path / "out"
    assert cli.main(["--reduced", "--updates", "3", "--vs", BUG, "--out", str(out), "--no-progress"]) == 0
    printed = capsys.readouterr().out
    header = printed.splitlines()[0]
    assert "reference" in header and "version_bump_aborts" in header
    assert "samples ending aborted" in printed and "checkers failing" in printed
    html = (out / "replay.html").read_text()
    assert html.count("<svg") >= 8 and "engine 0" in html and "aborts per update" in html
    data = json.loads((out / "replay.json").read_text())
    assert [i["name"] for i in data["integrations"]] == ["reference", "version_bump_aborts"]
    assert data["integrations"][1]["verdicts"]["I1-I2"] == "fail"


@pytest.mark.parametrize("argv, says", [
    (["--integration", "nope"], "module:attribute"),
    (["--engines", "0"], "engines must be >= 1"),
    (["--transport", "distributed"], "transport must be tensor or disk"),
    (["--profile", "9.9"], "unknown SGLang profile '9.9'"),
    (["--pause-mode", "later"], "pause_mode must be one of"),
])
def test_bad_input_is_one_line(argv, says, capsys) -> None:
    assert cli.main([*argv, "--no-progress"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and says in err[0]


def test_seeded_request_ids_repeat_in_the_replay_and_stay_random_elsewhere() -> None:
    import threading
    import uuid

    from conformance.replay.workload import seeded_uuid4

    def draw(seed: int) -> list[str]:
        with seeded_uuid4(seed):
            return [uuid.uuid4().hex for _ in range(3)]
    assert draw(1) == draw(1) != draw(2)
    other: list[str] = []
    with seeded_uuid4(1):
        thread = threading.Thread(target=lambda: other.append(uuid.uuid4().hex))  # another scenario's thread
        thread.start()
        thread.join()
    assert other[0] not in draw(1)
    assert uuid.uuid4().hex != uuid.uuid4().hex
