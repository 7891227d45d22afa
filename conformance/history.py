"""What happened in one scenario run: the only input of the checkers.

Everything here is plain data. Wire records come from the recorder in front of every engine (the same on
the fake and on real SGLang); cycles, batches and filesystem events from the scenario runner; ``engine_truth``
holds what only a fake engine can tell (weights digests, internal event logs) and is optional.
"""

from __future__ import annotations

import json
from dataclasses import MISSING, dataclass, field, fields
from typing import Any, Callable, Iterable, Iterator

from .anomaly import Anomaly
from .interface import Batch, Group, Sample, Turn
from .prompts import PromptBook

LORA_LOAD_PATHS = frozenset({"/load_lora_adapter", "/load_lora_adapter_from_tensors"})
"""SGLang's two ways to load an adapter (from a path, from tensors)."""
WEIGHT_LOAD_PATHS = frozenset({
    "/update_weights_from_disk", "/update_weights_from_tensor", "/update_weights_from_distributed",
})
"""The calls that load full weights (an engine that failed one may hold part of them)."""
TRANSFER_PATHS = WEIGHT_LOAD_PATHS | LORA_LOAD_PATHS
DISTURBING_PATHS = TRANSFER_PATHS | {"/pause_generation", "/update_weight_version"}
"""Calls of an update cycle that can abort or freeze in-flight requests."""


@dataclass
class WireCall:
    """One HTTP exchange between the integration and an engine, as seen on the wire."""

    seq: int
    engine: int
    method: str
    path: str
    payload: Any
    """Parsed JSON request body (or the raw text, or None when empty)."""
    t_start: float
    t_end: float | None = None
    status: int | None = None
    """None: no response (connection dropped, client gave up)."""
    response: Any = None
    """Parsed JSON response; for a streamed ``/generate`` the last data event."""
    origin: str = "integration"
    """``integration`` (the integration under test) or ``sentinel`` (the suite's own long-lived request)."""
    sent_as: str | None = None
    """The call as it crossed the wire (``POST /pause?mode=keep``) when the engine's dialect differs from the
    vocabulary it is recorded in (:mod:`conformance.dialect`); None for SGLang."""

    @property
    def ok(self) -> bool:
        """2xx and not ``success: false``."""
        if self.status is None or not 200 <= self.status < 300:
            return False
        return not (isinstance(self.response, dict) and self.response.get("success") is False)

    def overlaps(self, t0: float, t1: float) -> bool:
        end = self.t_end if self.t_end is not None else float("inf")
        return self.t_start < t1 and end > t0

    def generate_outputs(self) -> list[dict]:
        """The output objects of a ``/generate`` response (a batch answers a list)."""
        if self.path != "/generate" or self.response is None:
            return []
        items = self.response if isinstance(self.response, list) else [self.response]
        return [o for o in items if isinstance(o, dict) and isinstance(o.get("meta_info"), dict)]


@dataclass
class UpdateCycle:
    """One ``Updater.update`` call made by the scenario."""

    index: int
    cell: int
    transport: str
    lora: bool
    pause_mode: str
    t_start: float
    t_end: float
    ok: bool
    error: str | None
    counter_before: int
    counter_after: int
    returned: int | None
    published_before: int | None
    published_after: int | None
    labels_before: list[str | None]
    labels_after: list[str | None]
    expect_failure: bool = False
    """The scenario deliberately pushed weights the engines must reject."""
    trainer_digest: dict[str, str] | None = None
    """Parameter name → digest of what the trainer pushed (full-weight updates; for a poisoned cycle, the weights
    the engines reject)."""
    digests_after: list[dict[str, str]] | None = None
    """Per engine, parameter name → digest of what it holds after the cycle (backends that can read weights)."""
    digests_before: list[dict[str, str]] | None = None
    """Per engine, what it held before a cycle the scenario makes fail (refused or poisoned): a failed update must
    leave each engine with whole weights, these or the trainer's."""


