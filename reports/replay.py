"""``python -m reports.replay``: integrations side by side in the production-scale replay, and its HTML report.

    python -m reports.replay [--integration SPEC] [--vs SPEC ...] [--out DIR] [--reduced] [--FIELD VALUE ...]

Each integration (``module:attribute``, as ``--integration`` everywhere in the suite) runs the same replay
(:mod:`conformance.replay`, every :class:`~conformance.replay.ReplayConfig` field is a flag); the command prints one
table with a column per integration, the verdicts of the suite's checkers, and writes ``replay.html`` (cost charts
per step, a per-engine timeline of three update cycles, sampled) and ``replay.json`` into ``--out``.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import fields
from html import escape
from pathlib import Path
from typing import Any, Sequence

from conformance.cases import IntegrationError, load_integration, parse_options
from conformance.history import TRANSFER_PATHS, History
from conformance.replay import REDUCED, CostTable, ReplayConfig, ReplayRun, cost_table, replay

from .svg import bar_chart

DEFAULT = "conformance.reference:integration"
_CLASSES = ("s0", "s1", "s2", "s3")


def _flag_type(default: Any) -> Any:
    if isinstance(default, int):
        return int
    if isinstance(default, float):
        return float
    if default is None:
        return lambda text: None if text.lower() == "none" else int(text)
    return str


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m reports.replay", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--integration", default=DEFAULT, help="the integration to replay (module:attribute)")
    p.add_argument("--vs", action="append", default=[], metavar="SPEC",
                   help="another integration, side by side (repeatable), e.g. conformance.mutants:version_bump_aborts")
    p.add_argument("--integration-option", action="append", default=[], metavar="KEY=VALUE",
                   help="keyword argument of an integration factory (JSON value), for --integration")
    p.add_argument("--out", type=Path, default=Path("results"), help="where replay.html and replay.json go")
    p.add_argument("--reduced", action="store_true", help="the few-second replay of the CI case")
    p.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")
    for f in fields(ReplayConfig):
        p.add_argument("--" + f.name.replace("_", "-"), dest=f.name, type=_flag_type(f.default), default=None,
                       help=f"(default {f.default}" + (f"; --reduced: {REDUCED[f.name]})" if f.name in REDUCED
                                                       else ")"))
    return p


def config_from(args: argparse.Namespace) -> ReplayConfig:
    values = dict(REDUCED) if args.reduced else {}
    values.update({f.name: getattr(args, f.name) for f in fields(ReplayConfig) if getattr(args, f.name) is not None})
    return ReplayConfig(**values)


class ProgressBar:
    """A one-line progress bar on ``stream`` for each integration in turn."""

    def __init__(self, name: str, stream: Any = sys.stderr, width: int = 30) -> None:
        self.name, self.stream, self.width = name, stream, width

    def __call__(self, done: int, total: int, sim_s: float) -> None:
        full = round(self.width * done / total)
        self.stream.write(f"\r{self.name[:36]:36s} [{'#' * full}{'.' * (self.width - full)}] {done}/{total} updates, "
                          f"{sim_s / 3600:.2f} h simulated")
        if done == total:
            self.stream.write("\n")
        self.stream.flush()


def table_text(names: Sequence[str], runs: Sequence[ReplayRun], tables: Sequence[CostTable]) -> str:
    """The integrations side by side: one row per cost figure, then the run and the checkers' verdicts."""
    rows = [("", *names)]
    rows += [(label, *(dict(t.rows())[label] for t in tables)) for label, _ in tables[0].rows()]
    rows.append(("wall / CPU s (simulated s per wall s)",
                 *(f"{r.wall_s:.1f} / {r.cpu_s:.1f} ({r.sim_s / r.wall_s:,.0f})" for r in runs)))
    rows.append(("checkers failing", *(", ".join(k for k, v in r.verdicts.items() if v.status == "fail") or "none"
                                       for r in runs)))
    rows.append(("checkers unknown", *(", ".join(k for k, v in r.verdicts.items() if v.status == "unknown") or "none"
                                       for r in runs)))
    rows.append(("run broke", *("; ".join(b.message for b in r.history.breaks)[:80] or "no" for r in runs)))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


