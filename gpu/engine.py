"""One engine server process, launched and supervised on the machine it runs on (inside a Ray actor, or directly).

:class:`EngineProcess` picks a free port on its host, starts ``python PROGRAM ARGS`` (:mod:`gpu.launch`) with its
output in a log file, waits for ``GET /health`` to answer 200 within a deadline (failing early, with the log's
tail, when the process exits first), and always tears the whole process group down. The process also dies with
its parent (``PR_SET_PDEATHSIG``, Linux): when the Ray actor holding it dies, or its node's processes are killed,
no engine is left behind. :class:`EngineActor` is the same object as a Ray actor (``ray.remote(EngineActor)``).
:class:`SupervisedEngine` is one engine as a backend supervises it, however it runs (:mod:`gpu.backend`,
:mod:`gpu.local`; :mod:`gpu.pool` resets it between scenarios).
"""

from __future__ import annotations

import ctypes
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from .families import launch_command
from .launch import SGLANG, EngineSpec

LOG_TAIL_BYTES = 4000
STOP_TIMEOUT_S = 10.0
EXIT_WAIT_S = 60.0
"""How long a server that is expected to end (its engine died) is given to exit (:meth:`EngineProcess.exits_within`):
SGLang's launcher tears its processes down, vLLM shuts its API server down (at once or at its watchdog's look)."""


@dataclass
class SupervisedEngine:
    """One engine of a backend: how it runs (``handle``: an :class:`EngineProcess` here, or the Ray actor of an
    :class:`EngineActor`), where it serves, what the backend last heard from it and why it failed."""

    index: int
    handle: Any
    info: dict[str, Any] = field(default_factory=dict)
    """What its start answered: ``url``, ``node_id``, ``node_ip``, ``pid``, ``log``, ``log_tail``."""
    proxy: Any = None
    """The recording proxy (:class:`gpu.proxy.RecordingProxy`) the integration talks to."""
    last_status: dict[str, Any] = field(default_factory=dict)
    last_status_t: float | None = None
    unanswered: int = 0
    failure: str | None = None
    unreachable: str | None = None
    """When the proxy first could not reach the engine, and what the integration was doing then."""

    @property
    def url(self) -> str:
        """The engine's own address (not its proxy's)."""
        return self.info["url"]


class EngineStartError(RuntimeError):
    """The engine did not become healthy; the message carries its command line and the tail of its log."""


def ephemeral_ports() -> range:
    """The ports the OS hands out for port-0 binds and outgoing connections (Linux; 32768-60999 by default)."""
    try:
        low, high = map(int, Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split())
    except (OSError, ValueError):
        low, high = 32768, 60999
    return range(low, high + 1)


