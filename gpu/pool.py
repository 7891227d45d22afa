"""Engines shared across the scenarios of a session, reset between them (real SGLang takes tens of seconds to start).

An :class:`EnginePool` holds one started backend (:class:`gpu.backend.RayBackend` or :class:`gpu.local.LocalBackend`)
and lends it to one scenario at a time through :meth:`EnginePool.lease`, a ``conformance.backends.Backend``:

* ``start()`` starts the engines the first time (and measures what they start with: label, weight digests, decode
  speed), else gives the scenario a fresh wire log and fresh recording proxies over the same engines;
* ``stop()`` resets every engine (:func:`gpu.reset.reset_engine`: requests aborted, sessions, groups and adapters
  closed, the initial checkpoint reloaded and verified by digest, the label restored, the cache flushed). An engine
  that failed while the scenario ran, or that the reset cannot bring back, is never reused: the engines are torn
  down, ``stop()`` raises (so every case of that scenario fails with the reason) and the next lease starts fresh
  ones.

The suite's long-lived requests are sized from the decode speed measured at start (``sentinel_seconds`` of
decoding), not from a guess: real SGLang on 2 CPU cores decodes a few hundred tokens a second, the fake thousands.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import shutil
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, ClassVar, Mapping

from conformance.backends import probe_client, probe_labels
from conformance.dialect import SGLANG_DIALECT, Dialect
from conformance.families import FAMILIES
from conformance.situations.sentinels import SENTINEL_INPUT_IDS
from conformance.wire import WireLog

from .backend import EngineFailure, RayBackend, RayBackendConfig, checkpoint
from .reset import STEP_TIMEOUT_S, EngineResetError, InitialState
from .weights import in_thread

SPEED_PROBE_TOKENS = 256
"""Tokens decoded once at start to measure the engines' speed."""
SPEED_WARMUP_TOKENS = 16
DEADLINE_BASE_TOKENS_PER_S = 1000.0
"""The decode speed the suite's deadlines are sized for (the fake decodes 2000 tokens/s per request; half of it
keeps their margin)."""
MAX_SLOWDOWN = 10.0
"""Beyond this the machine is too loaded for a verdict to mean anything; the deadlines stop growing."""
MIN_SENTINEL_TOKENS = 512
"""A floor for a sentinel's budget: on a machine so loaded that the probe crawled, the cycles crawl too."""


@dataclass
class PoolStats:
    """What the pool cost: engines started (and how long each start took), scenarios lent, resets done."""

    starts: list[float] = field(default_factory=list)
    """Seconds from launch to every engine healthy, per start of the engine set."""
    engines_started: int = 0
    leases: int = 0
    resets: int = 0
    reset_s: list[float] = field(default_factory=list)
    discarded: list[str] = field(default_factory=list)
    """Why an engine set was torn down before the end (an engine failed, or could not be reset)."""
    decode_tokens_per_s: float | None = None

    def lines(self) -> list[str]:
        starts = ", ".join(f"{s:.1f}" for s in self.starts) or "-"
        resets = (f"{self.resets} resets (mean {sum(self.reset_s) / len(self.reset_s):.2f}s)" if self.reset_s
                  else "0 resets")
        speed = f"{self.decode_tokens_per_s:.0f}" if self.decode_tokens_per_s else "?"
        out = [f"{self.engines_started} engines started (engine-set start: {starts} s), {self.leases} scenarios, "
               f"{resets}, decode {speed} tokens/s per request"]
        out += [f"engines discarded: {d.splitlines()[0]}" for d in self.discarded]
        return out