# -- the HTML report ---------------------------------------------------------------------------------------

_CSS = """
body{font:14px/1.45 system-ui,sans-serif;margin:24px;color:#222;max-width:1240px}
h1{font-size:20px}h2{font-size:16px;margin-top:28px}table{border-collapse:collapse}
td,th{border:1px solid #ddd;padding:3px 8px;text-align:left;vertical-align:top}th{background:#f4f4f4}
.charts{display:flex;flex-wrap:wrap;gap:10px}.chart{margin:0}.chart-title{font-size:12px;font-weight:600}
.tick{font-size:9px;fill:#555;text-anchor:middle}.axis{stroke:#999}.val{font-size:8px;text-anchor:middle}
.bar.s0{fill:#4c78a8}.bar.s1{fill:#e45756}.bar.s2{fill:#72b7b2}.bar.s3{fill:#f58518}.key{display:inline-block;
width:10px;height:10px;margin:0 4px 0 10px}.key.s0{background:#4c78a8}.key.s1{background:#e45756}
.key.s2{background:#72b7b2}.key.s3{background:#f58518}.legend{font-size:12px}
.lane{font-size:10px;fill:#333}.req{stroke:none}.o-ok{fill:#8fbf8f}.o-abort{fill:#d62728}.o-mixed{fill:#9467bd}
.o-open{fill:#bbb}.pause{fill:#f5a623;opacity:.25}.xfer{fill:#1f77b4;opacity:.5}.grid{stroke:#eee}
.fail{color:#b00020;font-weight:600}.unknown{color:#a66f00}.pass{color:#2e7d32}
"""


def _outcome(call: Any) -> str:
    outs = call.generate_outputs()
    if not outs:
        return "open"
    meta = outs[0]["meta_info"]
    if (meta.get("finish_reason") or {}).get("type") == "abort":
        return "abort"
    return "mixed" if len({s.get("version") for s in meta.get("weight_versions") or []}) > 1 else "ok"