@dataclass
class BatchRecord:
    """A batch the Manager handed out, and the truth at consumption time."""

    index: int
    t: float
    batch: Batch
    published_truth: int | None
    """The version of the last successful update before consumption (None before any)."""


@dataclass
class FsEvent:
    """A change at the top of the integration's checkpoint directory (inotify)."""

    t: float
    kind: str
    """``created`` (made in place), ``moved_in`` (renamed into place), ``deleted``, ``moved_out``, ``written``
    (a file written inside checkpoint ``name`` after it arrived) or ``deleted_inside`` (a file of it deleted: its
    removal has begun)."""
    name: str
    inner: str | None = None
    """For ``written``: the file inside the checkpoint."""


@dataclass
class Unmet:
    """A situation the scenario set out to build and could not (the integration's design did not allow it): the
    checks that needed it answer ``unknown`` with the reason instead of passing; the others judge the run."""

    checks: tuple[str, ...]
    """The checks that needed it (:data:`EVERY_CHECK`: all of them)."""
    reason: str
    t: float

    def concerns(self, check: str) -> bool:
        return check in self.checks or EVERY_CHECK[0] in self.checks


EVERY_CHECK = ("*",)
"""An unmet situation every check needed."""


@dataclass
class Injected:
    """A fault the scenario injected itself (so checkers do not blame the integration)."""

    t: float
    kind: str
    engine: int | None = None
    detail: str = ""
    rid: str | None = None
    """The one request an injected abort targets; None: every request on ``engine``."""
    t_end: float | None = None
    """When the fault had landed (the engine answered the suite's call); None: at ``t``."""

    def excuses(self, call: WireCall) -> bool:
        """Whether this injected abort can explain an abort answer of ``call``: the call was open at some moment
        between the injection and its landing."""
        ended = call.t_end if call.t_end is not None else float("inf")
        landed = self.t if self.t_end is None else self.t_end
        return (self.kind == "abort" and call.t_start <= landed and ended >= self.t
                and self.engine in (None, call.engine)
                and self.rid in (None, *(str(o["meta_info"].get("id")) for o in call.generate_outputs())))


@dataclass
class OpenCall:
    """A call still waiting for its answer when a run broke."""

    engine: int
    method: str
    path: str
    since: float
    origin: str = "integration"

    def describe(self, now: float) -> str:
        return (f"engine {self.engine} {self.method} {self.path} open since t={self.since:.3f}s "
                f"({now - self.since:.1f} s without an answer)")


@dataclass
class Breakage:
    """Why a run broke: ``error`` (an update that should have succeeded failed, a role raised, an injected fault
    never fired), ``hang`` (a call to the integration did not return within its deadline) or ``timeout`` (the
    situation a scenario waited for never came). A broken run fails every case of its scenario."""

    kind: str
    message: str
    t: float
    open_calls: list[OpenCall] = field(default_factory=list)
    """Calls on the wire still unanswered at that moment (what the integration was stuck on)."""

    def anomalies(self) -> list[Anomaly]:
        """What broke, then the calls it was stuck on (control calls before generates)."""
        control = [c for c in self.open_calls if c.path != "/generate"]
        generates = len(self.open_calls) - len(control)
        out = [Anomaly(self.kind, f"{self.kind}: {self.message} (at t={self.t:.3f}s)", times=(self.t,))]
        out += [Anomaly("open-call", f"  open call: {c.describe(self.t)}", engine=c.engine, times=(c.since,))
                for c in control[:5]]
        if generates:
            out.append(Anomaly("open-call", f"  and {generates} /generate call(s) still open"))
        return out

    def describe(self) -> list[str]:
        """The witness lines: the anomalies' sentences."""
        return [a.text for a in self.anomalies()]


