"""`python -m fakes`: engines + router in one process, URLs on stdout, clean exit 0 on SIGTERM/SIGINT."""

from __future__ import annotations

import errno
import os
import queue
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from urllib.parse import urlsplit

import pytest

pytestmark = pytest.mark.cpu
import requests

REPO = Path(__file__).resolve().parents[2]
START_TIMEOUT = 20.0
STOP_TIMEOUT = 10.0


class Cli:
    """A running `python -m fakes ...`: `.urls` once printed, `.stop(sig)` -> exit code (bounded)."""

    def __init__(self, *args: str) -> None:
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p))
        self.proc = subprocess.Popen([sys.executable, "-m", "fakes", *args], cwd=REPO, env=env, text=True,
                                     stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        self.lines: queue.Queue[str | None] = queue.Queue()
        self.stderr: list[str] = []
        threading.Thread(target=self._pump_stdout, daemon=True).start()
        threading.Thread(target=lambda: self.stderr.extend(iter(self.proc.stderr.readline, "")), daemon=True).start()

    def _pump_stdout(self) -> None:
        for line in iter(self.proc.stdout.readline, ""):
            self.lines.put(line.strip())
        self.lines.put(None)

    def read_urls(self, n: int) -> list[str]:
        urls = []
        while len(urls) < n:
            try:
                line = self.lines.get(timeout=START_TIMEOUT)
            except queue.Empty:
                raise AssertionError(f"no URL within {START_TIMEOUT} s; stderr: {''.join(self.stderr)}") from None
            assert line is not None, f"exited {self.proc.poll()} early; stderr: {''.join(self.stderr)}"
            urls.append(line)
        return urls

    def stop(self, sig: int = signal.SIGTERM) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        try:
            return self.proc.wait(STOP_TIMEOUT)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
                self.proc.wait(5)


@pytest.fixture
def cli_factory() -> Iterator[type[Cli]]:
    started: list[Cli] = []

    def make(*args: str) -> Cli:
        cli = Cli(*args)
        started.append(cli)
        return cli

    yield make  # type: ignore[misc]
    for cli in started:
        cli.stop(signal.SIGKILL)


@pytest.mark.slow  # a second Python process
def test_two_engines_and_a_router_then_sigterm_exits_zero(cli_factory) -> None:
    cli = cli_factory("--engines", "2", "--router", "--tokens-per-second", "5000", "--weight-version", "v0")
    urls = cli.read_urls(3)
    engines, router = urls[:2], urls[2]
    assert all(u.startswith("http://127.0.0.1:") for u in urls) and len(set(urls)) == 3
    for url in engines:
        info = requests.get(url + "/model_info", timeout=10).json()
        assert info["weight_version"] == "v0"
    resp = requests.post(router + "/generate", json={"text": "hi", "sampling_params": {"max_new_tokens": 4}},
                         timeout=10)
    assert resp.status_code == 200 and resp.json()["meta_info"]["finish_reason"]["type"] == "length"
    listed = sorted(w["url"] for w in requests.get(router + "/workers", timeout=10).json()["workers"])
    assert listed == sorted(engines)
    assert requests.post(router + "/update_weight_version", json={"new_version": "1"}, timeout=10).status_code == 404
    assert cli.stop(signal.SIGTERM) == 0, "".join(cli.stderr)
    assert "Traceback" not in "".join(cli.stderr)


@pytest.mark.slow  # a second Python process
def test_profile_lora_faults_and_sigint(cli_factory) -> None:
    cli = cli_factory("--engines", "1", "--profile", "0.5.4", "--enable-lora", "--max-running-requests", "4",
                      "--seed", "3", "--faults", '[{"endpoint": "/flush_cache", "kind": "flush_fail", "times": 1}]')
    (url,) = cli.read_urls(1)
    assert requests.post(url + "/flush_cache", timeout=10).status_code == 400  # the injected flush failure
    assert requests.post(url + "/flush_cache", timeout=10).status_code == 200
    assert requests.get(url + "/model_info", timeout=10).status_code == 404  # 0.5.4 has /get_model_info only
    assert requests.get(url + "/get_model_info", timeout=10).json()["weight_version"] == "default"
    resp = requests.post(url + "/load_lora_adapter", json={"lora_name": "a", "lora_path": "/nonexistent"}, timeout=10)
    assert "not enabled" not in resp.text
    assert cli.stop(signal.SIGINT) == 0, "".join(cli.stderr)


def _consecutive_free_ports(n: int) -> int:
    for _ in range(20):
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            base = probe.getsockname()[1]
        held = []
        try:
            for port in range(base, base + n):
                sock = socket.socket()
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                sock.bind(("127.0.0.1", port))
                held.append(sock)
            return base
        except OSError:
            continue
        finally:
            for sock in held:
                sock.close()
    pytest.skip("no run of free consecutive ports")


@pytest.mark.slow  # a second Python process
def test_fixed_base_port(cli_factory) -> None:
    base = _consecutive_free_ports(2)
    cli = cli_factory("--engines", "1", "--router", "--port", str(base))
    assert cli.read_urls(2) == [f"http://127.0.0.1:{base}", f"http://127.0.0.1:{base + 1}"]
    assert cli.stop() == 0


@pytest.mark.slow  # a second Python process
def test_help_documents_every_option() -> None:
    out = subprocess.run([sys.executable, "-m", "fakes", "--help"], cwd=REPO, capture_output=True, text=True,
                         timeout=30, env=dict(os.environ, PYTHONPATH=str(REPO)))
    assert out.returncode == 0
    for option in ("--engines", "--router", "--profile", "--tokens-per-second", "--max-running-requests",
                   "--enable-lora", "--port", "--seed", "--host", "--faults", "--router-flavor", "--weight-version",
                   "--model-path", "--dtype", "--strict-weights"):
        assert option in out.stdout, option


@pytest.mark.slow  # a second Python process
def test_bad_arguments_fail_fast() -> None:
    out = subprocess.run([sys.executable, "-m", "fakes", "--profile", "9.9.9"], cwd=REPO, capture_output=True,
                         text=True, timeout=30, env=dict(os.environ, PYTHONPATH=str(REPO)))
    assert out.returncode == 2 and "invalid choice" in out.stderr


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--faults", '[{"bad": 1}]'], "--faults: not a valid fault plan (fault 0: unknown field(s) 'bad'"),
        (["--faults", "{"], "--faults: not a valid fault plan"),
        (["--faults", '[{"endpoint": "/x", "kind": "latency", "latency_s": "slow"}]'], "wrong type"),
        (["--faults", '[{"endpoint": "/x", "kind": "boom"}]'], "unknown fault kind 'boom'"),
        (["--engines", "0"], "--engines must be >= 1, got 0"),
        (["--tokens-per-second", "-1"], "--tokens-per-second must be > 0"),
        (["--no-such-option"], "unrecognized arguments: --no-such-option"),
        (["--model-path", "/nonexistent/model"], "--model-path '/nonexistent/model' is not a local directory"),
    ],
)
def test_bad_input_is_a_one_line_usage_error(capsys, argv, message) -> None:
    from fakes.cli import main

    with pytest.raises(SystemExit) as exc:
        main(argv)
    err = capsys.readouterr().err
    assert exc.value.code == 2 and message in err and err.count("\n") == 1 and "Traceback" not in err, err