def free_port(host: str) -> int:
    """A TCP port free on ``host`` right now, outside the OS's ephemeral range: between this check and the engine's
    own bind, no port-0 bind or outgoing connection of another process (a proxy, another engine) can take it."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    ephemeral = ephemeral_ports()
    candidates = range(10000, ephemeral.start) if ephemeral.start > 11000 else range(ephemeral.stop, 65536)
    rng = random.SystemRandom()
    for _ in range(200):
        port = rng.choice(candidates)
        with socket.socket(family, socket.SOCK_STREAM) as sock:
            try:
                sock.bind((host, port))
            except OSError:
                continue
            return port
    with socket.socket(family, socket.SOCK_STREAM) as sock:  # a crowded machine: let the OS pick
        sock.bind((host, 0))
        return sock.getsockname()[1]


def url_of(host: str, port: int) -> str:
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


_PR_SET_PDEATHSIG = 1
_LIBC: Any = None
if sys.platform.startswith("linux"):
    try:
        _LIBC = ctypes.CDLL("libc.so.6", use_errno=True)
    except OSError:
        _LIBC = None


def _die_with_parent(parent: int) -> Any:
    """A ``preexec_fn``: SIGKILL this child when the thread that forked it dies (Linux), and never outlive a parent
    that died before the flag was set."""
    def arm() -> None:
        if _LIBC is not None:
            _LIBC.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
        if os.getppid() != parent:
            os._exit(1)
    return arm


class EngineProcess:
    """Launches and supervises one engine server process (``program`` plus :func:`gpu.launch.launch_args`)."""

    def __init__(self, spec: EngineSpec | None, program: Sequence[str] = SGLANG, host: str = "127.0.0.1",
                 env: Mapping[str, str] | None = None, log_dir: str | None = None, name: str = "engine",
                 python: str | None = None, args: Callable[[str, int], list[str]] | None = None) -> None:
        if spec is None and args is None:
            raise ValueError("EngineProcess needs a spec (an SGLang launch line) or args (any other engine's)")
        self.spec, self.program, self.host, self.name = spec, tuple(program), host, name
        self.args = args
        """The program's arguments for ``(host, port)`` when the engine is not started from an SGLang
        :class:`~gpu.launch.EngineSpec` (a vLLM server)."""
        self.python = python or sys.executable
        """The interpreter that runs ``program`` (a real-SGLang environment's; default: this one)."""
        self.env = {**os.environ, **(env or {}), "PYTHONUNBUFFERED": "1"}
        self.log_path = Path(tempfile.mkdtemp(prefix=f"weightsync-{name}-", dir=log_dir)) / "engine.log"
        self.process: subprocess.Popen | None = None
        self.url = ""
        self.command: list[str] = []

    def start(self, health_timeout_s: float) -> str:
        """Launch and wait until ``/health`` answers 200; the engine's URL. Raises :class:`EngineStartError` (the
        process torn down) when it exits first or is not healthy by the deadline."""
        self.launch()
        return self.wait_healthy(health_timeout_s)

    def launch(self) -> None:
        """Start the process (it dies with the *thread* that calls this: call it from one that outlives it)."""
        if self.process is not None:
            raise RuntimeError(f"{self.name} is already started")
        port = free_port(self.host)
        self.url = url_of(self.host, port)
        self.command = ([self.python, *self.program, *self.args(self.host, port)] if self.args is not None
                        else launch_command(self.spec, self.host, port, self.program, self.python))
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen(self.command, stdin=subprocess.DEVNULL, stdout=log,
                                            stderr=subprocess.STDOUT, env=self.env, start_new_session=True,
                                            preexec_fn=_die_with_parent(os.getpid()))

    def wait_healthy(self, health_timeout_s: float) -> str:
        """After :meth:`launch`: wait until ``/health`` answers 200 (any thread); the URL, or
        :class:`EngineStartError` with the process torn down."""
        try:
            self._wait_healthy(health_timeout_s)
        except EngineStartError:
            self.stop()
            raise
        return self.url

    def _wait_healthy(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        last = "no answer yet"
        while True:
            code = self.process.poll()
            if code is not None:
                raise EngineStartError(f"{self.name} exited with code {code} before /health answered 200 "
                                       f"({self.describe()})\n{self.log_tail()}")
            try:
                with urllib.request.urlopen(self.url + "/health", timeout=2.0) as r:
                    if r.status == 200 and self.process.poll() is None:
                        return
                    last = f"HTTP {r.status}"
            except urllib.error.HTTPError as exc:
                last = f"HTTP {exc.code}"
            except (OSError, urllib.error.URLError) as exc:
                last = f"{type(exc).__name__}: {getattr(exc, 'reason', exc)}"
            if time.monotonic() > deadline:
                raise EngineStartError(f"{self.name} did not answer 200 on /health within {timeout_s:.0f}s "
                                       f"(last: {last}; {self.describe()})\n{self.log_tail()}")
            try:  # the pause between probes ends early when the process exits
                self.process.wait(0.1)
            except subprocess.TimeoutExpired:
                pass

    def describe(self) -> str:
        pid = self.process.pid if self.process is not None else None
        return f"pid {pid}, {self.url}, log {self.log_path}, command: {' '.join(self.command)}"

    def log_tail(self, nbytes: int = LOG_TAIL_BYTES) -> str:
        """The end of the engine's log (stdout and stderr)."""
        try:
            with open(self.log_path, "rb") as f:
                f.seek(max(0, f.seek(0, os.SEEK_END) - nbytes))
                text = f.read().decode("utf-8", "replace")
        except OSError as exc:
            return f"(log unreadable: {exc})"
        return "--- engine log tail ---\n" + (text if text.strip() else "(empty)")

    def status(self) -> dict[str, Any]:
        """``returncode`` (None while running), ``pid``, ``url`` and ``log_tail``."""
        code = None if self.process is None else self.process.poll()
        return {"returncode": code, "pid": None if self.process is None else self.process.pid, "url": self.url,
                "log_tail": self.log_tail()}

    def exits_within(self, wait_s: float) -> bool:
        """Whether the engine's process exited within ``wait_s`` seconds (0: whether it already had)."""
        try:
            self.process.wait(wait_s)
        except subprocess.TimeoutExpired:
            return False
        return True

    def stop(self, timeout_s: float = STOP_TIMEOUT_S) -> int | None:
        """SIGTERM the engine's process group, SIGKILL it after ``timeout_s``; the exit code. Idempotent."""
        proc = self.process
        if proc is None:
            return None
        if proc.poll() is None:
            _signal_group(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                pass
        _signal_group(proc.pid, signal.SIGKILL)  # what the engine itself spawned goes too
        if proc.poll() is None:
            proc.wait(5.0)
        return proc.returncode


def exit_on_sigterm() -> None:
    """Make a SIGTERM (``timeout``, a CI runner) end this process as ``SystemExit`` does, so that every engine's
    :meth:`EngineProcess.stop` in a ``finally`` runs. Killed outright, the runner leaves what an engine spawned:
    vLLM's ``EngineCore`` and worker outlived a timed-out differential by 55 minutes, a third of a core busy."""
    def leave(signum: int, _frame: Any) -> None:
        raise SystemExit(128 + signum)
    signal.signal(signal.SIGTERM, leave)


def _signal_group(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def materialize(path: str, files: Mapping[str, bytes]) -> bool:
    """Write ``files`` (name → bytes) as the directory ``path`` unless it already exists there; True when written.
    Written beside it and renamed into place, so a reader never sees half a model."""
    target = Path(path)
    if target.exists():
        return False
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
    for name, data in files.items():
        (staging / name).write_bytes(data)
    try:
        os.rename(staging, target)
    except OSError:  # another engine on this node was first
        shutil.rmtree(staging, ignore_errors=True)
        return False
    return True


class EngineActor:
    """The engine process as a Ray actor (create with ``ray.remote(EngineActor).options(...)``): ``start`` answers
    where it runs in Ray's own terms (node id and IP), so placement is checked from Ray's view. The engine binds
    ``host``, by default the node's IP as Ray knows it. With ``model_files`` the served model is written at
    ``spec.model_path`` on this node first, unless it is there already (the same path on every node: same ARGS)."""

    def __init__(self, spec: EngineSpec, program: Sequence[str], env: Mapping[str, str] | None, name: str,
                 host: str | None = None, model_files: Mapping[str, bytes] | None = None,
                 python: str | None = None) -> None:
        import ray

        self.node_id = ray.get_runtime_context().get_node_id()
        self.node_ip = ray.util.get_node_ip_address()
        if model_files:
            materialize(spec.model_path, model_files)
        self.engine = EngineProcess(spec, program, host=host or self.node_ip, env=env, name=name, python=python)

    def start(self, health_timeout_s: float) -> dict[str, Any]:
        url = self.engine.start(health_timeout_s)
        return {"url": url, "node_id": self.node_id, "node_ip": self.node_ip, "pid": self.engine.process.pid,
                "log": str(self.engine.log_path), "log_tail": self.engine.log_tail(), "actor_pid": os.getpid()}

    def status(self) -> dict[str, Any]:
        return self.engine.status()

    def stop(self) -> int | None:
        return self.engine.stop()