@dataclass
class HeldWeights:
    """One set of weights an engine held, from the load that put them there (the fake's per-decode-step truth)."""

    engine: int
    t: float
    """When the engine began holding them (the run's clock)."""
    digests: dict[str, str]
    """Parameter name → digest; empty: no weights (a failed vLLM reload)."""
    source: str
    """What put them there (``startup``, the load route, ``(partial)``, a memory resume, …)."""
    tokens: dict[str, int] = field(default_factory=dict)
    """rid → tokens that request decoded on them (requests the engine finished; the suite's own included)."""


def held_weights(truth: dict[str, Any], rid: Callable[[str], str]) -> list[HeldWeights] | None:
    """Per engine, every set of weights it held and the tokens decoded on each, read from a fake engine's event log
    (``weights.load`` / ``weights.lost`` carry a tag every token decoded on them is stamped with; ``request.finish``
    counts a request's tokens per tag; ``rid`` maps the engine's request ids to the history's); None when the
    backend has no such log."""
    logs = truth.get("engine_events")
    if not logs:
        return None
    held: list[HeldWeights] = []
    for engine, events in enumerate(logs):
        by_tag: dict[int, HeldWeights] = {}
        for e in events:
            f = e["fields"]
            if e["kind"] in ("weights.load", "weights.lost") and "tag" in f:
                by_tag[f["tag"]] = HeldWeights(engine, f["wall"], f["digests"], f["source"])
                held.append(by_tag[f["tag"]])
            elif e["kind"] == "request.finish":
                for tag, count in f.get("weights") or ():
                    if tag in by_tag:
                        tokens, known = by_tag[tag].tokens, rid(f["rid"])
                        tokens[known] = tokens.get(known, 0) + count
    return held


def finish_type(output: dict) -> str | None:
    """How an engine says an output ended (``meta_info.finish_reason.type``: ``stop``, ``length``, ``abort``)."""
    reason = output.get("meta_info", {}).get("finish_reason")
    return reason.get("type") if isinstance(reason, dict) else reason


def resident_at(calls: Iterable[WireCall], engine: int, t: float) -> list[WireCall]:
    """``/generate`` calls of ``calls`` (the integration's and the suite's) open on ``engine`` at time ``t``: what
    "resident" means to the judge and to the builder that aims at it (:mod:`conformance.situations.resident`)."""
    return [w for w in calls if w.engine == engine and w.path == "/generate" and w.t_start < t
            and (w.t_end is None or w.t_end > t)]


