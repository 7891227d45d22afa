"""The suite's own long-lived requests: every update cycle runs with a request resident on every engine.

A checker of "no request is aborted by an update" proves nothing about a cycle in which no request was in the
engine when it was paused. So before each cycle a scenario sends one ``/generate`` per engine that cannot finish
during the cycle (``ignore_eos``, a budget of seconds of decoding) through the engine's wire recorder, marked
with the sentinel header (recorded with ``origin="sentinel"``), naming the LoRA adapter the integration's own
requests on that engine use, and waits until every one has been open for
:data:`~conformance.situations.timing.SETTLE_S`. One that ends on its own
before the cycle's first pause, bump or transfer reached its engine (the integration took longer to get there than
the budget lasts: a checkpoint written first on a busy machine, or an engine slowed so much that the cycle reaches
it only after the other's pause drained) is sent again, under a new rid, for as long as the cycle runs. Each is released
(aborted by rid, recorded as injected so its abort is not blamed on the integration) as soon as the integration
continues that engine (or, for an integration that does not pause, sends it new weights: SGLang's update then
waits for every request in flight; or pauses it in a mode that waits for the requests in flight to finish, vLLM's
``wait``, once that pause went on: the sentinel was resident when it came, and would hold it for its whole budget),
or when the cycle ends. The wire then shows, for every engine and cycle,
whether a request was resident from the pause to the continue, on the fake and on real SGLang alike; a sentinel that the
integration's own calls aborted (a pause in ``abort`` mode, a bump or transfer with ``abort_all_requests``) is a
witness of exactly that, and an adapter unloaded under a paused sentinel shows the deadlock SGLang would hit.

Sentinels are not streamed: a streamed answer carries the whole output so far in every chunk (SGLang's
cumulative streaming), which costs the engine quadratic work for a request that lives long.
"""

from __future__ import annotations

import asyncio
import uuid
from dataclasses import dataclass, field
from typing import Callable, Sequence

import httpx

from ..backends import probe_client
from ..dialect import SGLANG_DIALECT, Dialect
from ..history import DISTURBING_PATHS, TRANSFER_PATHS, History, Injected, WireCall
from ..wire import SENTINEL_HEADER, WireLog
from .timing import END_TIMEOUT_S, MIN_LIFE_S, SETTLE_S, START_TIMEOUT_S
from .waiting import wait_until

def adapters_in_use(wire: WireLog, engines: int) -> list[str | None]:
    """Per engine, the LoRA adapter (``lora_path``) of the integration's newest ``/generate`` there."""
    newest: dict[int, str | None] = {}
    for call in wire.snapshot():
        if call.path == "/generate" and call.origin == "integration" and isinstance(call.payload, dict):
            newest[call.engine] = call.payload.get("lora_path")
    return [newest.get(e) for e in range(engines)]


SENTINEL_INPUT_IDS = [1, 2, 3, 4]
"""Token ids, not text: engines launched with ``--skip-tokenizer-init`` take only ids."""


