"""The HTML report: one self-contained file (inline CSS, SVG and a little vanilla JS; nothing fetched at view time).

Sections: the run, the invariant × scenario matrix (each cell links to its case), every case that did not pass
with its witness (its "show" link highlights what the witness names in the scenario's timeline), the cost of each
scenario run, then per scenario run its timeline, its charts and its cases.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from html import escape
from pathlib import Path
from typing import Any

from .result import load_history
from .svg import bar_chart, timeline_svg
from .result import engine_label, witness_lines
from .timeline import OUTCOMES, Named, Timeline, build_timeline, named_in

_SYMBOL = {"pass": "✔", "fail": "✘", "unknown": "?", "skipped": "–", "error": "!"}
_NOT_PASSED = ("fail", "unknown", "error")


@dataclass
class ScenarioRun:
    """One history and the cases judged on it."""

    ref: str
    dom_id: str
    cases: list[dict[str, Any]]
    timeline: Timeline | None
    named: Named
    href: str = ""
    """The history file, linked from the page."""
    problem: str = ""
    """Why there is no timeline (the file is gone, or it could not be read)."""


def case_anchor(case: dict[str, Any]) -> str:
    return f"case-{case['backend']}-{case['case']}"


def _runs(result: dict[str, Any], result_path: Path | None) -> list[ScenarioRun]:
    by_ref: dict[str, list[dict[str, Any]]] = {}
    for c in result["cases"]:
        if c.get("history"):
            by_ref.setdefault(c["history"], []).append(c)
    runs = []
    failing_first = sorted(by_ref.items(), key=lambda kv: (all(c["status"] not in _NOT_PASSED for c in kv[1]), kv[0]))
    for i, (ref, cases) in enumerate(failing_first):
        history = load_history(result_path, ref) if result_path is not None else None
        try:
            timeline = build_timeline(history) if history is not None else None
        except Exception as exc:  # a history this renderer cannot read must not cost the rest of the report
            timeline, problem = None, f"{type(exc).__name__}: {exc}"
        else:
            problem = "" if history is not None else "not available"
        named = Named()
        for c in cases:
            if c["status"] in _NOT_PASSED:
                named.update(named_in(c, timeline))
        runs.append(ScenarioRun(ref, f"tl{i}", cases, timeline, named, ref, problem))
    return runs


def render_html(result: dict[str, Any], result_path: Path | None = None, html_dir: Path | None = None) -> str:
    """The report page for ``result``; histories are read relative to ``result_path`` and linked relative to
    ``html_dir`` (where the page is written; default: beside the result)."""
    runs = _runs(result, result_path)
    if result_path is not None and html_dir is not None:
        for r in runs:
            r.href = Path(os.path.relpath(result_path.parent / r.ref, html_dir)).as_posix()
    run_of = {id(c): r for r in runs for c in r.cases}
    cases = result["cases"]
    parts = [_head(result), f'<div class="top">{_matrix(cases)}{_not_passed(cases, run_of)}</div>', _costs(runs)]
    parts += [_scenario_section(r) for r in runs]
    orphans = [c for c in cases if not c.get("history")]
    if orphans:
        parts.append('<section><h2>Cases without a history</h2><p class="note">Skipped cases, and tests that broke '
                     'before their scenario produced a history.</p>' + _case_table(orphans) + "</section>")
    return (f'<!DOCTYPE html><html lang="en"><head><meta charset="utf-8"><title>{escape(_title(result))}</title>'
            f'<meta name="viewport" content="width=device-width, initial-scale=1"><style>{_CSS}</style></head>'
            f'<body>{"".join(parts)}<script>{_JS}</script></body></html>')


def _title(result: dict[str, Any]) -> str:
    integration = result["run"]["integration"]
    return f"Conformance: {integration.get('name') or integration['spec']}"


def _head(result: dict[str, Any]) -> str:
    run, summary = result["run"], result["summary"]
    integration = run["integration"]
    backends = sorted({c["backend"] for c in result["cases"]}) or ["none"]
    chips = "".join(f'<span class="chip st-{s}">{_SYMBOL[s]} {n} {s}</span>' for s, n in summary.items())
    facts = [("integration", f"{integration.get('name')} ({integration['spec']})"),
             ("backend", ", ".join(backends)), ("engines", engine_label(run)), ("nodes", run["nodes"]),
             ("seed", run["seed"]), ("markers", run["markers"]), ("xdist workers", run["workers"]),
             ("exit status", run["exit_status"]), ("written", result["created"]),
             *((f"{k} version", v) for k, v in run["versions"].items())]
    options = integration.get("options") or {}
    caps = integration.get("capabilities")
    return (f'<header><h1>{escape(_title(result))}</h1><p class="sub">on {escape(", ".join(backends))} · '
            f'{escape(engine_label(run))} · seed {run["seed"]} · {run["nodes"]} node(s)</p>'
            f'<p>{chips}</p><details><summary>Run details</summary><table class="kv">'
            + "".join(f"<tr><th>{escape(k)}</th><td>{escape(str(v))}</td></tr>" for k, v in facts)
            + (f"<tr><th>options</th><td>{escape(json.dumps(options))}</td></tr>" if options else "")
            + (f"<tr><th>capabilities</th><td><code>{escape(json.dumps(caps))}</code></td></tr>" if caps else "")
            + "</table></details></header>")


def _matrix(cases: list[dict[str, Any]]) -> str:
    out = ['<section id="matrix"><h2>Invariant × scenario</h2>']
    for backend in sorted({c["backend"] for c in cases}):
        mine = [c for c in cases if c["backend"] == backend]
        scenarios = sorted({c["scenario"] for c in mine})
        invariants = sorted({c["invariant"] for c in mine})
        by_key = {(c["invariant"], c["scenario"]): c for c in mine}
        out.append(f'<h3>backend {escape(backend)}</h3><div class="scroll"><table class="matrix"><thead><tr>'
                   '<th>invariant</th>' + "".join(f'<th class="rot"><div>{escape(s)}</div></th>' for s in scenarios)
                   + "</tr></thead><tbody>")
        for inv in invariants:
            cells = []
            for s in scenarios:
                c = by_key.get((inv, s))
                cells.append("<td></td>" if c is None else
                             f'<td class="st-{c["status"]}"><a href="#{case_anchor(c)}" title="{escape(c["case"])}: '
                             f'{c["status"]}">{_SYMBOL[c["status"]]}</a></td>')
            out.append(f"<tr><th>{escape(inv)}</th>{''.join(cells)}</tr>")
        out.append("</tbody></table></div>")
    if not cases:
        out.append("<p>No conformance case ran.</p>")
    out.append("</section>")
    return "".join(out)


def _witness(c: dict[str, Any], shown: int = 4) -> str:
    """The anomalies' sentences (or the skip reason); past the first ``shown``, folded."""
    lines = witness_lines(c) or ([c["reason"]] if c.get("reason") else [])
    items = [f"<li>{escape(w)}</li>" for w in lines]
    more = (f'<details><summary>{len(items) - shown} more</summary><ul class="witness">{"".join(items[shown:])}</ul>'
            f'</details>') if len(items) > shown else ""
    return f'<ul class="witness">{"".join(items[:shown])}</ul>{more}'