@dataclass
class History:
    """Everything one scenario run produced."""

    scenario: str
    integration: str
    backend: str
    profile: str
    seed: int
    max_staleness: int | None = None
    initial_version: int | None = None
    """The version the manager published before the first update (``Manager.weight_version`` once started): None,
    or the version an integration counts its initial weights as (e.g. 0), which it is then judged against."""
    pause_mode: str | None = None
    """The pause mode the integration was asked to run its cycles under (``BuildEnv.pause_mode``)."""
    stamps_engines: bool = True
    """The integration declares that it stamps its versions on the engines (``Capabilities.stamps_engines``);
    False: it keeps versions on the client side, and the truth is the cycle timeline."""
    served_model: str | None = None
    """The directory the engines were started on (their base model; None where the backend does not say): a load
    of it restores the engines' first weights, it is no checkpoint of the trainer's."""
    wire: list[WireCall] = field(default_factory=list)
    cycles: list[UpdateCycle] = field(default_factory=list)
    batches: list[BatchRecord] = field(default_factory=list)
    fs: list[FsEvent] | None = None
    """None when the platform cannot watch the filesystem (checkers answer unknown)."""
    injected: list[Injected] = field(default_factory=list)
    breaks: list[Breakage] = field(default_factory=list)
    """Why the run broke, if it did (then every case of the scenario fails)."""
    unmet: list[Unmet] = field(default_factory=list)
    """Situations the scenario could not build, and the checks that needed them."""
    t_teardown: float | None = None
    """When the script ended and the teardown began (the manager stopped): calls the integration drops from then on
    are its shutdown, not lost work."""
    initial_digest: dict[str, str] | None = None
    """Parameter name → digest of the weights the engines started with (backends that can read weights): the first
    published weights."""
    final_labels: list[str | None] = field(default_factory=list)
    engine_truth: dict[str, Any] = field(default_factory=dict)
    held_weights: list[HeldWeights] | None = None
    """What the engines decoded each token on (:func:`held_weights`; None: the backend cannot tell)."""
    prompts: PromptBook = field(default_factory=PromptBook)
    """The prompts the suite handed out: which prompt a request is for (:meth:`prompt_of`)."""

    # -- queries the checkers share -------------------------------------------------------------------

    def integration_calls(self, path: str | None = None, engine: int | None = None) -> Iterator[WireCall]:
        """The integration's calls (not the suite's sentinels), optionally of one path and engine."""
        for call in self.wire:
            if (call.origin == "integration" and (path is None or call.path == path)
                    and (engine is None or call.engine == engine)):
                yield call

    def prompt_of(self, call: WireCall) -> int | None:
        """The index of the suite's prompt a ``/generate`` call's ``text`` is for (None for any other text)."""
        return self.prompts.index_of(call.payload.get("text") if isinstance(call.payload, dict) else None)

    def sentinel_calls(self) -> list[WireCall]:
        """The suite's own long-lived requests (one per engine around each cycle)."""
        return [c for c in self.wire if c.origin == "sentinel"]

    def cycle_calls(self, cycle: UpdateCycle, engine: int | None = None) -> list[WireCall]:
        """The integration's calls sent during ``cycle`` (to ``engine``), in order."""
        return [w for w in self.integration_calls(engine=engine) if cycle.t_start <= w.t_start <= cycle.t_end]

    def refused(self, cycle: UpdateCycle) -> dict[tuple[int, str], list[WireCall]]:
        """The engines' refusals (non-2xx, ``success: false``) of ``cycle``'s control and transfer calls, per (engine,
        path), where the last call to that path on that engine was refused too: a failure the cycle never
        recovered from, whatever ``update()`` returned (a refusal retried until accepted is not here)."""
        attempts: dict[tuple[int, str], list[WireCall]] = {}
        for w in self.cycle_calls(cycle):
            if w.path != "/generate" and w.t_end is not None:
                attempts.setdefault((w.engine, w.path), []).append(w)
        return {key: [w for w in calls if not w.ok] for key, calls in attempts.items() if not calls[-1].ok}

    def weight_loads(self, cycle: UpdateCycle, engine: int) -> list[WireCall]:
        """``cycle``'s calls that load full weights into ``engine`` (whatever they answered)."""
        return [w for w in self.cycle_calls(cycle, engine) if w.path in WEIGHT_LOAD_PATHS]

    def disturbing_call(self, cycle: UpdateCycle, engine: int) -> WireCall | None:
        """The first call of ``cycle`` that can disturb ``engine``'s in-flight requests: its pause, else (an
        integration that never pauses) its first transfer or version bump."""
        calls = [w for w in self.cycle_calls(cycle, engine) if w.path in DISTURBING_PATHS]
        return next((w for w in calls if w.path == "/pause_generation"), calls[0] if calls else None)

    def disturbing_calls(self) -> Iterator[tuple[UpdateCycle, int, WireCall]]:
        """Per cycle and engine it sent calls to, in order: the cycle's first call that can disturb that engine's
        in-flight requests (:meth:`disturbing_call`), where it sent one."""
        for cycle in self.cycles:
            for engine in sorted({w.engine for w in self.cycle_calls(cycle)}):
                if (first := self.disturbing_call(cycle, engine)) is not None:
                    yield cycle, engine, first

    def pause_windows(self, engine: int) -> list[tuple[WireCall, float]]:
        """Per accepted pause of ``engine``: the pause call and when the engine continued (the start of the next
        accepted ``/continue_generation``; infinity when it never did)."""
        windows: list[tuple[WireCall, float]] = []
        paused: WireCall | None = None
        for w in self.integration_calls(engine=engine):
            if w.path == "/pause_generation" and w.ok and paused is None:
                paused = w
            elif w.path == "/continue_generation" and w.ok and paused is not None:
                windows.append((paused, w.t_start))
                paused = None
        return windows + ([(paused, float("inf"))] if paused is not None else [])

    def paused_at(self, engine: int, t: float) -> WireCall | None:
        """The pause ``engine`` was under at time ``t``, if any."""
        return next((p for p, end in self.pause_windows(engine) if p.t_start <= t < end), None)

    def resident_at(self, engine: int, t: float) -> list[WireCall]:
        """``/generate`` calls (the integration's and the sentinels') open on ``engine`` at time ``t``."""
        return resident_at(self.wire, engine, t)

    def outputs_by_rid(self) -> dict[str, tuple[WireCall, dict]]:
        """``meta_info.id`` → (wire call, output object) for every generate output seen."""
        found: dict[str, tuple[WireCall, dict]] = {}
        for call in self.integration_calls("/generate"):
            for out in call.generate_outputs():
                rid = out["meta_info"].get("id")
                if rid is not None:
                    found[str(rid)] = (call, out)
        return found

    def cycle_at(self, t: float) -> UpdateCycle | None:
        return next((c for c in self.cycles if c.t_start <= t <= c.t_end), None)

    def published_truth_at(self, t: float) -> int | None:
        """The version the last successful cycle finished before ``t`` returned; before any, the version the
        integration published for its initial weights (``initial_version``: None, or e.g. 0)."""
        done = [c.returned for c in self.cycles if c.ok and c.t_end <= t and c.returned is not None]
        return done[-1] if done else self.initial_version

    def gate_cycle(self, call: WireCall, *, maybe: bool = False) -> UpdateCycle | None:
        """The update cycle that continued ``call``'s engine when ``call`` was held at SGLang's pause gate: sent after
        that engine's pause was answered and before its continue, so the engine parked it before tokenizing
        (``TokenizerManager.generate_request`` waits on ``is_pause_cond``, 0.5.2–0.5.23) and admitted it only at the
        continue. With ``maybe``, also a call sent while the pause was still unanswered (the gate may have closed
        before it arrived, or not)."""
        for pause, resumed in self.pause_windows(call.engine):
            closed = pause.t_start if maybe else pause.t_end
            if closed is not None and closed <= call.t_start < resumed:
                return self.cycle_at(resumed)
        return None

    def client_truth(self, call: WireCall, *, newest: bool = False) -> int | None:
        """The client-side version ``call``'s tokens were generated under: the version published when it was sent,
        or, for a call held at SGLang's pause gate, the version current when the engine admitted it (the one the
        cycle that continued the engine installs, when that cycle succeeded). Where the wire cannot tell, the oldest
        plausible version, or with ``newest`` the newest: a call sent while a pause was unanswered (held or not), or
        after the cycle's last call to its engine and before the suite saw the cycle return (the integration may have
        published already, at least to that engine's callers)."""
        cycle = self.gate_cycle(call, maybe=newest)
        if cycle is None and newest:
            cycle = next((c for c in self.cycles if c.t_start <= call.t_start <= c.t_end
                          and self.settled(c, call.engine) <= call.t_start), None)
        if cycle is not None and cycle.ok and cycle.returned is not None:
            return cycle.returned
        return self.published_truth_at(call.t_start)

    def settled(self, cycle: UpdateCycle, engine: int | None = None) -> float:
        """When the last of ``cycle``'s calls to the engines (to ``engine`` only, when given) was answered (the
        cycle's start when it made none): from then on the integration may have published the cycle's version (to
        the calls it sends that engine: the engine runs the new weights), although ``update()`` has not returned."""
        ends = [w.t_end for w in self.integration_calls() if w.path != "/generate" and w.t_end is not None
                and cycle.t_start <= w.t_start <= cycle.t_end and engine in (None, w.engine)]
        return max(ends, default=cycle.t_start)

    def rebase(self, t0: float) -> None:
        """Shift every timestamp so the scenario starts at t=0 (witnesses then read as seconds into the run)."""
        for call in self.wire:
            call.t_start -= t0
            call.t_end = None if call.t_end is None else call.t_end - t0
        for c in self.cycles:
            c.t_start, c.t_end = c.t_start - t0, c.t_end - t0
        for item in [*self.batches, *(self.fs or []), *self.injected, *self.breaks, *self.unmet,
                     *(self.held_weights or [])]:
            item.t -= t0
        self.t_teardown = None if self.t_teardown is None else self.t_teardown - t0
        for injected in self.injected:
            injected.t_end = None if injected.t_end is None else injected.t_end - t0
        for b in self.breaks:
            for c in b.open_calls:
                c.since -= t0

    def to_json(self) -> str:
        return json.dumps(_plain(self), default=str)

    @classmethod
    def from_json(cls, data: str | dict[str, Any]) -> History:
        """The inverse of :meth:`to_json` (a JSON text or its parsed dict). Tolerant: fields it does not know are
        ignored and fields a history of another suite version lacks take their defaults (None when they have none),
        so the report reads histories of older and newer suites; only the times of calls and cycles and where a
        call went cannot be missing (a ``KeyError`` naming the field)."""
        return _load(cls, json.loads(data) if isinstance(data, str) else data)