def timeline_svg(history: History, *, max_lanes: int = 8, max_rows: int = 14, width: int = 1180) -> str:
    """Per engine (at most ``max_lanes``, evenly sampled), three update cycles of the run's middle: requests
    coloured by outcome (a lane shows at most ``max_rows`` at once; the rest are counted), pauses and transfers."""
    cycles = history.cycles
    if not cycles:
        return "<p>no update cycle ran</p>"
    k = max(0, len(cycles) // 2 - 1)
    t0 = cycles[k].t_start - 60
    t1 = cycles[min(len(cycles) - 1, k + 2)].t_end + 60
    engines = sorted({c.engine for c in history.wire})
    picked = engines[:: max(1, -(-len(engines) // max_lanes))]
    left, row_h, lane_gap = 70, 5, 10
    x = lambda t: left + (width - left - 10) * (min(max(t, t0), t1) - t0) / (t1 - t0)  # noqa: E731
    out, y, hidden = [], 22, 0
    every = next(s for s in (10, 30, 60, 120, 300, 600, 1800, 3600) if (t1 - t0) / s <= 10)
    for tick in range(int(t0 // every + 1) * every, int(t1), every):
        out.append(f'<line class="grid" x1="{x(tick):.1f}" x2="{x(tick):.1f}" y1="14" y2="100%"/>'
                   f'<text class="tick" x="{x(tick):.1f}" y="11">{tick:.0f} s</text>')
    for engine in picked:
        calls = [c for c in history.wire if c.engine == engine]
        gens = sorted((c for c in calls if c.path == "/generate" and c.t_start < t1 and (c.t_end or t1) > t0),
                      key=lambda c: c.t_start)
        ends: list[float] = []
        bars = []
        for c in gens:
            row = next((i for i, end in enumerate(ends) if end <= c.t_start), None)
            if row is None:
                if len(ends) >= max_rows:
                    hidden += 1
                    continue
                ends.append(0.0)
                row = len(ends) - 1
            ends[row] = c.t_end or t1
            bars.append((row, c))
        lane_h = max(1, len(ends)) * row_h + 12
        out.append(f'<text class="lane" x="4" y="{y + 10}">engine {engine}</text>')
        for pause, end in history.pause_windows(engine):
            if end > t0 and pause.t_start < t1:
                out.append(f'<rect class="pause" x="{x(pause.t_start):.1f}" y="{y}" '
                           f'width="{max(1, x(end) - x(pause.t_start)):.1f}" height="{lane_h - 4}">'
                           f'<title>paused ({(pause.payload or {}).get("mode")}) {pause.t_start:.0f}–{end:.0f} s'
                           f'</title></rect>')
        for c in calls:
            if c.path in TRANSFER_PATHS and c.t_end is not None and c.t_end > t0 and c.t_start < t1:
                out.append(f'<rect class="xfer" x="{x(c.t_start):.1f}" y="{y}" '
                           f'width="{max(1, x(c.t_end) - x(c.t_start)):.1f}" height="3"><title>{c.path} '
                           f'{c.t_start:.0f}–{c.t_end:.0f} s</title></rect>')
        for row, c in bars:
            outcome = _outcome(c)
            out.append(f'<rect class="req o-{outcome}" x="{x(c.t_start):.1f}" y="{y + 6 + row * row_h}" '
                       f'width="{max(1, x(c.t_end or t1) - x(c.t_start)):.1f}" height="{row_h - 1}"><title>'
                       f'{escape(str((c.payload or {}).get("rid", "")))}: {outcome}, {c.t_start:.0f}–'
                       f'{(c.t_end or t1):.0f} s</title></rect>')
        y += lane_h + lane_gap
    note = (f"engines {', '.join(map(str, picked))} of {len(engines)}; t = {t0:.0f}–{t1:.0f} s (cycles {k}–"
            f"{min(len(cycles) - 1, k + 2)})" + (f"; {hidden} requests beyond {max_rows} rows per lane not drawn"
                                                   if hidden else ""))
    legend = ('<span class="legend"><span class="key" style="background:#8fbf8f"></span>finished'
              '<span class="key" style="background:#9467bd"></span>finished under mixed versions'
              '<span class="key" style="background:#d62728"></span>aborted'
              '<span class="key" style="background:#f5a623;opacity:.5"></span>paused'
              '<span class="key" style="background:#1f77b4;opacity:.6"></span>transfer</span>')
    return (f'<p class="legend">{escape(note)}</p>{legend}<svg viewBox="0 0 {width} {y}" width="{width}" '
            f'height="{y}" xmlns="http://www.w3.org/2000/svg">{"".join(out)}</svg>')


def _charts(names: Sequence[str], tables: Sequence[CostTable]) -> str:
    def chart(title: str, key: str, what: str) -> str:
        n = max(len(t.series.get(key, [])) for t in tables)
        series = [(name, t.series.get(key, []) + [0.0] * (n - len(t.series.get(key, []))), _CLASSES[i % 4])
                  for i, (name, t) in enumerate(zip(names, tables))]
        return bar_chart(title, [f"{what}{i}" for i in range(n)], series)

    return "".join([chart("aborts per update", "aborts", "u"),
                    chart("requests decoding at the update", "decoding", "u"),
                    chart("groups discarded per step", "groups_discarded", "s"),
                    chart("raw samples per step", "raw", "s"), chart("consumable samples per step", "consumable", "s"),
                    chart("train wait per step (s)", "train_wait_s", "s"),
                    chart("trained groups by staleness (versions)", "staleness", "")])


def render_html(names: Sequence[str], runs: Sequence[ReplayRun], tables: Sequence[CostTable]) -> str:
    """The report: the configuration, the side-by-side table, the checkers, cost charts and the timelines."""
    config = runs[0].config.to_dict()
    head = "".join(f"<th>{escape(n)}</th>" for n in names)
    body = "".join(f"<tr><td>{escape(label)}</td>" + "".join(f"<td>{escape(dict(t.rows())[label])}</td>"
                                                              for t in tables) + "</tr>"
                   for label, _ in tables[0].rows())
    checks = sorted({k for r in runs for k in r.verdicts})
    verdicts = "".join(f"<tr><td>{escape(c)}</td>" + "".join(
        f'<td class="{r.verdicts[c].status}" title="{escape(chr(10).join(r.verdicts[c].witness[:5]))}">'
        f'{r.verdicts[c].status}</td>' if c in r.verdicts else "<td>–</td>" for r in runs) + "</tr>" for c in checks)
    runs_row = "".join(f"<td>{r.sim_s / 3600:.2f} h simulated in {r.wall_s:.1f} s wall ({r.cpu_s:.1f} s CPU)"
                       f"{'; broke: ' + escape(r.history.breaks[0].message) if r.broke else ''}</td>" for r in runs)
    timelines = "".join(f"<h3>{escape(n)}</h3>{timeline_svg(r.history)}" for n, r in zip(names, runs))
    conf = ", ".join(f"{k}={v}" for k, v in config.items())
    return (f'<!doctype html><html lang="en"><head><meta charset="utf-8"><title>weightsync replay</title>'
            f'<style>{_CSS}</style></head><body><h1>Production-scale replay in virtual time</h1>'
            f'<p>{escape(conf)}</p><h2>Cost</h2><table><tr><th></th>{head}</tr>{body}'
            f'<tr><td>run</td>{runs_row}</tr></table><h2>Checkers</h2><table><tr><th></th>{head}</tr>{verdicts}'
            f'</table><h2>Per step</h2><div class="charts">{_charts(names, tables)}</div>'
            f'<h2>Per-engine timeline (sampled)</h2>{timelines}</body></html>')


def to_json(names: Sequence[str], runs: Sequence[ReplayRun], tables: Sequence[CostTable]) -> dict[str, Any]:
    return {"config": runs[0].config.to_dict(), "integrations": [
        {"name": n, "integration": r.integration, "pause_mode": r.pause_mode, "sim_s": r.sim_s, "wall_s": r.wall_s,
         "cpu_s": r.cpu_s, "cost": dict(t.rows()), "series": t.series,
         "verdicts": {k: v.status for k, v in r.verdicts.items()}, "breaks": [b.message for b in r.history.breaks]}
        for n, r, t in zip(names, runs, tables)]}


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    specs = [args.integration, *args.vs]
    try:
        config = config_from(args)
        options = parse_options(args.integration_option)
        integrations = [load_integration(s, options if i == 0 else None) for i, s in enumerate(specs)]
    except (IntegrationError, ValueError) as exc:
        print(f"python -m reports.replay: {exc}", file=sys.stderr)
        return 2
    print(f"replay: seed {config.seed}, {config.engines} engines, {config.episodes_in_flight} episodes in flight, "
          f"{config.updates} updates, pause {config.pause_mode}", file=sys.stderr)
    runs = [replay(integ, config, None if args.no_progress else ProgressBar(spec))
            for integ, spec in zip(integrations, specs)]
    tables = [cost_table(r) for r in runs]
    names = [i.name if [j.name for j in integrations].count(i.name) == 1 else s for i, s in zip(integrations, specs)]
    print(table_text(names, runs, tables))
    for name, run in zip(names, runs):
        for b in run.history.breaks:
            print(f"{name} broke at t={b.t:.0f} s: {b.message}")
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "replay.json").write_text(json.dumps(to_json(names, runs, tables), indent=1))
    html = args.out / "replay.html"
    html.write_text(render_html(names, runs, tables))
    print(f"report: {html}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
