"""The engine supervisor without Ray: health wait with a deadline, a clear error with the log, teardown that leaves
no process behind (also when the supervising process dies)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from gpu.engine import EngineProcess, EngineStartError
from gpu.launch import EngineSpec

pytestmark = pytest.mark.cpu
STUB = (str(Path(__file__).with_name("stub_server.py")),)
SPEC = EngineSpec(model_path="/nonexistent/model")


def alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie counts as gone)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ")[1][0] != "Z"
    except FileNotFoundError:
        return False


def wait_gone(pid: int, timeout_s: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while alive(pid):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


@pytest.mark.slow  # a second Python process
def test_a_healthy_engine_is_reachable_and_stops_with_its_process_group() -> None:
    engine = EngineProcess(SPEC, STUB, env={"STUB_MODE": "spawn"})
    url = engine.start(health_timeout_s=10)
    try:
        with urllib.request.urlopen(url + "/health", timeout=2) as r:
            assert r.status == 200
        pid = engine.process.pid
        deadline = time.monotonic() + 5
        while "grandchild pid" not in engine.log_tail():
            assert time.monotonic() < deadline, engine.log_tail()
            time.sleep(0.02)
        grandchild = int(engine.log_tail().split("grandchild pid ")[1].split()[0])
        assert alive(grandchild)
        assert "--model-path /nonexistent/model" in " ".join(engine.command)
    finally:
        engine.stop(timeout_s=5)
    assert wait_gone(pid) and wait_gone(grandchild)
    assert engine.stop() is not None  # idempotent


@pytest.mark.slow  # a second Python process
def test_an_engine_that_exits_fails_at_once_with_its_log() -> None:
    engine = EngineProcess(SPEC, STUB, env={"STUB_MODE": "exit"})
    t0 = time.monotonic()
    with pytest.raises(EngineStartError) as info:
        engine.start(health_timeout_s=30)
    assert time.monotonic() - t0 < 10, "the exit must be noticed long before the health deadline"
    message = str(info.value)
    assert "exited with code 3 before /health answered 200" in message
    assert "cannot load the model (on purpose)" in message, message
    assert "--model-path /nonexistent/model" in message


@pytest.mark.slow  # a second Python process
def test_an_engine_that_never_becomes_healthy_fails_at_the_deadline_with_its_log() -> None:
    engine = EngineProcess(SPEC, STUB, env={"STUB_MODE": "never_healthy"})
    t0 = time.monotonic()
    with pytest.raises(EngineStartError) as info:
        engine.start(health_timeout_s=1.0)
    elapsed = time.monotonic() - t0
    assert 1.0 <= elapsed < 6.0
    message = str(info.value)
    assert "did not answer 200 on /health within 1s (last: HTTP 503" in message
    assert '"GET /health HTTP/1.1" 503' in message, message
    assert wait_gone(engine.process.pid), "the unhealthy engine is torn down"


PARENT = """
import sys
from gpu.engine import EngineProcess
from gpu.launch import EngineSpec
engine = EngineProcess(EngineSpec(model_path="/m"), (sys.argv[1],), env={"STUB_MODE": "healthy"})
engine.start(health_timeout_s=10)
print(engine.process.pid, flush=True)
sys.stdin.read()
"""


@pytest.mark.slow  # a second Python process
def test_the_engine_dies_with_the_process_that_supervises_it() -> None:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(__file__).resolve().parents[2]),
                                                        os.environ.get("PYTHONPATH", "")])}
    parent = subprocess.Popen([sys.executable, "-c", PARENT, STUB[0]], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              text=True, env=env)
    try:
        pid = int(parent.stdout.readline())
        assert alive(pid)
        parent.send_signal(signal.SIGKILL)
        parent.wait(5)
        assert wait_gone(pid), f"engine {pid} outlived its supervisor"
    finally:
        parent.kill()
        parent.wait(5)
        parent.stdin.close()
        parent.stdout.close()


def test_the_model_is_written_once_per_node_and_never_half(tmp_path: Path) -> None:
    from gpu.engine import materialize

    files = {"config.json": b"{}", "model.safetensors": b"\0" * 1000}
    assert materialize(str(tmp_path / "models" / "tiny"), files) is True
    assert {p.name: p.read_bytes() for p in (tmp_path / "models" / "tiny").iterdir()} == files
    assert materialize(str(tmp_path / "models" / "tiny"), {"config.json": b"other"}) is False
    assert (tmp_path / "models" / "tiny" / "config.json").read_bytes() == b"{}"
    assert [p.name for p in (tmp_path / "models").iterdir()] == ["tiny"], "no staging directory left behind"


def test_engine_ports_are_outside_the_range_port_0_binds_draw_from() -> None:
    from gpu.engine import ephemeral_ports, free_port

    ports = {free_port("127.0.0.1") for _ in range(20)}
    assert not ports & set(ephemeral_ports()) and all(1024 < p < 65536 for p in ports)
    assert len(ports) > 10, "drawn at random: concurrent launches do not pick the same port"


RUNNER = """
import sys, threading, time
sys.path[:0] = [{root!r}, {here!r}]
from gpu.engine import EngineProcess, exit_on_sigterm
from gpu.launch import EngineSpec
if {armed}:
    exit_on_sigterm()
engine = EngineProcess(EngineSpec(model_path="/nonexistent/model"), ({stub!r},), env={{"STUB_MODE": "spawn"}})
engine.start(health_timeout_s=10)
try:
    while "grandchild pid" not in engine.log_tail():
        time.sleep(0.02)
    print(engine.log_tail().split("grandchild pid ")[1].split()[0], flush=True)
    threading.Event().wait()
finally:
    engine.stop(timeout_s=5)
"""


@pytest.mark.slow  # a runner process and its engine
@pytest.mark.parametrize("armed", [True, False])
def test_a_runner_stopped_by_sigterm_stops_what_its_engine_spawned(armed: bool) -> None:
    """``exit_on_sigterm``: the ``finally`` that stops the engine runs; unarmed (what ``timeout`` did to the
    differential), the engine's own child outlives the runner."""
    root = str(Path(__file__).resolve().parents[2])
    code = RUNNER.format(root=root, here=str(Path(__file__).parent), armed=armed, stub=STUB[0])
    runner = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    grandchild = int(runner.stdout.readline())
    runner.send_signal(signal.SIGTERM)
    runner.wait(15)
    try:
        fate = "outlived" if armed else "died with"
        assert wait_gone(grandchild) is armed, f"armed={armed}: the engine's child {fate} the runner"
    finally:
        if alive(grandchild):
            os.kill(grandchild, signal.SIGKILL)