_NESTED: dict[tuple[type, str], type] = {
    (History, "wire"): WireCall, (History, "cycles"): UpdateCycle, (History, "batches"): BatchRecord,
    (History, "fs"): FsEvent, (History, "injected"): Injected, (History, "breaks"): Breakage,
    (History, "unmet"): Unmet, (History, "held_weights"): HeldWeights, (Breakage, "open_calls"): OpenCall,
    (BatchRecord, "batch"): Batch,
    (Batch, "groups"): Group, (History, "prompts"): PromptBook, (Group, "samples"): Sample, (Sample, "turns"): Turn,
}
"""Which field of which record holds records of which class (a list of them, or one)."""
_ESSENTIAL = {(WireCall, "engine"), (WireCall, "path"), (WireCall, "t_start"), (UpdateCycle, "t_start"),
              (UpdateCycle, "t_end")}
"""Fields a history cannot be read without."""


def _plain(value: Any) -> Any:
    """``dataclasses.asdict`` without its deep copies (a history is written once per scenario, on the run's
    critical path): records → dicts, lists and tuples → lists, dicts → dicts; anything else as it is."""
    if isinstance(value, (str, int, float, bool)) or value is None:
        return value
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if hasattr(value, "__dataclass_fields__") and not isinstance(value, type):
        return {f.name: _plain(getattr(value, f.name)) for f in fields(value)}
    return value


def _load(cls: type, data: Any) -> Any:
    """One record of ``cls`` from its JSON dict (see :meth:`History.from_json`)."""
    if not isinstance(data, dict):
        raise TypeError(f"a {cls.__name__} record must be a JSON object, got {type(data).__name__}")
    values: dict[str, Any] = {}
    for f in fields(cls):
        if f.name not in data:
            if (cls, f.name) in _ESSENTIAL:
                raise KeyError(f.name)
            if f.default is MISSING and f.default_factory is MISSING:
                values[f.name] = None
            continue
        value, inner = data[f.name], _NESTED.get((cls, f.name))
        if inner is not None and isinstance(value, list):
            value = [_load(inner, v) for v in value]
        elif inner is not None and value is not None:
            value = _load(inner, value)
        elif f.name == "checks" and isinstance(value, list):
            value = tuple(value)
        values[f.name] = value
    return cls(**values)
