"""The cost table of a replay: what an integration's weight sync costs the run, read from its history.

Samples are rebuilt from the wire: a ``/generate`` whose text is an earlier turn's text plus its answer continues
that episode (as every multi-turn agent builds its next prompt); the episodes whose first turns went out together
with the same text are one group. Figures "per step" are over the steps between consecutive updates (the warm-up
before the first update, when no episode has finished yet, is left out).
"""

from __future__ import annotations

import statistics
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Sequence

from ..checks.weights import unpublished_weights
from ..history import TRANSFER_PATHS, History, WireCall
from .run import ReplayRun


@dataclass
class _Episode:
    group: tuple[str, float]
    turns: list[WireCall] = field(default_factory=list)
    aborted: bool = False
    done: bool = False

    @property
    def t_end(self) -> float:
        return self.turns[-1].t_end or float("inf")


def _finish(out: dict) -> str | None:
    reason = out.get("meta_info", {}).get("finish_reason")
    return reason.get("type") if isinstance(reason, dict) else None


def episodes(history: History, turns: int) -> list[_Episode]:
    """The integration's episodes, rebuilt from its ``/generate`` calls (see the module docstring)."""
    found: list[_Episode] = []
    waiting: dict[str, _Episode] = {}
    for call in sorted(history.integration_calls("/generate"), key=lambda c: (c.t_start, c.seq)):
        text = call.payload.get("text") if isinstance(call.payload, dict) else None
        ep = waiting.pop(text, None) if isinstance(text, str) else None
        if ep is None:
            ep = _Episode((str(text), call.t_start))
            found.append(ep)
        ep.turns.append(call)
        outs = call.generate_outputs()
        if call.t_end is None or call.status is None:
            continue  # no answer (the run ended under it): the episode never finished
        if not outs or call.status != 200 or _finish(outs[0]) == "abort":
            ep.aborted = ep.done = True
        elif len(ep.turns) >= turns:
            ep.done = True
        elif isinstance(text, str):
            waiting[text + str(outs[0].get("text", ""))] = ep
    return found


def _spread(values: Sequence[float]) -> tuple[float, float, float] | None:
    return (statistics.fmean(values), min(values), max(values)) if values else None


@dataclass
class CostTable:
    """The cost figures of one replay; :meth:`rows` formats them. ``series`` holds the per-update and per-step
    figures behind them (``aborts``, ``decoding`` per update; ``train_wait_s``, ``raw``, ``consumable``,
    ``groups_discarded`` per step; ``staleness``: trained groups per staleness) for charts."""

    values: dict[str, Any]
    series: dict[str, list[float]] = field(default_factory=dict)

    ROWS = (
        ("simulated", "simulated time, updates"),
        ("step_s", "step length, s"),
        ("aborted_sample_rate", "samples ending aborted"),
        ("aborts_per_update", "aborts per update"),
        ("decoding_at_update", "requests decoding at the update"),
        ("abort_after_pause_s", "abort after the pause, s (min / median / max)"),
        ("abort_window", "aborts at the pause / during the transfer / at finalize / elsewhere"),
        ("groups_discarded_per_step", "groups discarded per step"),
        ("samples_discarded_per_step", "samples discarded per step"),
        ("discarded_fraction", "share of rollout production discarded"),
        ("raw_per_step", "raw samples produced per step"),
        ("consumable_per_step", "consumable samples per step"),
        ("consumable_per_450s", "consumable samples per 450 s"),
        ("train_wait_s", "train wait per step, s"),
        ("mixed_version_turns", "mixed-version share of trained turns"),
        ("staleness", "staleness of trained groups, versions"),
        ("recompute_tokens", "recompute tokens (continued requests)"),
        ("unpublished_samples", "samples served on unpublished weights (P8)"),
    )

    def rows(self) -> list[tuple[str, str]]:
        return [(label, _fmt(key, self.values.get(key))) for key, label in self.ROWS]


def _fmt(key: str, v: Any) -> str:
    if v is None:
        return "–"
    if key == "simulated":
        return f"{v[0] / 3600:.2f} h, {v[1]}"
    if key in ("aborted_sample_rate", "discarded_fraction", "mixed_version_turns"):
        return f"{v:.1%}"
    if key == "abort_after_pause_s":
        return f"{v[0]:.0f} / {v[1]:.0f} / {v[2]:.0f}"
    if key == "abort_window":
        return " / ".join(str(x) for x in v)
    if key == "staleness":  # {staleness: groups}
        if not v:
            return "–"
        mean = sum(k * n for k, n in v.items()) / sum(v.values())
        return f"{mean:.1f} ({min(v)}–{max(v)})"
    if isinstance(v, tuple):
        return f"{v[0]:.1f} ({v[1]:.0f}–{v[2]:.0f})" if v[1] != v[2] else f"{v[0]:.1f}"
    return f"{v:,.0f}" if isinstance(v, (int, float)) else str(v)