class EnginePool:
    """One engine set for a session, lent to one scenario at a time (see the module docstring)."""

    def __init__(self, make: Callable[[], RayBackend], *, profile: str, name: str = "sglang",
                 sentinel_seconds: float = 4.0, family: str = "sglang", served_model: str | None = None) -> None:
        self.make, self.profile, self.name, self.family = make, profile, name, family
        """``family``: the engines' (``sglang`` or ``vllm``): their dialect, before they start."""
        self.served_model = served_model
        """The directory the engines are started on (and reset to)."""
        self.sentinel_seconds = sentinel_seconds
        self.stats = PoolStats()
        self.backend: RayBackend | None = None
        self.initial: InitialState | None = None
        self.sentinel_tokens = 0
        self._lock = threading.Lock()
        self._lent = False

    def lease(self) -> "PooledBackend":
        """A backend for one scenario over the pool's engines."""
        return PooledBackend(self)

    def ensure_started(self) -> None:
        """Start the engines now (and measure them) unless they run: what :meth:`slowdown` needs."""
        with self._lock:
            if self._lent:
                raise RuntimeError("the engine pool is lent to a running scenario")
            if self.backend is None:
                self._start()

    def slowdown(self) -> float:
        """How much slower than the fake these engines decode (1 at least, at most :data:`MAX_SLOWDOWN`): the
        factor a scenario's deadlines are scaled by, from the decode speed measured at start."""
        speed = self.stats.decode_tokens_per_s
        if not speed:
            raise RuntimeError("the engines' speed is measured when they start: call ensure_started() first")
        return min(MAX_SLOWDOWN, max(1.0, DEADLINE_BASE_TOKENS_PER_S / speed))

    # -- lending -------------------------------------------------------------------------------------------------

    def acquire(self) -> RayBackend:
        with self._lock:
            if self._lent:
                raise RuntimeError("the engine pool is already lent to a running scenario (one at a time)")
            self._lent = True
        try:
            if self.backend is None:
                self._start()
            else:
                self.backend.rewire()
        except BaseException:
            self._lent = False
            raise
        self.stats.leases += 1
        assert self.backend is not None
        return self.backend

    def release(self) -> None:
        """Reset every engine for the next scenario; raise (after tearing the engines down) when one failed
        during the scenario or cannot be reset."""
        backend = self.backend
        try:
            if backend is None:
                return
            failures = backend.failures()
            if failures:
                self._discard("an engine failed during the scenario: " + failures[0])
                backend.stop()  # raises EngineFailure with every failure
                raise EngineFailure("\n\n".join(failures))
            wire = backend.wire.snapshot()
            t0 = time.monotonic()
            try:
                in_thread(self._reset_all(backend, wire), 3 * STEP_TIMEOUT_S + 60.0)
            except EngineResetError as exc:
                self._discard(str(exc))
                _stop_quietly(backend)
                raise
            self.stats.resets += 1
            self.stats.reset_s.append(time.monotonic() - t0)
        finally:
            self._lent = False

    async def _reset_all(self, backend: RayBackend, wire: list[Any]) -> None:
        assert self.initial is not None
        reset = backend.real.reset
        await asyncio.gather(*(reset(e.index, e.url, self.initial, [c for c in wire if c.engine == e.index])
                               for e in backend.engines))

    def _discard(self, why: str) -> None:
        self.stats.discarded.append(why)
        self.backend, self.initial = None, None

    def close(self) -> None:
        """Tear the engines down (idempotent)."""
        backend, self.backend = self.backend, None
        if backend is not None:
            backend.stop()

    # -- starting and measuring -------------------------------------------------------------------------------

    def _start(self) -> None:
        backend = self.make()
        t0 = time.monotonic()
        backend.start()
        self.stats.starts.append(time.monotonic() - t0)
        self.stats.engines_started += len(backend.engine_urls())
        try:
            self.initial = self._measure_initial(backend)
            self.stats.decode_tokens_per_s = in_thread(decode_speed(backend.engine_urls()[0], backend.dialect),
                                                      STEP_TIMEOUT_S + 5)
        except BaseException:
            _stop_quietly(backend)
            raise
        budget = int(self.sentinel_seconds * self.stats.decode_tokens_per_s)
        self.sentinel_tokens = min(context_tokens(backend.config.spec.model_path) - len(SENTINEL_INPUT_IDS) - 4,
                                   max(MIN_SENTINEL_TOKENS, budget))
        self.backend = backend

    def _measure_initial(self, backend: RayBackend) -> InitialState:
        urls = backend.engine_urls()
        labels = in_thread(probe_labels(urls, dialect=backend.dialect), STEP_TIMEOUT_S)
        params = checkpoint(backend.config.spec.model_path)[1]
        digests = backend.digests()
        if len(set(labels)) != 1 or any(d != digests[0] for d in digests):
            raise EngineFailure(f"the engines did not start alike: labels {labels}; "
                                f"{sum(d != digests[0] for d in digests)} engine(s) hold other weights than engine 0")
        return InitialState(backend.config.spec.model_path, labels[0], digests[0], params)