def _not_passed(cases: list[dict[str, Any]], run_of: dict[int, ScenarioRun]) -> str:
    bad = [c for c in cases if c["status"] in _NOT_PASSED]
    if not bad:
        return '<section id="failures"><h2>Every case that ran passed</h2></section>'
    out = [f'<section id="failures"><h2>Not passed ({len(bad)})</h2><div class="list">']
    for c in bad:
        run = run_of.get(id(c))
        show = ""
        if run is not None and run.timeline is not None:
            named = named_in(c, run.timeline)
            show = (f' <a class="show" href="#{run.dom_id}" data-hl="{escape(json.dumps(named.as_json()))}">'
                    f'show in the timeline of {escape(c["scenario"])}</a>')
        details = c.get("details") or {}
        broke = f' <span class="note">(the run broke; the checker alone answered ' \
                f'{escape(str(details.get("checker_status")))})</span>' if details.get("run_broke") else ""
        out.append(f'<div class="case-bad st-{c["status"]}"><b><a href="#{case_anchor(c)}">{escape(c["case"])}</a></b> '
                   f'<span class="chip st-{c["status"]}">{c["status"]}</span>{broke} on {escape(c["backend"])}{show}'
                   f'{_witness(c, shown=2)}</div>')
    out.append("</div></section>")
    return "".join(out)