def test_a_taken_port_is_a_one_line_error(capsys) -> None:
    from fakes.cli import main

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        with pytest.raises(SystemExit) as exc:
            main(["--port", str(taken.getsockname()[1])])
    err = capsys.readouterr().err
    assert exc.value.code == 2 and "cannot serve on 127.0.0.1" in err and err.count("\n") == 1, err


# ----------------------------------------------------------------------------------------- an engine crashes

CRASH_FAULT = '[{"endpoint": "/flush_cache", "kind": "crash", "times": 1}]'


def _until(condition: Callable[[], bool], what: str, timeout: float = STOP_TIMEOUT) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"not within {timeout} s: {what}"
        time.sleep(0.02)  # the poll interval of a condition wait


def _refused(url: str) -> bool:
    """Whether nothing listens on the URL's port any more (a TCP connect is refused)."""
    parts = urlsplit(url)
    with socket.socket() as sock:
        sock.settimeout(2.0)
        return sock.connect_ex((parts.hostname, parts.port)) == errno.ECONNREFUSED


@pytest.mark.slow
def test_one_engine_a_killing_disk_load_gets_no_answer_and_the_process_exits(cli_factory, tmp_path: Path) -> None:
    """SGLang's rollback re-reads the folder that failed: the server dies (measured on real 0.5.10 and 0.5.23)."""
    from fakes.weights import TensorBlob, save_checkpoint, tiny_model

    weights = dict(tiny_model(0))
    weights["lm_head.weight"] = TensorBlob.zeros("float32", (6400, 64))  # does not fit the served model
    save_checkpoint(str(tmp_path), weights)
    cli = cli_factory("--engines", "1", "--profile", "0.5.23")
    (url,) = cli.read_urls(1)
    with pytest.raises(requests.ConnectionError):  # the connection closes: no status line, not a 500
        requests.post(url + "/update_weights_from_disk", json={"model_path": str(tmp_path)}, timeout=STOP_TIMEOUT)
    assert cli.proc.wait(STOP_TIMEOUT) == 1
    _until(lambda: "Scheduler hit an exception" in "".join(cli.stderr), "the crash logged on stderr")
    stderr = "".join(cli.stderr)
    assert f"engine e0 at {url} crashed" in stderr and "rollback" in stderr and "Traceback" not in stderr, stderr


@pytest.mark.slow
def test_two_engines_the_dead_one_stops_listening_the_rest_serve_on(cli_factory) -> None:
    cli = cli_factory("--engines", "2", "--router", "--faults", CRASH_FAULT, "--tokens-per-second", "5000")
    live, dead, router = cli.read_urls(3)
    with requests.Session() as pooled:  # a kept-alive connection to the engine about to die
        assert pooled.get(dead + "/health", timeout=STOP_TIMEOUT).status_code == 200
        with pytest.raises(requests.ConnectionError):  # the killing call: the connection drops, no 500
            requests.post(dead + "/flush_cache", timeout=STOP_TIMEOUT)
        with pytest.raises(requests.ConnectionError):
            pooled.get(dead + "/health", timeout=STOP_TIMEOUT)
    assert _refused(dead)
    assert requests.get(live + "/health", timeout=STOP_TIMEOUT).status_code == 200
    resp = requests.post(live + "/generate", json={"text": "hi", "sampling_params": {"max_new_tokens": 2}},
                         timeout=STOP_TIMEOUT)
    assert resp.status_code == 200, resp.text
    listed = sorted(w["url"] for w in requests.get(router + "/workers", timeout=STOP_TIMEOUT).json()["workers"])
    assert listed == sorted([live, dead]) and cli.proc.poll() is None
    stderr = "".join(cli.stderr)
    assert f"engine e1 at {dead} crashed" in stderr and "injected crash fault on /flush_cache" in stderr, stderr
    assert cli.stop() == 0, "".join(cli.stderr)
    assert "Traceback" not in "".join(cli.stderr)
