"""Backends: where the engines a scenario drives come from.

A backend starts N engines, gives each a URL the integration talks real HTTP to (every exchange recorded by a
:class:`~conformance.wire.WireRecorder`), answers the suite's probes (the label an engine reports, from
``/model_info`` as on real SGLang) and, when it can, engine-side truth (weights digests, event logs).

``FakeBackend`` runs fake SGLang engines (``fakes/``) on loopback; the GPU backend (real SGLang on Ray,
``gpu/``) implements the same protocol.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import ssl
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, AsyncIterator, Mapping, Protocol

import httpx

from fakes.profiles import DEFAULT_PROFILE

from .dialect import SGLANG_DIALECT, Dialect
from .families import DEFAULT_FAMILY, FakeOptions, family
from .interface import KEEPALIVE_EXPIRY_S
from .situations.timing import SENTINEL_SECONDS
from .wire import PROBE_HEADER, WireLog, WireRecorder
from .wire_control import WireControl


class Backend(Protocol):
    """What a scenario needs from a backend."""

    name: str
    profile: str
    """The SGLang release the wire is recorded as (another family's: :data:`conformance.dialect.VOCABULARY_PROFILE`)."""
    urls: list[str]
    dialect: Dialect
    """How the engines' wire maps to the suite's vocabulary, and the suite's own calls to theirs."""
    wire: WireLog
    control: WireControl
    """The refusals and holds its recorders apply (:mod:`conformance.wire_control`)."""
    sentinel_tokens: int
    """Decode budget of the suite's long-lived requests (:mod:`conformance.situations.sentinels`): seconds of decoding on
    this backend, so they outlive an update cycle yet end on their own if nobody aborts them."""
    decode_tokens_per_s: float
    """How fast one request decodes on this backend (configured on the fake, measured on real engines): the
    scenarios size the integration's turns by it."""

    def start(self) -> None: ...

    def stop(self) -> None: ...

    def initial_weights(self) -> Mapping[str, Any]:
        """The weights the engines start with (``torch.Tensor`` or ``fakes.weights.TensorBlob`` by name): the
        trainer's step 0."""

    def digests(self) -> list[dict[str, str]] | None:
        """Per engine, parameter name → digest of the tensor it holds (``fakes.weights.TensorBlob.digest``, the
        function ``digest_of`` uses), or None when the backend cannot read the engines' weights."""

    def truth(self) -> dict[str, Any]:
        """Engine-side truth for the history (event logs), or {}."""


def trainer_digests(backend: Any, weights: Mapping[str, Any]) -> dict[str, str]:
    """The trainer's ``weights`` digested as ``backend.digests()`` shows an engine's: the backend's own
    ``digest_of`` where it has one (real vLLM shows only some parameters, as sha256 of their bytes), else
    :func:`digest_of`."""
    return getattr(backend, "digest_of", digest_of)(weights)


@functools.cache
def _ssl_context() -> ssl.SSLContext:
    """One context for every probe client: building one per client costs more than the probe itself."""
    return ssl.create_default_context()


def probe_client(timeout_s: float | None = 5.0, header: str = PROBE_HEADER) -> httpx.AsyncClient:
    """An HTTP client for the suite's own calls: probes (not recorded on the wire) by default, or sentinels
    (``header=SENTINEL_HEADER``: recorded as the suite's); idle connections dropped as the reference drops them
    (``KEEPALIVE_EXPIRY_S``, below the engines' own limit: httpx's default equals it)."""
    return httpx.AsyncClient(timeout=timeout_s, headers={header: "1"}, verify=_ssl_context(),
                             limits=httpx.Limits(keepalive_expiry=KEEPALIVE_EXPIRY_S))


async def probe_labels(urls: list[str], timeout_s: float = 5.0, dialect: Dialect = SGLANG_DIALECT) -> list[str | None]:
    """Each engine's version label as real SGLang reports it (``/model_info``, else ``/get_model_info``; vLLM's
    ``/weight_info`` through its dialect)."""
    async with probe_client(timeout_s) as client:
        async def one(url: str) -> str | None:
            for path in ("/model_info", "/get_model_info"):
                try:
                    r = await client.get(url + dialect.outgoing(path)[0])
                except httpx.HTTPError:
                    return None
                if r.status_code == 200:
                    return r.json().get("weight_version")
            return None
        return list(await asyncio.gather(*(one(u) for u in urls)))


async def probe_post(url: str, path: str, body: Any, timeout_s: float = 5.0,
                     dialect: Dialect = SGLANG_DIALECT) -> None:
    """A call the suite makes itself (an injected fault: pause, abort; ``path`` and ``body`` in the vocabulary, sent
    in the engine's ``dialect``), not recorded on the wire."""
    path, body = dialect.outgoing(path, body)
    async with probe_client(timeout_s) as client:
        r = await client.post(url + path, json=body)
        r.raise_for_status()


@dataclass
class FakeBackendConfig:
    """Knobs of the fake backend."""

    engines: int = 2
    profile: str = DEFAULT_PROFILE
    tokens_per_second: float = 2000.0
    max_running_requests: int = 64
    enable_lora: bool = True
    seed: int = 0
    engine: str = DEFAULT_FAMILY
    """The engine family faked (:mod:`conformance.families`): ``sglang`` (as ``profile``), ``vllm`` (its newest
    release, token-in/token-out on, recorded through :class:`conformance.dialect.VllmDialect`), or one registered."""
    stepped: bool = False
    """Engines on manual clocks, stepped together by one backend thread at ``tokens_per_second``, which
    :meth:`FakeBackend.held` stops so that a scenario can place a call on an exact token (:meth:`FakeBackend.step`,
    :meth:`FakeBackend.tokens_left`). Off: each engine decodes on its own real-time ticker."""


class FakeBackend:
    """Fake engines of one family served on 127.0.0.1 (uvicorn in a thread each), wrapped by wire recorders."""

    def __init__(self, config: FakeBackendConfig | None = None) -> None:
        self.config = config or FakeBackendConfig()
        self.family = family(self.config.engine)
        self.dialect = self.family.dialect
        self.name = "fake" if self.family.name == DEFAULT_FAMILY else f"fake-{self.family.name}"
        self.profile = self.family.recorded_profile(self.config.profile)
        self.sentinel_tokens = int(SENTINEL_SECONDS * self.config.tokens_per_second)
        self.decode_tokens_per_s = self.config.tokens_per_second
        self.wire = WireLog()
        self.control = self.wire.control()
        self.control.freeze = self._freeze
        self.urls: list[str] = []
        self._engines: list[Any] = []
        self._servers: list[Any] = []
        self._retired: list[list[Any]] = []
        """Per engine, the engines it ran as before each restart (their event logs come first in the truth)."""
        self._stepping = threading.Lock()
        self._closing = threading.Event()
        self._ticker: threading.Thread | None = None
        self._held = False

    def start(self) -> None:
        from fakes.server import LoopbackServer

        c = self.config
        for i in range(c.engines):
            engine = self._engine(f"e{i}")
            server = LoopbackServer(WireRecorder(engine.app, i, self.wire, self.control, self.dialect))
            server.start()
            self._engines.append(engine)
            self._servers.append(server)
            self._retired.append([])
            self.urls.append(server.url)
        if c.stepped:
            self._ticker = threading.Thread(target=self._tick, name="fake-backend-ticker", daemon=True)
            self._ticker.start()

    def restart(self, i: int) -> None:
        """Engine ``i`` dies and comes back on its address, as a crashed server relaunched by its supervisor: the
        requests it holds are answered as a crashed engine answers them (500), its connections close, and a fresh
        engine serves from its start-up weights, labelled ``default``, paused nowhere, with no adapter and no request
        (what an RL framework's fault tolerance brings back: miles #1724, #1805)."""
        from fakes.server import LoopbackServer

        old, server = self._engines[i], self._servers[i]
        server.run_coroutine(self._crash(old))
        server.stop()
        engine = self._engine(f"e{i}")
        engine.set_frozen(old.frozen)
        fresh = LoopbackServer(WireRecorder(engine.app, i, self.wire, self.control, self.dialect),
                               port=int(self.urls[i].rsplit(":", 1)[1]))
        fresh.start()
        self._retired[i].append(old)
        self._engines[i], self._servers[i] = engine, fresh

    @staticmethod
    async def _crash(engine: Any) -> None:
        engine.crash("the suite restarted the engine")

    def _engine(self, engine_id: str) -> Any:
        """One fake engine of the configured family (its row's ``fake``)."""
        c = self.config
        return self.family.fake(FakeOptions(engine_id, None if c.stepped else c.tokens_per_second,
                                            c.max_running_requests, c.enable_lora, c.seed, c.profile))

    def _tick(self) -> None:
        while not self._closing.wait(1.0 / self.config.tokens_per_second):
            with self._stepping:
                self._step(1)

    def _freeze(self, frozen: bool) -> None:
        """Decoding stopped on every engine while the wire holds a disturbing call (``WireControl.freeze``)."""
        for engine in self._engines:
            engine.set_frozen(frozen)

    def _step(self, n: int) -> None:
        for engine in self._engines:
            engine.step_threadsafe(n)

    @contextlib.asynccontextmanager
    async def held(self) -> AsyncIterator[None]:
        """Stop a stepped backend's clock (after the step in progress): no engine decodes until the block ends."""
        if self._ticker is None:
            raise RuntimeError("FakeBackend.held needs FakeBackendConfig(stepped=True)")
        while not self._stepping.acquire(blocking=False):  # polled, not in a thread: a cancelled wait takes nothing
            await asyncio.sleep(0.001)
        self._held = True
        try:
            yield
        finally:
            self._held = False
            self._stepping.release()

    async def step(self, n: int = 1) -> None:
        """Run ``n`` decode steps on every engine, inside :meth:`held`."""
        if not self._held:
            raise RuntimeError("FakeBackend.step runs inside FakeBackend.held (the ticker steps otherwise)")
        await asyncio.to_thread(self._step, n)

    def tokens_left(self) -> dict[str, int]:
        """Rid → tokens of its budget each request the engines are decoding has left."""
        return {r.rid: r.max_new_tokens - len(r.output_ids) for e in self._engines for r in list(e.scheduler.running)}

    def stop(self) -> None:
        self._closing.set()
        if self._ticker is not None:
            self._ticker.join()
        with ThreadPoolExecutor(max_workers=max(1, len(self._servers))) as pool:
            list(pool.map(lambda server: server.stop(), self._servers))
        self._servers.clear()

    @property
    def served_model(self) -> str | None:
        """The directory the engines were started on (``History.served_model``)."""
        return self._engines[0].model_path if self._engines else None

    def initial_weights(self) -> Mapping[str, Any]:
        return dict(self._engines[0].weights)  # TensorBlobs: the trainer makes torch tensors of them if it can

    def digests(self) -> list[dict[str, str]] | None:
        """An engine left without weights (a fake vLLM after a failed reload) holds none: ``{}``."""
        return [{} if getattr(e, "weights_gone", False) else {name: blob.digest() for name, blob in e.weights.items()}
                for e in self._engines]

    def truth(self) -> dict[str, Any]:
        return {"engine_events": [[event for run in [*retired, e] for event in run.events.to_list()]
                                  for retired, e in zip(self._retired, self._engines)]}


def digest_of(weights: Mapping[str, Any]) -> dict[str, str]:
    """Parameter name → digest of the trainer's tensor (torch or ``TensorBlob``), comparable with
    ``Backend.digests``."""
    from fakes.weights import WeightStore

    return {name: blob.digest() for name, blob in WeightStore(weights).items()}
