"""``RayBackend``: the suite's engines as processes supervised by Ray actors spread over ``nodes`` nodes.

It implements ``conformance.backends.Backend``. Each engine is an :class:`gpu.engine.EngineActor` placed by
:func:`gpu.placement.place_engines`, running ``python -m sglang.launch_server ARGS`` (``-m gpu``) or the fake with
the same ARGS (``-m cpu``); the integration talks real HTTP to a :class:`gpu.proxy.RecordingProxy` per engine in
the driver, so every scenario, injected fault and checker runs unchanged. Engine-side truth comes only from what
real SGLang shows: the weights each engine holds, read through ``/get_weights_by_name`` (:mod:`gpu.weights`).

A monitor thread asks every actor for its status while the backend runs. When an actor dies (its node was lost) or
its engine process exits, the backend records a failure naming the engine, its node, what the integration had in
flight with it (from the wire log) and the last log tail it saw, makes that engine's proxy answer 502 with that
reason, and :meth:`RayBackend.stop` raises :class:`EngineFailure` after tearing everything down: a run that broke
fails with the reason, it never passes and never hangs.
"""

from __future__ import annotations

import functools
import os
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

from conformance.backends import digest_of
from conformance.dialect import Dialect
from conformance.families import FAMILIES
from conformance.wire import WireLog
from conformance.wire_control import WireControl
from fakes.profiles import DEFAULT_PROFILE

from .engine import EngineActor, SupervisedEngine
from .families import RealFamily, family_of, real_family
from .launch import FAKE, SGLANG, EngineSpec
from .weights import parameter_specs, raw_digests, served_weights

MONITOR_INTERVAL_S = 0.25
STATUS_TIMEOUT_S = 5.0
UNRESPONSIVE_POLLS = 3
"""Consecutive status calls without an answer after which an engine's actor counts as lost."""


class EngineFailure(RuntimeError):
    """An engine was lost, died or never became healthy; the message says which, where, and what was going on."""


@dataclass
class RayBackendConfig:
    """What the Ray backend starts: ``engines`` engines of ``spec`` over ``nodes`` nodes, running ``program``."""

    spec: EngineSpec
    engines: int = 2
    nodes: int = 2
    program: tuple[str, ...] = SGLANG
    resources_per_engine: Mapping[str, float] = field(default_factory=lambda: {"CPU": 1, "GPU": 1})
    health_timeout_s: float = 600.0
    """Real SGLang loads the model and captures kernels before /health answers: minutes on a cold node."""
    profile: str = DEFAULT_PROFILE
    """The SGLang release the engines are (a label on real SGLang; the fake is told with its own flag)."""
    env: Mapping[str, str] = field(default_factory=dict)
    """Extra environment for the engine processes."""
    python: str | None = None
    """The interpreter that runs ``program`` on every node (a real-SGLang environment's); None: the suite's own."""
    digest_timeout_s: float = 60.0
    model_files: Mapping[str, bytes] | None = None
    """The served model's files, written at ``spec.model_path`` on every engine's node where that path is missing
    (the built tiny model; a user's own model must already be at that path on every node)."""
    engine_host: str | None = None
    """The address engines bind; None: each node's IP as Ray reports it (simulated nodes share 127.0.0.1)."""
    sentinel_tokens: int = 2048
    """Decode budget of the suite's long-lived requests: they must outlive an update cycle and still end on their
    own (a real engine's decode speed is not known in advance; the tiny model's context holds 4096 tokens)."""


def fake_config(model_path: str | Path, *, engines: int = 2, nodes: int = 2,
                profile: str = DEFAULT_PROFILE,
                tokens_per_second: float = 2000.0, enable_lora: bool = True, seed: int = 0,
                health_timeout_s: float = 30.0, sentinel_seconds: float = 3.0) -> RayBackendConfig:
    """The CPU variant: the fake in each actor, same ARGS, on logical CPUs only."""
    spec = EngineSpec(model_path=str(model_path), enable_lora=enable_lora, random_seed=seed,
                      fake_args=("--fake-profile", profile, "--fake-tokens-per-second", str(tokens_per_second)))
    return RayBackendConfig(spec, engines=engines, nodes=nodes, program=FAKE, resources_per_engine={"CPU": 1},
                            health_timeout_s=health_timeout_s, profile=profile, engine_host="127.0.0.1",
                            sentinel_tokens=int(sentinel_seconds * tokens_per_second))


