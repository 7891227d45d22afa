"""Engines shared across scenarios (``gpu.pool``): a scenario run after a dirty one sees a clean engine, a dirty
engine that cannot be cleaned is detected and replaced (never reused), and no engine process outlives a run or a
run that was killed.

Under ``-m cpu`` the engines are the fake's drop-in for ``sglang.launch_server`` (same flags, another program);
under ``-m sglang`` the same checks run on real SGLang from the release's environment (one engine: another helper
may hold one, and the machine takes two at most)."""

from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from conformance.reference.transports import write_checkpoint_atomic
from conformance.scenarios import Trainer
from gpu.reset import EngineResetError
from gpu.sglang_setup import SglangSetup
from test_engine_process import alive

REPO = Path(__file__).resolve().parents[2]
BACKENDS = [pytest.param("fake", marks=[pytest.mark.cpu, pytest.mark.slow]),
            pytest.param("sglang", marks=[pytest.mark.sglang, pytest.mark.timeout(900)])]


def make_suite(kind: str, engines: int) -> SglangSetup:
    if kind == "fake":
        return SglangSetup.with_fake(engines=engines)
    suite = SglangSetup(engines=engines, release=os.environ.get("WEIGHTSYNC_SGLANG_RELEASE", "0.5.23"))
    reason = suite.skip_reason()
    if reason:
        pytest.skip(reason)
    return suite




