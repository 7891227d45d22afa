"""The Ray backend on a simulated 2-node cluster (``ray.cluster_utils.Cluster``), fake engines in the actors.

One cluster for the whole run: every check is a subtest of one test, so pytest-xdist never starts a second cluster
on another worker. The checks go from harmless to destructive; the node-loss check runs last. After the cluster
is gone no engine process is left on the machine.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from conformance import DEFAULT_INTEGRATION
from conformance.cases import load_integration, run_cases, run_one
from gpu.backend import EngineFailure, RayBackend, fake_config
from gpu.cluster import local_cluster
from gpu.placement import PlacementError
from gpu.tiny_model import CPU_TEST_MODEL, write_model

pytestmark = [pytest.mark.cpu, pytest.mark.ray, pytest.mark.slow]
STUB = (str(Path(__file__).with_name("stub_server.py")),)
SCENARIOS = ("steady-disk-retract", "failover", "lora")
ROOT = Path(__file__).resolve().parents[2]


def engine_processes(marker: str) -> list[int]:
    """Live processes whose command line contains ``marker`` (the test's own model directory)."""
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                cmdline = f.read().decode(errors="replace")
            with open(f"/proc/{entry}/stat") as f:
                zombie = f.read().split(") ")[1][0] == "Z"
        except OSError:
            continue
        if marker in cmdline and not zombie and int(entry) != os.getpid():
            pids.append(int(entry))
    return pids


def wait_until(predicate, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, f"timed out after {timeout_s}s waiting for {what}"
        time.sleep(0.05)


@pytest.mark.timeout(600)  # the backend's checks (about 70 s), then the cluster command twice (about 60 s), loaded
def test_the_ray_backend_on_two_simulated_nodes(subtests, tmp_path: Path) -> None:
    import ray

    model = str(write_model(tmp_path / "tiny-model", CPU_TEST_MODEL))
    integration = load_integration(DEFAULT_INTEGRATION)
    t0 = time.monotonic()
    with local_cluster(nodes=2, cpus_per_node=len(SCENARIOS)) as cluster:  # room for the scenarios at once
        print(f"\n2-node Ray cluster started in {time.monotonic() - t0:.1f}s")
        head = ray.get_runtime_context().get_node_id()

        with subtests.test("engines land on distinct worker nodes, as Ray places them"):
            for engines in (4, 2):
                backend = RayBackend(fake_config(model, engines=engines, nodes=2))
                backend.start()
                try:
                    table = ray.util.placement_group_table(backend.placement.group)
                    nodes = backend.engine_nodes()
                    assert len(set(nodes)) == 2 and head not in nodes, nodes
                    assert nodes == [table["bundles_to_node_id"][i % 2] for i in range(engines)]
                finally:
                    if engines == 4:
                        backend.stop()

        with subtests.test("an engine process that dies is reported with its log"):
            try:
                os.kill(backend.engine_info()[1]["pid"], signal.SIGKILL)
                wait_until(backend.failures, 10, "the backend to notice the dead engine")
                (failure,) = backend.failures()
                assert failure.startswith("engine 1 (node ") and "its server process exited with code -9" in failure
                assert "At the failure the integration was doing: nothing in flight" in failure
                assert "--- engine log tail ---" in failure and "ready to roll" in failure
            finally:
                with pytest.raises(EngineFailure, match="engine 1"):
                    backend.stop()

        with subtests.test("a cluster with fewer nodes than asked is a clear error"):
            with pytest.raises(PlacementError, match=r"--conformance-nodes 3: the cluster has 2 live node\(s\) with room"):
                RayBackend(fake_config(model, engines=3, nodes=3)).start()

        with subtests.test(f"conformance cases of {', '.join(SCENARIOS)} pass through the proxies"):
            results = run_cases(integration, lambda: RayBackend(fake_config(model)), seed=0,
                                scenarios=list(SCENARIOS), parallel=len(SCENARIOS))
            for scenario, result in results.items():
                assert result.skipped is None, (scenario, result.skipped)
                failed = [v.explain() for v in result.verdicts.values() if not v.passed]
                assert not failed, f"{scenario}:\n" + "\n".join(failed)
                assert len(result.verdicts) >= 3

        with subtests.test("an engine that cannot start fails the start with its log"):
            t = time.monotonic()
            with pytest.raises(EngineFailure) as info:
                RayBackend(fake_config(str(tmp_path / "no-such-model"))).start()
            assert time.monotonic() - t < 20
            message = str(info.value)
            assert "engine 0 did not start: engine-0 exited with code 2 before /health answered 200" in message
            assert "is not a local directory" in message and "--- engine log tail ---" in message

        with subtests.test("an engine that never becomes healthy fails at its deadline with its log"):
            config = fake_config(model, health_timeout_s=1.0)
            config.program, config.env = STUB, {"STUB_MODE": "never_healthy"}
            with pytest.raises(EngineFailure) as info:
                RayBackend(config).start()
            message = str(info.value)
            assert "did not answer 200 on /health within 1s (last: HTTP 503" in message, message
            assert '"GET /health HTTP/1.1" 503' in message

        with subtests.test("losing a node mid-scenario names the node, the engine and what was going on"):
            backends: list[RayBackend] = []
            removed: list[str] = []

            def factory() -> RayBackend:
                backends.append(RayBackend(fake_config(model)))
                return backends[-1]

            def remove_node_of_engine_1_once_it_answered_a_generate() -> None:
                wait_until(lambda: backends and backends[-1].urls and any(
                    c.engine == 1 and c.path == "/generate" and c.t_end is not None
                    for c in backends[-1].wire.snapshot()), 30, "engine 1's first answer")
                node_id = backends[-1].engine_nodes()[1]
                node = next(n for n in cluster.worker_nodes if n.node_id == node_id)
                removed.append(node_id)
                cluster.remove_node(node, allow_graceful=False)
                # A lost machine loses every process at once; a simulated node's workers only notice their raylet
                # is gone seconds later, so the actor's worker goes now (its engine dies with it).
                with contextlib.suppress(ProcessLookupError):
                    os.kill(backends[-1].engine_info()[1]["actor_pid"], signal.SIGKILL)

            killer = threading.Thread(target=remove_node_of_engine_1_once_it_answered_a_generate, daemon=True)
            killer.start()
            t = time.monotonic()
            result = run_one("steady-disk-retract", integration, factory, seed=0)
            elapsed = time.monotonic() - t
            killer.join(30)
            assert result.history is not None, result.skipped
            failed = [b.message for b in result.history.breaks
                      if "the backend failed when the scenario ended" in b.message]
            assert failed, f"no failure reported; node removed: {removed}, after {elapsed:.1f}s; breaks: " \
                           f"{result.history.breaks}"
            # the engine's death is data: every case of the scenario fails with it, its checkers still judged
            assert all(v.status == "fail" and v.run_broke for v in result.verdicts.values())
            print(f"node loss: the scenario failed {elapsed:.1f}s after it started:\n{failed[0]}")
            message = failed[0]
            assert removed and f"engine 1 (node {removed[0]}" in message
            assert "It stopped answering at t=" in message and any(
                what in message for what in ("its actor died", "answered no status call", "could not reach it"))
            assert "--- engine log tail ---" in message and "ready to roll" in message
            assert elapsed < 40
            wait_until(lambda: not engine_processes(model), 15, "no engine process left after the node loss")
    wait_until(lambda: not engine_processes(model), 15, "no engine process left after the cluster is gone")

    # After this test's cluster is gone (one Ray cluster on the machine at a time): the project's cluster command,
    # as a user runs it, on a simulated 2-node cluster with each family's drop-in fakes.
    for engine in ("sglang", "vllm"):
        with subtests.test(f"pytest -m gpu --nodes 2 --conformance-engine {engine} runs the cases on a simulated "
                           "cluster"):
            report = tmp_path / f"gpu-{engine}.json"
            command = [sys.executable, "-m", "pytest", "-m", "gpu", "--nodes", "2", "--conformance-simulated-cluster",
                       "--conformance-engine", engine, "-k", " or ".join(SCENARIOS), "-p", "no:cacheprovider",
                       "--conformance-report", str(report)]
            env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "PYTEST_ADDOPTS")}
            t0 = time.monotonic()
            run = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
            print(f"{' '.join(command[2:])}: exit {run.returncode} in {time.monotonic() - t0:.1f}s\n"
                  f"{run.stdout[-600:]}")
            assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-2000:]
            cases = json.loads(report.read_text())["cases"]
            assert len(cases) == 59 and {c["status"] for c in cases} == {"pass"}, \
                sorted({(c["case"], c["status"]) for c in cases if c["status"] != "pass"})
            assert {c["backend"] for c in cases} == {"gpu"}
            assert "drop-in fake on a simulated 2-node Ray cluster: 2 engines started" in run.stdout