def cost_table(run: ReplayRun) -> CostTable:
    """The cost of ``run`` (see :class:`CostTable.ROWS` for what each figure is)."""
    h, c = run.history, run.config
    eps = episodes(h, c.turns)
    cycles = [cy for cy in h.cycles]
    starts = [cy.t_start for cy in cycles]
    windows = list(zip(starts, starts[1:]))
    v: dict[str, Any] = {"simulated": (run.sim_s, len(cycles))}
    v["step_s"] = _spread([b - a for a, b in windows])
    done = [e for e in eps if e.done]
    steady = [e for e in done if starts and e.t_end >= starts[0]]
    v["aborted_sample_rate"] = sum(e.aborted for e in steady) / len(steady) if steady else None
    # aborts against the update they follow
    aborted = [t for e in eps if e.aborted for t in e.turns[-1:] if t.t_end is not None]
    per_cycle: list[list[WireCall]] = [[] for _ in cycles]
    for call in aborted:
        k = max((i for i, s in enumerate(starts) if s <= call.t_end), default=None)
        if k is not None:
            per_cycle[k].append(call)
    generates = list(h.integration_calls("/generate"))
    v["aborts_per_update"] = _spread([len(x) for x in per_cycle])
    decoding = [sum(1 for g in generates if g.t_start < s and (g.t_end or 1e18) > s) for s in starts]
    v["decoding_at_update"] = _spread(decoding)
    after, window = [], [0, 0, 0, 0]  # at the pause, during the transfer, at finalize, elsewhere
    for k, cy in enumerate(cycles):
        calls = h.cycle_calls(cy)
        for call in per_cycle[k]:
            mine = [w for w in calls if w.engine == call.engine]
            pause = next((w.t_start for w in mine if w.path == "/pause_generation"), cy.t_start)
            transfers = [w for w in mine if w.path in TRANSFER_PATHS and w.t_end is not None]
            after.append(call.t_end - pause)
            if call.t_end > cy.t_end + 2 * c.step_s:
                window[3] += 1
            elif transfers and call.t_end < min(w.t_start for w in transfers):
                window[0] += 1
            elif transfers and call.t_end < max(w.t_end for w in transfers):
                window[1] += 1
            else:
                window[2] += 1
    v["abort_after_pause_s"] = (min(after), statistics.median(after), max(after)) if after else None
    v["abort_window"] = tuple(window)
    groups: dict[tuple[str, float], list[_Episode]] = {}
    for e in eps:
        groups.setdefault(e.group, []).append(e)
    raw, lost_groups, lost_samples, consumable = ([0] * len(windows) for _ in range(4))
    for members in groups.values():
        if not all(e.done for e in members):
            continue
        end = max(e.t_end for e in members)
        k = next((i for i, (a, b) in enumerate(windows) if a <= end < b), None)
        if k is None:
            continue
        raw[k] += len(members)
        if any(e.aborted for e in members):
            lost_groups[k] += 1
            lost_samples[k] += len(members)
        else:
            consumable[k] += len(members)
    v["groups_discarded_per_step"] = _spread(lost_groups)
    v["samples_discarded_per_step"] = _spread(lost_samples)
    v["discarded_fraction"] = sum(lost_samples) / sum(raw) if sum(raw) else None
    v["raw_per_step"] = _spread(raw)
    v["consumable_per_step"] = _spread(consumable)
    span = starts[-1] - starts[0] if len(starts) > 1 else 0
    v["consumable_per_450s"] = sum(consumable) / span * 450 if span else None
    waits = [s.train_wait_s for s in run.steps[1:]]
    v["train_wait_s"] = _spread(waits)
    outputs = h.outputs_by_rid()
    trained = [t for rec in h.batches for g in rec.batch.groups for s in g.samples for t in s.turns]
    mixed = [len({sp.get("version") for sp in (outputs.get(t.rid, (None, {}))[1].get("meta_info", {})
                                                .get("weight_versions") or [])}) > 1 for t in trained]
    v["mixed_version_turns"] = sum(mixed) / len(mixed) if mixed else None
    v["staleness"] = dict(Counter(g.staleness for rec in h.batches for g in rec.batch.groups
                                  if g.staleness is not None))
    recompute = 0
    for t in trained:
        for old in t.continues:
            out = outputs.get(old, (None, {}))[1].get("meta_info", {})
            recompute += int(out.get("prompt_tokens") or 0) + int(out.get("completion_tokens") or 0)
    v["recompute_tokens"] = recompute
    served = {call.seq for u in unpublished_weights(h)[0] for call in u.served}
    v["unpublished_samples"] = sum(any(t.seq in served for t in e.turns) for e in eps)
    top = max(v["staleness"], default=-1)
    series = {"aborts": [len(x) for x in per_cycle], "decoding": decoding, "train_wait_s": waits, "raw": raw,
              "consumable": consumable, "groups_discarded": lost_groups,
              "staleness": [v["staleness"].get(k, 0) for k in range(top + 1)]}
    return CostTable(v, {k: [float(x) for x in xs] for k, xs in series.items()})