def _rate(n: int, d: int) -> str:
    return f"{n}/{d} ({n / d:.0%})" if d else "0"


def _costs(runs: list[ScenarioRun]) -> str:
    rows = []
    for r in runs:
        t = r.timeline
        if t is None:
            continue
        mine = [q for q in t.requests if q.origin == "integration"]
        counts = {o: sum(q.outcome == o for q in mine) for o in OUTCOMES}
        continued = sum(q.outcome == "aborted" and q.continued_by is not None for q in mine)
        resident = [p.resident.get("integration", 0) for p in t.pauses if p.cycle is not None]
        stale = t.staleness
        rows.append(f'<tr><td><a href="#{r.dom_id}">{escape(t.scenario)}</a>{_worker(r)}</td><td>{len(mine)}</td>'
                    f'<td class="{"bad" if counts["aborted"] else ""}">{_rate(counts["aborted"], len(mine))}'
                    f'{f" ({continued} continued)" if continued else ""}</td>'
                    f'<td>{counts["spanning"]}</td><td>{counts["injected"]}</td>'
                    f'<td class="{"bad" if counts["open"] + counts["failed"] else ""}">{counts["open"]} / '
                    f'{counts["failed"]}</td><td>{counts["dropped"]}</td>'
                    f'<td>{sum(bool(c.get("ok", True)) for c in t.cycles)}/{len(t.cycles)}</td>'
                    f'<td>{min(resident) if resident else "–"}</td>'
                    f'<td>{f"{max(stale)} / {sum(stale) / len(stale):.2f}" if stale else "–"}</td>'
                    f'<td>{len(stale)}</td></tr>')
    if not rows:
        return ""
    return ('<section id="cost"><h2>Cost per scenario run</h2><div class="scroll"><table class="cost"><thead><tr>'
            '<th>scenario</th><th>requests</th><th>aborted by the engine</th><th>spanning an update</th>'
            '<th>aborted by injected faults</th><th>still open / error status</th><th>given up by the client</th>'
            '<th>cycles ok</th>'
            '<th>fewest of its requests decoding at a pause (per engine)</th><th>staleness max / mean</th>'
            '<th>groups consumed</th></tr></thead><tbody>' + "".join(rows) + "</tbody></table></div></section>")


def _worker(r: ScenarioRun) -> str:
    worker = r.cases[0].get("worker")
    return f' <span class="note">({escape(worker)})</span>' if worker else ""


def _legend() -> str:
    items = [f'<span class="key o-{o}"></span>{o}' for o in OUTCOMES]
    items += ['<span class="key s o-finished"></span>suite sentinel']
    items += [f'<span class="key m-{m}"></span>paused: {m}' for m in ("abort", "retract", "in_place")]
    items += ['<span class="key cy"></span>update cycle', '<span class="key k-version"></span>version change',
              '<span class="key k-transfer"></span>transfer', '<span class="key unpub"></span>unpublished weights (P8)',
              '<span class="key hl"></span>named by a witness']
    return '<p class="legend">' + " ".join(f"<span>{i}</span>" for i in items) + "</p>"