async def decode_speed(url: str, dialect: Dialect = SGLANG_DIALECT, tokens: int = SPEED_PROBE_TOKENS) -> float:
    """Tokens per second one greedy request decodes on the engine at ``url`` (``ignore_eos``, ``tokens`` long, sent
    in the engine's ``dialect``), after a short warm-up request (real SGLang's first decode steps are slow: lazy
    initialisation)."""
    async with probe_client(STEP_TIMEOUT_S) as client:
        async def one(n: int) -> float:
            path, body = dialect.outgoing("/generate", {"input_ids": [1, 2, 3, 4], "sampling_params": {
                "max_new_tokens": n, "ignore_eos": True, "temperature": 0.0}})
            t0 = time.monotonic()
            r = await client.post(url + path, json=body)
            elapsed = time.monotonic() - t0
            r.raise_for_status()
            return n / elapsed  # ignore_eos: every request decodes its whole budget
        await one(SPEED_WARMUP_TOKENS)
        return await one(tokens)


def context_tokens(model_path: str) -> int:
    """The served model's context (``max_position_embeddings``): real SGLang refuses a request that asks for more
    (prompt + ``max_new_tokens``), so a sentinel's budget is capped by it."""
    config = json.loads((Path(model_path) / "config.json").read_text())
    return int(config.get("max_position_embeddings", 2048))


def _stop_quietly(backend: RayBackend) -> None:
    try:
        backend.stop()
    except EngineFailure:
        pass


class PooledBackend:
    """``conformance.backends.Backend`` for one scenario over an :class:`EnginePool`'s engines."""

    def __init__(self, pool: EnginePool) -> None:
        self.pool = pool
        self.dialect: Dialect = FAMILIES[pool.family].dialect
        self.wire = WireLog()
        self.control = self.wire.control()
        self.urls: list[str] = []
        self.sentinel_tokens = 0
        self.decode_tokens_per_s = 0.0
        """Measured when the engines started (:func:`decode_speed`); 0 until this scenario's start."""
        self._backend: RayBackend | None = None
        self.name, self.profile = pool.name, pool.profile

    def start(self) -> None:
        self._backend = self.pool.acquire()
        self.wire, self.control, self.urls = self._backend.wire, self._backend.control, list(self._backend.urls)
        self.sentinel_tokens = self.pool.sentinel_tokens
        self.decode_tokens_per_s = self.pool.stats.decode_tokens_per_s or 0.0

    def stop(self) -> None:
        if self._backend is None:
            return
        self._backend = None
        self.pool.release()

    def initial_weights(self) -> Mapping[str, Any]:
        assert self._backend is not None
        return self._backend.initial_weights()

    @property
    def served_model(self) -> str | None:
        """The directory the engines are started on (and reset to)."""
        return self.pool.served_model

    def digests(self) -> list[dict[str, str]] | None:
        assert self._backend is not None
        return self._backend.digests()

    def digest_of(self, weights: Mapping[str, Any]) -> dict[str, str]:
        assert self._backend is not None
        return self._backend.digest_of(weights)

    def truth(self) -> dict[str, Any]:
        assert self._backend is not None
        return self._backend.truth()