@dataclass
class Sentinels:
    """One long-lived request per engine around one update cycle (see the module docstring)."""

    urls: Sequence[str]
    wire: WireLog
    max_new_tokens: int
    label: str
    adapters: Sequence[str | None] = ()
    """Per engine, the LoRA adapter the integration's requests there use (None: the base model)."""
    history: History | None = None
    """Where releases are recorded as injected aborts."""
    dialect: Dialect = SGLANG_DIALECT
    """The engines' wire (the sentinels and their releases are sent in it)."""
    rids: list[str] = field(default_factory=list)
    _client: httpx.AsyncClient | None = None
    _tasks: list[asyncio.Task[None]] = field(default_factory=list)
    _released: set[int] = field(default_factory=set)
    _paused: set[int] = field(default_factory=set)
    _disturbed: set[int] = field(default_factory=set)
    """Engines the cycle's first pause, bump or transfer reached: their sentinel is not sent again."""
    renewed: int = 0
    _sent_at: dict[int, float] = field(default_factory=dict)
    """Per engine, when its current sentinel was handed to the HTTP client."""
    """Sentinels sent again after they ended on their own."""
    _releasing: set[asyncio.Task[None]] = field(default_factory=set)
    _unlisten: Callable[[], None] | None = None

    async def start(self) -> None:
        """Send one sentinel per engine and wait until each has been open at its recorder for SETTLE_S."""
        self._client = probe_client(None, header=SENTINEL_HEADER)
        tag = uuid.uuid4().hex[:6]
        self.rids = [f"conformance-sentinel-{self.label}-e{i}-{tag}" for i in range(len(self.urls))]
        adapters = list(self.adapters) or [None] * len(self.urls)
        self._tasks = [asyncio.create_task(self._keep(engine, adapter)) for engine, adapter in enumerate(adapters)]
        loop = asyncio.get_running_loop()
        self._unlisten = self.wire.listen(
            lambda call, answered: loop.call_soon_threadsafe(self._on_call, call, answered))
        began = self.wire.clock()
        # an engine that answered at once (refused it, or is gone) ends the wait too: the wire shows it
        if not await wait_until(lambda: not self._missing() or any(t.done() for t in self._tasks), START_TIMEOUT_S,
                                wake=self.wire.listen, clock=self.wire.clock):
            now = self.wire.clock()
            missing = ", ".join(f"engine {e} (sent {now - self._sent_at[e]:.1f}s before)" if e in self._sent_at
                                else f"engine {e} (not sent yet)" for e in self._missing())
            await self.close()
            raise TimeoutError(f"the suite's long-lived requests {self.rids} did not reach every engine's recorder "
                               f"within {START_TIMEOUT_S:g}s of waiting ({now - began:.1f}s on the clock); not open "
                               f"there: {missing}")

    def _missing(self) -> list[int]:
        """The engines whose current sentinel has not been open at its recorder for :data:`SETTLE_S` yet."""
        newest = self.wire.clock() - SETTLE_S
        opened = {c.payload.get("rid") for c in self.wire.snapshot() if c.origin == "sentinel"
                  and isinstance(c.payload, dict) and c.t_start <= newest}
        return [engine for engine, rid in enumerate(self.rids) if rid not in opened]

    async def _keep(self, engine: int, adapter: str | None) -> None:
        """Engine ``engine``'s sentinel, sent again (a new rid) each time it ends before its engine was disturbed."""
        first, again = self.rids[engine], 0
        while True:
            sent = self._sent_at[engine] = self.wire.clock()
            served = await self._send(self.urls[engine], self.rids[engine], adapter)
            if not served or self.wire.clock() - sent < MIN_LIFE_S or engine in self._disturbed \
                    or engine in self._released or self._client is None:
                return
            again += 1
            self.renewed += 1
            self.rids[engine] = f"{first}-again{again}"

    async def _send(self, url: str, rid: str, adapter: str | None) -> bool:
        """One sentinel request; whether the engine served it (200)."""
        assert self._client is not None
        payload = {"input_ids": SENTINEL_INPUT_IDS, "rid": rid,
                   "sampling_params": {"max_new_tokens": self.max_new_tokens, "ignore_eos": True, "temperature": 0.0}}
        if adapter is not None:
            payload["lora_path"] = adapter
        path, body = self.dialect.outgoing("/generate", payload)
        return (await self._client.post(url + path, json=body)).status_code == 200

    def _on_call(self, call: WireCall, answered: bool) -> None:
        """An engine's sentinel has done its job once the integration continued it, once it sends new weights to
        an engine it did not pause (SGLang's update then waits for every request in flight, the sentinel too), or
        once its pause that waits for the requests in flight to finish went on (vLLM's ``wait``: the sentinel was
        resident when it came and would only hold it for the rest of its budget)."""
        if call.origin != "integration" or call.engine >= len(self.rids):
            return
        continued = call.path == "/continue_generation" and answered and call.ok
        unpaused_transfer = call.path in TRANSFER_PATHS and not answered and call.engine not in self._paused
        draining = call.path == "/pause_generation" and not answered and self.dialect.drains(call.sent_as)
        if call.path in DISTURBING_PATHS and not answered:
            self._disturbed.add(call.engine)
        if call.path == "/pause_generation" and not answered:
            self._paused.add(call.engine)
        if continued or unpaused_transfer or draining:
            task = asyncio.ensure_future(self._release_one(call.engine))
            self._releasing.add(task)
            task.add_done_callback(self._releasing.discard)

    async def _release_one(self, engine: int) -> None:
        if engine in self._released or self._tasks[engine].done():
            return
        self._released.add(engine)
        injected = Injected(self.wire.clock(), "abort", engine, "the suite's sentinel", rid=self.rids[engine])
        if self.history is not None:
            self.history.injected.append(injected)
        try:
            async with probe_client() as probe:
                path, body = self.dialect.outgoing("/abort_request", {"rid": self.rids[engine]})
                await probe.post(self.urls[engine] + path, json=body)
        except httpx.HTTPError:
            pass  # the engine is gone: its sentinel's call shows how it ended
        injected.t_end = self.wire.clock()

    async def release(self) -> None:
        """Abort every sentinel still open and wait (boundedly) for their answers."""
        if self._unlisten is not None:
            self._unlisten()
            self._unlisten = None
        await asyncio.gather(*self._releasing, *(self._release_one(e) for e in range(len(self.rids))))
        await asyncio.wait(self._tasks, timeout=END_TIMEOUT_S)
        await self.close()

    async def close(self) -> None:
        """Give up on whatever is still open (cancelling drops the connection) and release the client."""
        if self._unlisten is not None:
            self._unlisten()
            self._unlisten = None
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self._client is not None:
            await self._client.aclose()
            self._client = None