def _charts(t: Timeline) -> str:
    cycles = [f"c{c.index}" for c in t.costs]
    groups = t.groups
    resident = [(f"{g} (integration)", [c.resident.get(g, {}).get("integration", 0) for c in t.costs], f"g{i % 4}")
                for i, g in enumerate(groups)]
    sentinel = [(f"{g} (sentinel)", [c.resident.get(g, {}).get("sentinel", 0) for c in t.costs], f"g{i % 4} s")
                for i, g in enumerate(groups) if any(c.resident.get(g, {}).get("sentinel") for c in t.costs)]
    rates = [(g, [c.aborted.get(g, 0) / c.in_flight[g] if c.in_flight.get(g) else 0.0 for c in t.costs], f"g{i % 4}")
             for i, g in enumerate(groups)]
    rate_labels = [[f"{c.aborted.get(g, 0)}/{c.in_flight.get(g, 0)}" for c in t.costs] for g in groups]
    values = sorted(set(t.staleness) | ({t.max_staleness} if t.max_staleness is not None else set()))
    span = list(range(min(values), max(values) + 1)) if values else []
    hist = [("groups", [t.staleness.count(v) for v in span], "g0")]
    bound = (span.index(t.max_staleness) + 1.0, f"bound {t.max_staleness}") \
        if t.max_staleness is not None and t.max_staleness in span else None
    return ('<div class="charts">'
            + bar_chart("Requests decoding at each pause", cycles, resident + sentinel, empty="no pause")
            + bar_chart("Aborted requests per update (rate)", cycles, rates, labels=rate_labels, y_max=1.0,
                        empty="no update cycle")
            + bar_chart("Staleness of consumed groups", [str(v) for v in span], hist, marker=bound,
                        empty="no consumed group with a known version")
            + "</div>")


def _scenario_section(r: ScenarioRun) -> str:
    head = f'<section class="scenario" id="sec-{r.dom_id}"><h2>{escape(r.cases[0]["scenario"])}{_worker(r)}</h2>'
    if r.timeline is None:
        return (head + f'<p class="note">history {escape(r.ref)}: {escape(r.problem)}</p>'
                + _case_table(r.cases) + "</section>")
    t = r.timeline
    breaks = "".join(f'<div class="break-note"><b>{escape(str(b.get("kind")))}</b>: {escape(str(b.get("message")))}'
                     + "".join(f'<br>open call: engine {c.get("engine")} {escape(str(c.get("method")))} '
                               f'{escape(str(c.get("path")))} since t={c.get("since", 0):.3f}s '
                               f'({escape(str(c.get("origin")))})'
                               for c in (b.get("open_calls") or [])[:8] if isinstance(c, dict))
                     + "</div>" for b in t.breaks)
    return (head + breaks + _legend() + f'<div class="scroll">{timeline_svg(t, r.named, r.dom_id)}</div>'
            + _charts(t) + _case_table(r.cases)
            + f'<p class="note">history: <a href="{escape(r.href)}">{escape(r.ref)}</a> (beside the result)</p>'
            + "</section>")


def _case_table(cases: list[dict[str, Any]]) -> str:
    rows = []
    for c in sorted(cases, key=lambda c: c["case"]):
        metrics = ", ".join(f"{k}={v:.3g}" if isinstance(v, float) else f"{k}={v}"
                            for k, v in (c.get("metrics") or {}).items())
        rows.append(f'<tr id="{case_anchor(c)}" class="st-{c["status"]}"><td>{escape(c["case"])}</td>'
                    f'<td>{_SYMBOL[c["status"]]} {c["status"]}</td><td>{escape(metrics)}</td>'
                    f'<td>{_witness(c) if c["status"] != "pass" else ""}</td></tr>')
    return ('<table class="cases"><thead><tr><th>case</th><th>verdict</th><th>metrics</th><th>witness / reason</th>'
            '</tr></thead><tbody>' + "".join(rows) + "</tbody></table>")


