"""What a report shows of one scenario run, derived from its history (the JSON of ``History.to_json()``).

The history is loaded back with ``History.from_json`` (fields it does not know are ignored, so histories written
by other suite versions render), and read with the queries the checkers use (who was resident at a pause, which
injected abort excuses an answer, the outputs by request id, the versions behind a group). What a failing case
names is read from its anomalies' fields (``conformance.anomaly``), never from their sentences; a result written
before anomalies existed (schema version 1) names only what its details' fields say.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from conformance.checks.effective import effective, sent_as
from conformance.checks.labels import finish_type, output_versions
from conformance.checks.weights import request_id, unpublished_weights
from conformance.history import TRANSFER_PATHS, History, Injected, WireCall

OUTCOMES = ("finished", "spanning", "aborted", "injected", "failed", "dropped", "open")
"""A request's outcome: finished outside any update; finished while an update cycle ran (spanning it); aborted by
the engine; aborted by a fault the suite injected; answered with an error status; closed without an answer (the
client gave up); still open when the run ended."""


@dataclass
class Request:
    """One ``/generate`` call as a bar."""

    seq: int
    engine: int
    t0: float
    t1: float | None
    """None: never answered (drawn to the end of the run)."""
    outcome: str
    origin: str
    rids: list[str]
    versions: list[str]
    """Version labels that produced its tokens (per-token spans when reported), oldest first."""
    tokens: int | None
    cycles: list[int]
    """Update cycles it was in flight during."""
    continued_by: str | None = None
    """The rid of a later turn that resumed this aborted request (partial rollout): a recompute, not a lost sample."""
    row: int = 0


@dataclass
class Pause:
    """One engine paused: from its ``/pause_generation`` to its ``/continue_generation`` (None: never resumed)."""

    engine: int
    t0: float
    t1: float | None
    mode: str
    """The mode SGLang acts on (``conformance.checks.effective``: defaults and the release's handler applied);
    ``rejected`` when SGLang refuses the body."""
    how: str
    """How the mode came about: sent, SGLang's default, or a handler that takes none."""
    resident: dict[str, int]
    """``/generate`` calls open on the engine when the pause arrived, by origin (integration, sentinel)."""
    cycle: int | None


@dataclass
class Unpublished:
    """An engine holding weights of no published version after failed cycle ``cycle`` (P8's reading), from its first
    load in that cycle to the next load into it (None: to the end of the run)."""

    engine: int
    t0: float
    t1: float | None
    cycle: int
    served: list[str]
    """The rids of the integration's requests it served on them (open while it was not paused)."""


@dataclass
class Mark:
    """A control call on one engine (version bump, transfer, flush, session, abort…), drawn as a tick."""

    engine: int
    t: float
    kind: str
    label: str
    ok: bool
    detail: str


@dataclass
class CycleCost:
    """What one update cycle cost the requests in flight, per lane group (engine, or node when known)."""

    index: int
    in_flight: dict[str, int] = field(default_factory=dict)
    aborted: dict[str, int] = field(default_factory=dict)
    resident: dict[str, dict[str, int]] = field(default_factory=dict)
    """Group → origin → requests open at the group's pauses."""


@dataclass
class Timeline:
    """Everything drawn for one scenario run."""

    scenario: str
    backend: str
    t_end: float
    engines: int
    nodes: list[str | None]
    requests: list[Request]
    pauses: list[Pause]
    marks: list[Mark]
    cycles: list[dict[str, Any]]
    batches: list[dict[str, Any]]
    injected: list[dict[str, Any]]
    breaks: list[dict[str, Any]]
    staleness: list[int]
    """Staleness of every consumed group: version current at consumption − oldest version of any of its tokens."""
    max_staleness: int | None
    costs: list[CycleCost]
    unpublished: list[Unpublished]
    group_rids: dict[tuple[int, int], list[str]]
    """(batch, prompt) → the rids of that consumed group's turns (to resolve witnesses that name a group)."""

    def node_of(self, engine: int) -> str | None:
        """The node an engine ran on, shortened (Ray's node ids are 56 hex digits), when the backend reports it."""
        node = self.nodes[engine] if engine < len(self.nodes) else None
        return None if node is None else str(node) if len(str(node)) <= 12 else f"{str(node)[:10]}…"

    def group_of(self, engine: int) -> str:
        """The lane group an engine belongs to: its node when the backend reports nodes, else itself."""
        node = self.node_of(engine)
        return f"node {node}" if node is not None else f"engine {engine}"

    @property
    def groups(self) -> list[str]:
        return list(dict.fromkeys(self.group_of(e) for e in range(self.engines)))


def build_timeline(history: dict[str, Any]) -> Timeline:
    """The timeline of one history (its JSON)."""
    h = History.from_json(history)
    calls = h.wire
    cycles = [c for c in history.get("cycles") or [] if isinstance(c, dict)]
    injected = [i for i in history.get("injected") or [] if isinstance(i, dict)]
    breaks = [b for b in history.get("breaks") or [] if isinstance(b, dict)]
    breaks += [{"kind": "error", "message": e} for e in history.get("errors") or []]  # histories before breaks
    times = [0.0, *(c.t_end or c.t_start for c in calls), *(c.t_end for c in h.cycles),
             *(b.t for b in h.batches), *(b.get("t") or 0.0 for b in breaks)]
    t_end = max(t for t in times if isinstance(t, (int, float))) or 1.0
    engines = max([c.engine + 1 for c in calls] + [len(h.final_labels or [])] + [1])
    nodes = history.get("nodes") or (h.engine_truth or {}).get("nodes") or []
    aborts = [_landed(i, calls) for i in h.injected if i.kind == "abort" and isinstance(i.t, (int, float))]
    requests = [_request(c, h, aborts) for c in calls if c.path == "/generate"]
    _pack_rows(requests)
    pauses = _pauses(h)
    timeline = Timeline(
        scenario=str(history.get("scenario", "?")), backend=str(history.get("backend", "?")), t_end=t_end,
        engines=engines, nodes=list(nodes), requests=requests, pauses=pauses,
        marks=[m for c in calls if (m := _mark(c)) is not None], cycles=cycles,
        batches=[b for b in history.get("batches") or [] if isinstance(b, dict)], injected=injected, breaks=breaks,
        staleness=[], max_staleness=history.get("max_staleness"), costs=[], group_rids={},
        unpublished=[Unpublished(u.engine, u.since, None if u.until == float("inf") else u.until, u.cycle.index,
                                 [request_id(call) for call in u.served]) for u in unpublished_weights(h)[0]])
    timeline.staleness, timeline.group_rids = _consumed_groups(h)
    continued = {rid: str(turn.get("rid")) for b in timeline.batches
                 for g in (b.get("batch") or {}).get("groups") or [] for s in g.get("samples") or []
                 for turn in s.get("turns") or [] for rid in turn.get("continues") or []}
    for r in requests:
        r.continued_by = next((continued[rid] for rid in r.rids if rid in continued), None)
    timeline.costs = [_cycle_cost(timeline, c, i) for i, c in enumerate(cycles)]
    return timeline


def _request(call: WireCall, h: History, injected: list[Injected]) -> Request:
    """One ``/generate`` call as a bar; ``injected`` are the injected aborts, each with when it landed."""
    outputs = call.generate_outputs()
    spanned = [c.index for c in h.cycles if call.overlaps(c.t_start, c.t_end)]
    finishes = {finish_type(o) for o in outputs}
    rids = [str(o["meta_info"].get("id")) for o in outputs if o["meta_info"].get("id") is not None]
    if call.t_end is None:
        outcome = "open"
    elif call.status is None:
        outcome = "dropped"
    elif not 200 <= call.status < 300:
        outcome = "failed"
    elif "abort" in finishes:
        outcome = "injected" if any(i.excuses(call) for i in injected) else "aborted"
    else:
        outcome = "spanning" if spanned else "finished"
    versions: list[str] = []
    for o in outputs:
        spans = o["meta_info"].get("weight_versions")
        labels = [s.get("version") for s in spans if isinstance(s, dict)] if isinstance(spans, list) and spans \
            else [o["meta_info"].get("weight_version")]
        versions += [str(v) for v in labels if v is not None and str(v) not in versions]
    tokens = [o["meta_info"].get("completion_tokens") for o in outputs]
    return Request(call.seq, call.engine, call.t_start, call.t_end, outcome, call.origin, rids, versions,
                   sum(t for t in tokens if isinstance(t, int)) if outputs else None, spanned)


def _landed(fault: Injected, calls: list[WireCall]) -> Injected:
    """An injected abort with when it landed: as recorded (``t_end``), else (histories from before the suite
    recorded it) read off the wire: the first abort answer of a request open on that engine at ``t``."""
    if isinstance(fault.t_end, (int, float)):
        return fault
    hit = [c.t_end for c in calls if c.path == "/generate" and c.t_end is not None
           and c.t_start <= fault.t <= c.t_end and fault.engine in (None, c.engine)
           and any(finish_type(o) == "abort" for o in c.generate_outputs())]
    return dataclasses.replace(fault, t_end=min(hit, default=fault.t))


def _pack_rows(requests: list[Request]) -> None:
    """Give each request the lowest row of its engine's lane that is free at its start."""
    ends: dict[int, list[float]] = {}
    for r in sorted(requests, key=lambda r: (r.engine, r.t0)):
        rows = ends.setdefault(r.engine, [])
        end = r.t1 if r.t1 is not None else float("inf")
        free = next((i for i, e in enumerate(rows) if e <= r.t0), None)
        if free is None:
            rows.append(end)
            r.row = len(rows) - 1
        else:
            rows[free], r.row = end, free


def _pause_mode(call: WireCall, profile: str) -> tuple[str, str]:
    """The mode SGLang ``profile`` pauses in for ``call``, and how it came about; the mode as sent (else SGLang's
    default, abort) for a profile this suite does not know (a real engine's version string)."""
    try:
        mode = effective(call, "mode", profile)
        return ("rejected" if mode is None else str(mode)), sent_as(call, "mode", profile)
    except KeyError:
        payload = call.payload if isinstance(call.payload, dict) else {}
        return str(payload.get("mode", "abort")), "sent" if "mode" in payload else "no 'mode' sent"


def _pauses(h: History) -> list[Pause]:
    pauses: list[Pause] = []
    open_by_engine: dict[int, Pause] = {}
    for call in h.wire:
        if call.path == "/pause_generation" and call.origin == "integration":
            cycle = h.cycle_at(call.t_start)
            resident: dict[str, int] = {}
            for w in h.resident_at(call.engine, call.t_start):
                resident[w.origin] = resident.get(w.origin, 0) + 1
            pause = Pause(call.engine, call.t_start, None, *_pause_mode(call, str(h.profile or "")), resident,
                          None if cycle is None else cycle.index)
            pauses.append(pause)
            open_by_engine[call.engine] = pause
        elif call.path == "/continue_generation" and call.engine in open_by_engine:
            open_by_engine.pop(call.engine).t1 = call.t_end if call.t_end is not None else call.t_start
    return pauses


_MARK_KINDS = {"/update_weight_version": "version", "/flush_cache": "flush", "/begin_weight_update": "session",
               "/end_weight_update": "session", "/abort_request": "abort",
               **{p: "transfer" for p in TRANSFER_PATHS}}


def _mark(call: WireCall) -> Mark | None:
    if call.path in ("/generate", "/pause_generation", "/continue_generation") or call.method == "GET":
        return None
    payload = call.payload if isinstance(call.payload, dict) else {}
    kind = _MARK_KINDS.get(call.path, "other")
    version = payload.get("new_version", payload.get("weight_version"))
    label = f"v{version}" if version is not None and kind in ("version", "transfer") else ""
    if kind == "transfer" and version is not None:
        kind = "version"  # a transfer that stamps the version relabels the engine too
    shown = {k: v for k, v in payload.items() if not isinstance(v, (list, dict)) or len(str(v)) < 80}
    answer = f"{call.status}" if call.status is not None else "no answer"
    return Mark(call.engine, call.t_start, kind, label, call.ok,
                f"engine {call.engine} {call.method} {call.path} {shown} → {answer} at t={call.t_start:.3f}s")


def _consumed_groups(h: History) -> tuple[list[int], dict[tuple[int, int], list[str]]]:
    """The staleness of every consumed group (the version current at consumption − the oldest version of its
    tokens), and each group's request ids by (batch, prompt)."""
    outputs = h.outputs_by_rid()
    staleness: list[int] = []
    group_rids: dict[tuple[int, int], list[str]] = {}
    for rec in h.batches:
        for group in rec.batch.groups if rec.batch is not None else []:
            rids = [str(t.rid) for s in group.samples or [] for t in s.turns or []]
            group_rids[(int(rec.index or 0), -1 if group.prompt_index is None else int(group.prompt_index))] = rids
            versions = [v for rid in rids if rid in outputs for v in output_versions(outputs[rid][1])]
            if rec.published_truth is not None and versions:
                staleness.append(int(rec.published_truth) - min(versions))
    return staleness, group_rids


def _cycle_cost(t: Timeline, cycle: dict[str, Any], position: int) -> CycleCost:
    cost = CycleCost(int(cycle.get("index", position)))
    for r in t.requests:
        if r.origin != "integration" or cost.index not in r.cycles:
            continue
        g = t.group_of(r.engine)
        cost.in_flight[g] = cost.in_flight.get(g, 0) + 1
        cost.aborted[g] = cost.aborted.get(g, 0) + (r.outcome == "aborted")
    for p in t.pauses:
        if p.cycle == cost.index:
            into = cost.resident.setdefault(t.group_of(p.engine), {})
            for origin, n in p.resident.items():
                into[origin] = into.get(origin, 0) + n
    return cost


# -- what a witness names ---------------------------------------------------------------------------------------

@dataclass
class Named:
    """The engines, requests, cycles and times a failing case's witness names (highlighted in its timeline)."""

    engines: set[int] = field(default_factory=set)
    rids: set[str] = field(default_factory=set)
    cycles: set[int] = field(default_factory=set)
    times: set[float] = field(default_factory=set)

    def __bool__(self) -> bool:
        return bool(self.engines or self.rids or self.cycles or self.times)

    def update(self, other: "Named") -> None:
        self.engines |= other.engines
        self.rids |= other.rids
        self.cycles |= other.cycles
        self.times |= other.times

    def as_json(self) -> dict[str, list]:
        return {"e": sorted(self.engines), "r": sorted(self.rids), "c": sorted(self.cycles), "t": sorted(self.times)}


def named_in(case: dict[str, Any], timeline: Timeline | None) -> Named:
    """What a case's anomalies name: their ``engine``, ``rids``, ``cycle``, ``times``, and with ``batch`` and
    ``prompt`` the requests of that consumed group. A case of a result written before anomalies existed (no
    ``anomalies``: schema version 1) names only what its details' fields say (:func:`named_in_details`)."""
    anomalies = case.get("anomalies")
    if not isinstance(anomalies, list):
        return named_in_details(case.get("details") or {})
    named = Named()
    for a in (a for a in anomalies if isinstance(a, dict)):
        for key, into, cast in (("engine", named.engines, int), ("rids", named.rids, str),
                                ("cycle", named.cycles, int), ("times", named.times, float)):
            _add(into, a.get(key), cast)
        if timeline is not None and a.get("batch") is not None and a.get("prompt") is not None:
            named.rids |= set(timeline.group_rids.get((int(a["batch"]), int(a["prompt"])), []))
    return named


def _add(into: set, value: Any, cast: type) -> None:
    for v in value if isinstance(value, list) else [value]:
        if v is not None:
            try:
                into.add(cast(v))
            except (TypeError, ValueError):
                pass


def named_in_details(details: dict[str, Any]) -> Named:
    """Schema-1 results only (written before anomalies existed): the ``engine``, ``rid`` and ``cycle`` fields a
    verdict's details carry. Their witness sentences are shown, never parsed."""
    named = Named()
    for key, into, cast in (("engine", named.engines, int), ("rid", named.rids, str), ("cycle", named.cycles, int)):
        _add(into, details.get(key), cast)
    return named