@dataclass
class PooledSetup:
    """A backend set-up (``conformance.session.BackendSetup``) that lends one :class:`EnginePool` to every scenario
    of a session: real SGLang or vLLM on CPU (:mod:`gpu.sglang_setup`), real engines on a GPU cluster
    (:mod:`gpu.gpu_setup`). A subclass says what the engines are started with (:meth:`config`), how one engine set is
    made (:meth:`make`), the wire's vocabulary (:attr:`recorded_profile`) and what it runs (:meth:`describe`).

    Once the engines did not start, every later scenario fails at once with that reason: a start can take minutes
    (a cold GPU node loading the model), and a setup that cannot start them will not start them the next time."""

    family: ClassVar[str] = "sglang"
    """The engine family the pool runs (its dialect, reset and weight reads)."""
    _pool: EnginePool | None = field(default=None, init=False)
    _start_failure: str | None = field(default=None, init=False)
    _model_dir: str | None = field(default=None, init=False)
    _cluster: contextlib.ExitStack | None = field(default=None, init=False)

    def tiny_model(self) -> str:
        """The tiny model the engines serve, built here once (removed by :meth:`close`)."""
        if self._model_dir is None:
            from .tiny_model import write_model

            folder = tempfile.mkdtemp(prefix=f"weightsync-{self.family}-model-")
            self._model_dir = str(write_model(Path(folder) / "model"))
        return self._model_dir

    def simulated_cluster(self, nodes: int, cpus_per_node: int, gpus_per_node: int = 0) -> None:
        """A simulated Ray cluster on this machine, started once (torn down by :meth:`close`)."""
        if self._cluster is None:
            from .cluster import local_cluster

            self._cluster = contextlib.ExitStack()
            self._cluster.enter_context(local_cluster(nodes=nodes, cpus_per_node=cpus_per_node,
                                                      gpus_per_node=gpus_per_node))

    def config(self) -> RayBackendConfig:
        raise NotImplementedError

    def make(self, config: RayBackendConfig) -> RayBackend:
        """One engine set (not started)."""
        raise NotImplementedError

    @property
    def recorded_profile(self) -> str:
        """The SGLang release the wire is recorded as."""
        raise NotImplementedError

    def describe(self) -> str:
        """What runs where, for the terminal summary (``real SGLang 0.5.23 on CPU (local processes)``)."""
        raise NotImplementedError

    def pool(self) -> EnginePool:
        """The session's engine pool (engines start at the first scenario)."""
        if self._pool is None:
            config = self.config()
            self._pool = EnginePool(functools.partial(self.make, config), profile=self.recorded_profile,
                                    name=self.family, family=self.family, served_model=config.spec.model_path)
        return self._pool

    def deadlines(self) -> Any:
        """The scenarios' deadlines scaled by how much slower than the fake the engines decode (measured when they
        start; starts them now if needed)."""
        from conformance.scenarios import DEADLINES

        if self._start_failure:
            raise EngineFailure(f"not started: an earlier scenario's engines did not start:\n{self._start_failure}")
        pool = self.pool()
        try:
            pool.ensure_started()
        except EngineFailure as exc:
            self._start_failure = str(exc)
            raise
        return DEADLINES.scaled(pool.slowdown())

    def backend_factory(self) -> Callable[[], Any]:
        """A zero-argument factory: each call lends the pool's engines to one scenario."""
        return self.pool().lease

    def summary(self) -> list[str]:
        """What the session cost (engines started, resets), for the terminal summary."""
        if self._pool is None:
            return []
        return [f"{self.describe()}: {line}" for line in self._pool.stats.lines()]

    def close(self) -> None:
        """Tear the engines down, then the simulated cluster and the built model."""
        try:
            if self._pool is not None:
                self._pool.close()
        finally:
            if self._cluster is not None:
                self._cluster.close()
                self._cluster = None
            if self._model_dir is not None:
                shutil.rmtree(Path(self._model_dir).parent, ignore_errors=True)
                self._model_dir = None