def descendants(pids: list[int]) -> list[int]:
    """``pids`` and every process below them (SGLang's scheduler and detokenizer are the launcher's children)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                ppid = int(Path(f"/proc/{entry}/stat").read_text().split(") ")[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(entry))
    out, todo = [], list(pids)
    while todo:
        pid = todo.pop()
        out.append(pid)
        todo += children.get(pid, [])
    return out


def wait_gone(pids: list[int], timeout_s: float = 30.0) -> list[int]:
    deadline = time.monotonic() + timeout_s
    while any(alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    return [p for p in pids if alive(p)]


def dirty(urls: list[str], model: Path, tmp: Path, initial: dict[str, Any], lora: bool) -> None:
    """Through the scenario's proxies (so the wire shows it): other weights from disk, another label, a
    weight-update session left open (0.5.23), an adapter loaded (where LoRA is on), and a long request held by an
    in-place pause."""
    trainer = Trainer(initial, seed=7)
    config = json.loads((model / "config.json").read_text())
    step = write_checkpoint_atomic(tmp, "step-7", trainer.weights(7), config)
    adapter = trainer.lora(7)
    adapter_dir = write_checkpoint_atomic(tmp, "adapter-7", adapter.tensors, adapter.config,
                                          weights_file="adapter_model.safetensors", config_file="adapter_config.json")
    with httpx.Client(timeout=60) as client:
        for url in urls:
            r = client.post(url + "/update_weights_from_disk", json={"model_path": str(step), "flush_cache": True})
            assert r.status_code == 200 and r.json()["success"], r.text
            client.post(url + "/update_weight_version", json={"new_version": "v7", "abort_all_requests": False}
                        ).raise_for_status()
            client.post(url + "/begin_weight_update", json={})  # 404 before 0.5.23
            if lora:
                r = client.post(url + "/load_lora_adapter", json={"lora_name": "dirty", "lora_path": str(adapter_dir)})
                assert r.status_code == 200, r.text
    def hold(url: str) -> None:
        try:
            httpx.post(url + "/generate", timeout=120, json={"input_ids": [1, 2, 3], "sampling_params": {
                "max_new_tokens": 3000, "ignore_eos": True}})
        except httpx.HTTPError:
            pass  # dropped when the proxy stops: the engine aborts it then, or the reset does

    held = [threading.Thread(target=hold, args=(url,), daemon=True) for url in urls]
    for thread in held:
        thread.start()
    with httpx.Client(timeout=60) as client:
        deadline = time.monotonic() + 60
        for url in urls:  # the engine holds the request (it is running) before it is paused
            while client.post(url + "/flush_cache").status_code == 200:
                assert time.monotonic() < deadline, "the long request never reached the engine"
                time.sleep(0.05)
            client.post(url + "/pause_generation", json={"mode": "in_place"}).raise_for_status()


def assert_clean(urls: list[str], initial_digests: dict[str, str], backend: Any) -> None:
    """What a fresh engine shows: the initial label and weights, no adapter, no session open (begin succeeds), not
    paused (a request completes), idle (the cache flushes at once)."""
    with httpx.Client(timeout=60) as client:
        for url in urls:
            assert client.get(url + "/model_info").json()["weight_version"] == "default"
            assert [m["id"] for m in client.get(url + "/v1/models").json()["data"] if m.get("parent")] == []
            r = client.post(url + "/begin_weight_update", json={})
            if r.status_code != 404:
                assert r.status_code == 200, f"a weight-update session was left open: {r.text}"
                client.post(url + "/end_weight_update", json={}).raise_for_status()
            r = client.post(url + "/generate", json={"input_ids": [1, 2, 3],
                                                      "sampling_params": {"max_new_tokens": 2}}, timeout=20)
            assert r.status_code == 200, r.text
            assert client.post(url + "/flush_cache").status_code == 200
    assert all(d == initial_digests for d in backend.digests())


@pytest.mark.parametrize("kind", BACKENDS)
def test_a_scenario_after_a_dirty_one_sees_a_clean_engine(kind: str, tmp_path: Path) -> None:
    suite = make_suite(kind, engines=1)
    try:
        first = suite.backend_factory()()
        first.start()
        model = Path(suite.config().spec.model_path)
        initial = dict(first.initial_weights())
        initial_digests = first.digests()[0]
        pids = first.pool.backend.engine_pids()
        dirty(first.urls, model, tmp_path, initial, lora=suite.lora)
        assert first.digests()[0] != initial_digests  # it was dirty
        first.stop()  # the reset
        second = suite.backend_factory()()
        second.start()
        try:
            assert second.pool.backend.engine_pids() == pids  # the same engines, reused
            assert second.wire.snapshot() == []  # a fresh wire: the dirty scenario's calls are not in it
            assert_clean(second.urls, initial_digests, second)
        finally:
            second.stop()
        stats = suite.pool().stats
        assert (stats.engines_started, stats.resets, stats.discarded) == (1, 2, [])
        engines = descendants(pids)
    finally:
        suite.close()
    assert wait_gone(engines) == [], f"engine processes left after the pool closed: {engines}"


@pytest.mark.parametrize("kind", BACKENDS)
def test_a_dirty_engine_that_cannot_be_cleaned_is_detected_and_replaced(kind: str, tmp_path: Path) -> None:
    suite = make_suite(kind, engines=1)
    try:
        lease = suite.backend_factory()()
        lease.start()
        model = Path(suite.config().spec.model_path)
        old = descendants(lease.pool.backend.engine_pids())
        # the initial checkpoint itself changes under the engine: reloading it cannot bring the initial weights back
        other = Trainer(dict(lease.initial_weights()), seed=3).weights(1)
        from safetensors.torch import save_file

        save_file({n: t.contiguous() for n, t in other.items()}, str(model / "model.safetensors"))
        with pytest.raises(EngineResetError, match="verify the weights: .* parameters differ from the initial"):
            lease.stop()
        assert wait_gone(old) == [], "the engine that could not be reset must be torn down, not kept"
        assert "could not be reset" in suite.pool().stats.discarded[0]
        fresh = suite.backend_factory()()
        fresh.start()  # a new engine set, measured afresh
        try:
            assert set(fresh.pool.backend.engine_pids()).isdisjoint(old)
            assert suite.pool().stats.engines_started == 2
        finally:
            fresh.stop()
    finally:
        suite.close()


RUNNER = """
import sys
from conformance.cases import load_integration, run_one
from gpu.sglang_setup import SglangSetup
suite = SglangSetup.with_fake(engines=1) if sys.argv[1] == "fake" else SglangSetup(engines=1, release=sys.argv[2])
factory = suite.backend_factory()
lease = factory()
lease.start()
print("pids", *lease.pool.backend.engine_pids(), flush=True)
lease.stop()
run_one("steady-disk-retract", load_integration("conformance.reference:integration"), factory)
print("ran", flush=True)
import time
time.sleep(600)  # sleep-ok: killed here, holding its engines
"""


@pytest.mark.parametrize("kind", BACKENDS)
def test_no_engine_process_outlives_a_killed_run(kind: str) -> None:
    """The run is SIGKILLed while it holds its engines (no teardown runs at all); closing is covered above."""
    release = os.environ.get("WEIGHTSYNC_SGLANG_RELEASE", "0.5.23")
    if kind == "sglang":
        make_suite(kind, engines=1)  # skips without the environment
    proc = subprocess.Popen([sys.executable, "-c", RUNNER, kind, release], cwd=REPO, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    lines: queue.Queue[str | None] = queue.Queue()

    def read() -> None:
        for line in proc.stdout:
            lines.put(line.strip())
        lines.put(None)  # the run ended

    threading.Thread(target=read, daemon=True).start()
    seen: list[str] = []
    engines: list[int] = []
    try:
        while not seen or seen[-1] != "ran":
            try:
                line = lines.get(timeout=400)
            except queue.Empty:
                pytest.fail("the run did not get there within 400s:\n" + "\n".join(seen)[-3000:])
            if line is None:
                pytest.fail("the run ended before it held its engines:\n" + "\n".join(seen)[-3000:])
            seen.append(line)
            if line.startswith("pids"):
                engines = descendants([int(p) for p in line.split()[1:]])
        os.kill(proc.pid, signal.SIGKILL)  # no teardown runs: the engines must die with their parent
        proc.wait(60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert engines, "\n".join(seen)[-3000:]
    assert wait_gone(engines) == [], f"engine processes left behind: {engines}"