_CSS = """
body{font:14px/1.4 system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:16px 24px;color:#1d2330;background:#fff}
h1{font-size:22px;margin:0 0 2px}h2{font-size:18px;margin:22px 0 8px;border-bottom:1px solid #dde}
h3{font-size:14px;margin:8px 0}.sub{color:#556;margin:0 0 6px}.note{color:#667;font-size:12px}
.chip{display:inline-block;padding:1px 8px;border-radius:10px;margin-right:6px;font-size:13px}
.st-pass{background:#d9f2e0}.st-fail{background:#f8d4d4}.st-unknown{background:#fbefc9}.st-skipped{background:#ececec}
.st-error{background:#f3c0e6}table{border-collapse:collapse}td,th{padding:2px 6px}
.kv th{text-align:left;color:#556;font-weight:normal}.scroll{overflow-x:auto}
.matrix td{text-align:center;border:1px solid #fff;min-width:22px}
.matrix td a{text-decoration:none;color:#1d2330;display:block}.matrix th{text-align:left;font-weight:600}
.matrix th.rot{height:120px;vertical-align:bottom;padding:0}
.matrix th.rot div{writing-mode:vertical-rl;transform:rotate(180deg);font-weight:normal;font-size:12px;padding:2px}
.cost td,.cost th,.cases td,.cases th{border-bottom:1px solid #eef;text-align:left;vertical-align:top}
.cost{font-size:12px}.cost th{font-weight:600}.cost td:first-child{white-space:nowrap}
td.bad{color:#b42318;font-weight:600}.cases{width:100%;font-size:13px}.cases td:first-child{white-space:nowrap}
.top{display:flex;flex-wrap:wrap;gap:0 32px;align-items:flex-start}.top>section{flex:0 1 auto;min-width:0}
#failures{flex:1 1 520px}#failures .list{max-height:640px;overflow-y:auto}
.case-bad{padding:6px 10px;margin:6px 0;border-radius:6px}
.witness{margin:4px 0 0;padding-left:20px;font-family:ui-monospace,Menlo,monospace;font-size:12px}
.show{font-size:12px;margin-left:8px}
.break-note{background:#f8d4d4;padding:4px 8px;border-radius:4px;margin:4px 0;font-size:13px}
.legend{font-size:12px;color:#445}.legend>span{margin-right:12px;white-space:nowrap}
.key{display:inline-block;width:14px;height:9px;margin-right:4px;vertical-align:middle;border:1px solid #889}
svg text{font-size:10px;fill:#334}.tick{text-anchor:middle;fill:#667}.grid{stroke:#eef;stroke-width:1}
.lane-label{font-weight:600;font-size:11px}.node-label{font-size:9px;fill:#667}.lane-bg{fill:none}
.lane.hl .lane-bg,.lane.focus .lane-bg{fill:#fff0f0;stroke:#d64545;stroke-width:1}.lane.hl .lane-label{fill:#b42318}
.o-finished{fill:#4c9a6a;background:#4c9a6a}.o-spanning{fill:#3b7dd8;background:#3b7dd8}
.o-aborted{fill:#d64545;background:#d64545}.o-injected{fill:#a57cc9;background:#a57cc9}
.o-failed{fill:#e08a1e;background:#e08a1e}.o-dropped{fill:#b8bcc8;background:#b8bcc8}
.o-open{fill:#222;background:#222}.rq.s{fill-opacity:.35;stroke:#556;stroke-width:.6;stroke-dasharray:2 1}
.rq.continued{fill-opacity:.5}.key.s{opacity:.45}
.m-abort{fill:#d64545;fill-opacity:.16;background:rgba(214,69,69,.16)}
.m-retract{fill:#e6a028;fill-opacity:.2;background:rgba(230,160,40,.2)}
.m-in_place{fill:#3b7dd8;fill-opacity:.14;background:rgba(59,125,216,.14)}
.pause.open{stroke:#d64545;stroke-dasharray:4 2}
.unpub{fill:#d64545;fill-opacity:.08;stroke:#d64545;stroke-width:.8;stroke-dasharray:1 2}.unpub.served{fill-opacity:.24}
.key.unpub{background:rgba(214,69,69,.24);outline:1px dotted #d64545}
.cy{fill:#000;fill-opacity:.045;stroke:#99a;stroke-width:.6}
.key.cy{background:rgba(0,0,0,.08)}.cy.failed{stroke:#d64545;stroke-dasharray:4 2;stroke-width:1}
.cylabel{fill:#556;font-size:9px}.k-version line{stroke:#7b3fb5;stroke-width:1.4}
.k-version text{fill:#7b3fb5;font-weight:600}.key.k-version{background:#7b3fb5}.k-transfer{fill:#1d2330}
.key.k-transfer{background:#1d2330}.k-flush{fill:#e6a028}.k-session{fill:#99a}.k-abort{fill:#d64545}
.k-other{fill:#bbb}.mk.bad{fill:#d64545}.mk.bad line{stroke:#d64545;stroke-dasharray:3 2}.batch{fill:#1d2330}
.injected{fill:#a57cc9;stroke:#5b2c83}.break line{stroke:#b42318;stroke-width:2}
.break text{fill:#b42318;font-weight:700}.rq.hl{stroke:#111;stroke-width:1.6;fill-opacity:1}
.key.hl{background:#fff;border:2px solid #111}.cy.hl{stroke:#b42318;stroke-width:2;fill:#d64545;fill-opacity:.07}
.focus{stroke:#ff00aa!important;stroke-width:2.6!important}.named-t{stroke:#b42318;stroke-dasharray:2 2}
.charts{display:flex;flex-wrap:wrap;gap:10px;margin:6px 0}
.chart{border:1px solid #eef;border-radius:4px;margin:0;padding:2px}.chart-keys{font-size:11px;max-width:372px}
.chart-keys>span{margin-right:10px;white-space:nowrap}.key.bar{border:none}.key.bar.g0{background:#3b7dd8}
.key.bar.g1{background:#e6a028}.key.bar.g2{background:#4c9a6a}.key.bar.g3{background:#7b3fb5}.key.bar.s{opacity:.4}
.chart-title{font-weight:600;font-size:11px}.axis{stroke:#99a}.bound{stroke:#b42318;stroke-dasharray:3 2}
.empty{text-anchor:middle;fill:#99a}.val{text-anchor:middle;font-size:9px}.bar.g0{fill:#3b7dd8}.bar.g1{fill:#e6a028}
.bar.g2{fill:#4c9a6a}.bar.g3{fill:#7b3fb5}.bar.s{fill-opacity:.35}
"""

_JS = """
(function () {
  function mark(root, selector) {
    root.querySelectorAll(selector).forEach(function (el) { el.classList.add('focus'); });
  }
  function focus(id, hl) {
    document.querySelectorAll('.focus').forEach(function (el) { el.classList.remove('focus'); });
    var svg = document.getElementById(id);
    if (!svg) { return; }
    hl.r.forEach(function (rid) { mark(svg, '[data-rid~="' + CSS.escape(rid) + '"]'); });
    hl.e.forEach(function (e) { mark(svg, '.lane[data-e="' + e + '"]'); });
    hl.c.forEach(function (c) { mark(svg, '.cy[data-c="' + c + '"]'); });
  }
  document.addEventListener('click', function (ev) {
    var a = ev.target.closest ? ev.target.closest('a[data-hl]') : null;
    if (a) { focus(a.getAttribute('href').slice(1), JSON.parse(a.getAttribute('data-hl'))); }
  });
})();
"""