@functools.lru_cache(maxsize=4)
def _checkpoint(model_path: str, mtime_ns: int) -> tuple[dict[str, Any], dict[str, tuple[str, tuple[int, ...]]]]:
    weights = served_weights(Path(model_path))
    return weights, parameter_specs(weights)


def checkpoint(model_path: str) -> tuple[dict[str, Any], dict[str, tuple[str, tuple[int, ...]]]]:
    """The weights an engine serving ``model_path`` holds at start, and their (dtype, shape); read once per version
    of the model directory."""
    return _checkpoint(model_path, os.stat(model_path).st_mtime_ns)


KEEP_TIMEOUT_S = 10.0
"""How long an engine may take to answer the suite's keep-pause or its resume."""


class RayBackend:
    """Engines as processes in Ray actors over distinct nodes, each behind a recording proxy in the driver.

    The driver must be connected to Ray (:func:`gpu.cluster.connect` or :func:`gpu.cluster.local_cluster`)."""

    name = "ray"

    def __init__(self, config: RayBackendConfig) -> None:
        self.config = config
        self.profile = config.profile
        self.sentinel_tokens = config.sentinel_tokens
        self.wire = WireLog()
        self.control = self._control()
        self.urls: list[str] = []
        self.placement: Any = None
        self.engines: list[SupervisedEngine] = []
        """Every engine started, in index order."""
        self._t0 = time.monotonic()
        self._stopping = threading.Event()
        self._monitor: threading.Thread | None = None
        self._lock = threading.Lock()
        self.readable: frozenset[str] = frozenset()
        """vLLM: the checkpoint's parameters its weight checker shows (the others are fused or, on CPU, empty)."""

    # -- Backend -------------------------------------------------------------------------------------------

    @property
    def family(self) -> str:
        """The engine family the program starts (``sglang`` or ``vllm``)."""
        return family_of(self.config.program)

    @property
    def dialect(self) -> Dialect:
        """How the engines' wire maps to the suite's vocabulary (:mod:`conformance.dialect`)."""
        return FAMILIES[self.family].dialect

    @property
    def real(self) -> RealFamily:
        """The real-engines row of the family the program starts (:mod:`gpu.families`)."""
        return real_family(self.config.program)

    @property
    def served_model(self) -> str:
        """The directory the engines were started on (``History.served_model``)."""
        return self.config.spec.model_path

    def start(self) -> None:
        from .proxy import RecordingProxy

        self._t0 = time.monotonic()
        try:
            self._launch()
            for e in self.engines:
                e.proxy = RecordingProxy(e.info["url"], e.index, self.wire, self.control, self.dialect,
                                         on_unreachable=functools.partial(self._unreachable, e)).start()
            self.urls = [e.proxy.url for e in self.engines]
            if not self.real.shows_all_weights:
                self.readable = frozenset(self.digests()[0])
        except BaseException:
            self._teardown()
            raise
        self._monitor = threading.Thread(target=self._watch, name=f"{self.name}-backend-monitor", daemon=True)
        self._monitor.start()

    def rewire(self) -> None:
        """A fresh wire log and fresh proxies over the same running engines: the next scenario on shared engines
        (:mod:`gpu.pool`) records only its own calls."""
        from .proxy import RecordingProxy

        with self._lock:
            self.wire = WireLog()
            self.control = self._control()
        for e in self.engines:
            if e.proxy is not None:
                e.proxy.stop()
            e.unreachable = None
            e.proxy = RecordingProxy(e.info["url"], e.index, self.wire, self.control, self.dialect,
                                     on_unreachable=functools.partial(self._unreachable, e)).start()
        self.urls = [e.proxy.url for e in self.engines]

    def _control(self) -> WireControl:
        """The wire's control, with the family's keep-pause where it has one (``WireControl.keep_engines``)."""
        control = self.wire.control()
        if self.real.keep_pause is not None:
            control.keep_engines = self._keep
        return control

    def _keep(self, on: bool) -> None:
        """Pause every engine in its own keep mode (``on``) or resume it, past the wire; raise if one did not
        answer 200."""
        import httpx

        path = self.real.keep_pause[0 if on else 1]  # type: ignore[index]
        with httpx.Client(timeout=KEEP_TIMEOUT_S) as client:
            answers = [client.post(url + path) for url in self.engine_urls()]
        refused = [f"engine {i}: {a.status_code} {a.text[:120]}" for i, a in enumerate(answers)
                   if a.status_code != 200]
        if refused:
            raise RuntimeError(f"POST {path}: " + "; ".join(refused))

    def engine_urls(self) -> list[str]:
        """The engines' own addresses (not the proxies'): for the suite's calls that bypass the wire."""
        return [e.url for e in self.engines]

    # -- how engines are launched, asked and stopped (Ray actors here; local processes in gpu.local) ------------

    def _launch(self) -> None:
        """Start every engine (``self.engines`` filled first, so a failure tears down what started); raise
        :class:`EngineFailure` naming each engine that did not become healthy."""
        import ray

        from .placement import place_engines

        c = self.config
        self.placement = place_engines(c.engines, c.nodes, c.resources_per_engine)
        actor_cls = ray.remote(EngineActor)
        files = ray.put(dict(c.model_files)) if c.model_files else None
        resources = dict(c.resources_per_engine)
        for i in range(c.engines):
            actor = actor_cls.options(num_cpus=resources.get("CPU", 0), num_gpus=resources.get("GPU", 0),
                                      scheduling_strategy=self.placement.strategy(i), max_restarts=0,
                                      ).remote(c.spec, c.program, dict(c.env), f"engine-{i}", c.engine_host, files,
                                               c.python)
            self.engines.append(SupervisedEngine(i, actor))
        starts = [e.handle.start.remote(c.health_timeout_s) for e in self.engines]
        errors = []
        for engine, ref in zip(self.engines, starts):
            try:
                engine.info = ray.get(ref, timeout=c.health_timeout_s + 60.0)
                engine.last_status, engine.last_status_t = {"log_tail": engine.info["log_tail"]}, self._since()
            except Exception as exc:  # the actor's EngineStartError, or its death
                errors.append(f"engine {engine.index} did not start: {_cause(exc)}")
        if errors:
            raise EngineFailure("\n".join(errors))

    def _statuses(self, live: list[SupervisedEngine]) -> dict[int, dict[str, Any] | str | None]:
        """Each engine's status; a string says why it is lost, None that it did not answer in time."""
        import ray

        refs = {e.index: e.handle.status.remote() for e in live}
        out: dict[int, dict[str, Any] | str | None] = {}
        for e in live:
            try:
                out[e.index] = ray.get(refs[e.index], timeout=STATUS_TIMEOUT_S)
            except ray.exceptions.GetTimeoutError:
                out[e.index] = None
            except ray.exceptions.RayActorError as exc:
                out[e.index] = (f"its actor died ({type(exc).__name__}): the node was lost or the actor was killed "
                                f"({_first_line(exc)})")
        return out

    def _stop_engines(self) -> None:
        import ray

        stops = [(e, e.handle.stop.remote()) for e in self.engines if e.failure is None]
        for e, ref in stops:
            try:
                ray.get(ref, timeout=30.0)
            except Exception:  # already gone: killing the actor below ends its process (death signal)
                pass
        for e in self.engines:
            ray.kill(e.handle, no_restart=True)
        if self.placement is not None:
            self.placement.remove()
            self.placement = None

    def stop(self) -> None:
        """Tear everything down; then raise :class:`EngineFailure` if an engine failed while the backend ran."""
        self._teardown()
        failures = [e.failure for e in self.engines if e.failure]
        if failures:
            raise EngineFailure("\n\n".join(failures))

    def initial_weights(self) -> Mapping[str, Any]:
        return dict(checkpoint(self.config.spec.model_path)[0])

    def digests(self) -> list[dict[str, str]]:
        """Per engine, the digest of every parameter it holds: SGLang's ``/get_weights_by_name`` of each; vLLM's
        weight checker, of the parameters it shows as the checkpoint names them (:func:`gpu.weights.checkpoint_view`;
        {} for an engine left without weights)."""
        params = checkpoint(self.config.spec.model_path)[1]
        return self.real.read_digests([e.info["url"] for e in self.engines], params, self.config.digest_timeout_s)

    def digest_of(self, weights: Mapping[str, Any]) -> dict[str, str]:
        """The trainer's ``weights`` digested as :meth:`digests` shows an engine's (on vLLM, only the parameters it
        shows: read from engine 0 at start)."""
        if self.real.shows_all_weights:
            return digest_of(weights)
        return raw_digests(weights, self.readable, checkpoint(self.config.spec.model_path)[1])

    def truth(self) -> dict[str, Any]:
        """Where each engine ran (the report draws one lane group per node)."""
        return {"nodes": self.engine_nodes()}

    # -- what the backend knows about its engines -------------------------------------------------------------

    def engine_nodes(self) -> list[str]:
        """Each engine's node id as its actor reported it from Ray's runtime context."""
        return [e.info["node_id"] for e in self.engines]

    def engine_info(self) -> list[dict[str, Any]]:
        return [dict(e.info) for e in self.engines]

    def failures(self) -> list[str]:
        """Every engine failure recorded so far, after asking each engine once more (an engine that died a moment
        ago is named as such, not found later as unreachable)."""
        if not self._stopping.is_set():
            self._poll(patience=UNRESPONSIVE_POLLS)
        with self._lock:
            return [e.failure for e in self.engines if e.failure]

    # -- supervision ----------------------------------------------------------------------------------------

    def _watch(self) -> None:
        while not self._stopping.wait(MONITOR_INTERVAL_S):
            self._poll(patience=UNRESPONSIVE_POLLS)

    def _poll(self, patience: int) -> None:
        """Ask every engine not yet failed for its status; record a failure for an actor that died, one that
        answered no status call ``patience`` times in a row, and an engine process that exited."""
        live = [e for e in self.engines if e.failure is None]
        statuses = self._statuses(live)
        for e in live:
            status = statuses[e.index]
            if status is None:
                e.unanswered += 1
                if e.unanswered >= patience:
                    self._fail(e, f"its actor answered no status call for {e.unanswered * STATUS_TIMEOUT_S:.0f}s")
                continue
            if isinstance(status, str):
                self._fail(e, status)
                continue
            e.unanswered, e.last_status, e.last_status_t = 0, status, self._since()
            if status["returncode"] is not None:
                self._fail(e, f"its server process exited with code {status['returncode']}")

    def _since(self) -> float:
        """Seconds since the backend started."""
        return time.monotonic() - self._t0

    def _unreachable(self, e: SupervisedEngine, error: str) -> None:
        with self._lock:
            if e.unreachable is None:
                e.unreachable = (f"It stopped answering at t={self._since():.2f}s ({error}), while the "
                                 f"integration was doing: {self._activity(e.index)}\n")

    def _fail(self, e: SupervisedEngine, what: str) -> None:
        with self._lock:
            if e.failure is not None:
                return
            when = self._since()
            e.failure = (f"engine {e.index} (node {e.info.get('node_id', '?')} at {e.info.get('node_ip', '?')}, "
                         f"server {e.info.get('url', '?')}, pid {e.info.get('pid', '?')}) failed at "
                         f"t={when:.2f}s: {what}.\n{e.unreachable or ''}"
                         f"At the failure the integration was doing: {self._activity(e.index)}\n"
                         f"Engine log as of t={e.last_status_t or 0:.2f}s:\n{e.last_status.get('log_tail', '(none)')}")
        if e.proxy is not None:
            e.proxy.proxy.fail(e.failure.splitlines()[0])

    def _activity(self, engine: int) -> str:
        """The calls the integration had open with ``engine`` and the last one it completed (from the wire)."""
        now = time.monotonic()
        calls = [c for c in self.wire.snapshot() if c.engine == engine]
        ages: dict[str, list[float]] = {}
        for c in calls:
            if c.t_end is None:
                ages.setdefault(f"{c.method} {c.path}", []).append(now - c.t_start)
        open_calls = [f"{k} (open {v[0]:.2f}s)" if len(v) == 1 else f"{len(v)} x {k} (oldest open {max(v):.2f}s)"
                      for k, v in ages.items()]
        done = [c for c in calls if c.t_end is not None]
        last = (f"last completed: {done[-1].method} {done[-1].path} -> {done[-1].status}" if done
                else "no call completed")
        return (", ".join(open_calls) or "nothing in flight") + f"; {last}"

    def _teardown(self) -> None:
        self._stopping.set()
        if self._monitor is not None:
            self._monitor.join()
            self._monitor = None
            self._poll(patience=1)  # what happened since the last poll counts too (nothing is stopped yet)
            for e in self.engines:
                if e.failure is None and e.unreachable is not None:  # Ray may not know yet; the integration did
                    self._fail(e, "the proxy could not reach it while the backend ran")
        for e in self.engines:
            if e.proxy is not None:
                e.proxy.stop()
        self._stop_engines()
        self.urls = []


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__


def _cause(exc: BaseException) -> str:
    """The message of an actor's exception without Ray's traceback wrapping."""
    cause = getattr(exc, "cause", None)
    return str(cause) if cause is not None else f"{type(exc).__name__}: {exc}"
