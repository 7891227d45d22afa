"""Inline SVG for the HTML report: a scenario's timeline (one lane per engine) and small bar charts.

Plain strings, no plotting library: the report must open anywhere, offline, in one file. Styling lives in the
page's CSS (classes ``o-<outcome>``, ``m-<mode>``, ``k-<mark kind>``), so the drawing holds only geometry.
"""

from __future__ import annotations

from html import escape
from typing import Sequence

from .timeline import Named, Timeline

WIDTH = 1160
LABEL_W = 118
_TOP = 20          # time axis
_TRAINER_H = 24    # cycles, consumed batches, injected faults, breaks
_MARK_H = 13       # control calls of an engine (version bumps, transfers, flushes)
_MAX_ROWS_H = 150  # request rows of one lane never take more than this


def _fmt_t(t: float) -> str:
    return f"{t:.3f}".rstrip("0").rstrip(".") if abs(t) < 100 else f"{t:.1f}"


def _ticks(t_end: float, n: int = 8) -> list[float]:
    raw = t_end / n
    step = next(s for s in (0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1, 2, 5, 10, 20, 50, 100, 1e9)
                if s >= raw)
    return [i * step for i in range(int(t_end / step) + 1)]


def timeline_svg(t: Timeline, named: Named, dom_id: str) -> str:
    """The timeline of one scenario run; what ``named`` names (failing witnesses) carries the class ``hl``."""
    plot_w = WIDTH - LABEL_W - 8
    t_end = t.t_end * 1.01

    def x(time: float | None) -> float:
        return LABEL_W + plot_w * (min(time if time is not None else t_end, t_end) / t_end)

    rows = {e: max(4 if t.node_of(e) else 3, 1 + max([r.row for r in t.requests if r.engine == e], default=-1))
            for e in range(t.engines)}
    row_h = {e: max(2.0, min(9.0, _MAX_ROWS_H / n)) for e, n in rows.items()}
    lane_y: dict[int, float] = {}
    y = _TOP + _TRAINER_H
    for e in range(t.engines):
        lane_y[e] = y
        y += _MARK_H + max(1, rows[e]) * row_h[e] + 8
    height = y + 4
    out = [f'<svg id="{dom_id}" class="timeline" viewBox="0 0 {WIDTH} {height:.0f}" width="{WIDTH}" '
           f'height="{height:.0f}" xmlns="http://www.w3.org/2000/svg" role="img" '
           f'aria-label="timeline of {escape(t.scenario)}">']
    # time axis
    for tick in _ticks(t.t_end):
        out.append(f'<line class="grid" x1="{x(tick):.1f}" x2="{x(tick):.1f}" y1="{_TOP - 4}" y2="{height:.0f}"/>'
                   f'<text class="tick" x="{x(tick):.1f}" y="{_TOP - 7}">{_fmt_t(tick)} s</text>')
    # update cycles across every lane
    for c in t.cycles:
        i = c.get("index")
        cls = "cy" + ("" if c.get("ok", True) else " failed") + (" hl" if i in named.cycles else "")
        ver = f" → v{c.get('returned')}" if c.get("returned") is not None else ""
        title = (f"update cycle {i}: {c.get('transport', '?')}{' LoRA' if c.get('lora') else ''}, pause "
                 f"{c.get('pause_mode', '?')}, cell {c.get('cell', '?')}, "
                 f"{_fmt_t(c['t_start'])}–{_fmt_t(c['t_end'])} s, "
                 + ("ok" + ver if c.get("ok", True) else f"failed: {c.get('error')}")
                 + (" (failure expected)" if c.get("expect_failure") else ""))
        out.append(f'<rect class="{cls}" data-c="{i}" x="{x(c["t_start"]):.1f}" y="{_TOP}" '
                   f'width="{max(1.0, x(c["t_end"]) - x(c["t_start"])):.1f}" height="{height - _TOP - 2:.0f}">'
                   f'<title>{escape(title)}</title></rect>'
                   f'<text class="cylabel" x="{x(c["t_start"]) + 2:.1f}" y="{_TOP + 9}">c{i}{escape(ver)}</text>')
    out.append(f'<text class="lane-label" x="4" y="{_TOP + 15}">trainer</text>')
    for b in t.batches:
        out.append(f'<path class="batch" d="M{x(b.get("t", 0)):.1f},{_TOP + 13} l3,4 l-3,4 l-3,-4 z">'
                   f'<title>batch {b.get("index")} consumed at t={_fmt_t(b.get("t", 0))} s, version '
                   f'{b.get("published_truth")}</title></path>')
    sentinels = {rid for r in t.requests if r.origin != "integration" for rid in r.rids}
    for inj in (i for i in t.injected if i.get("rid") not in sentinels):  # a sentinel's end shows on its bar
        what = f"injected by the suite: {inj.get('kind')} {inj.get('detail', '')} (engine {inj.get('engine')})"
        out.append(f'<path class="injected" d="M{x(inj.get("t", 0)):.1f},{_TOP + 12} l4,9 l-8,0 z">'
                   f'<title>{escape(what)} at t={_fmt_t(inj.get("t", 0))} s</title></path>')
    for b in (b for b in t.breaks if isinstance(b.get("t"), (int, float))):
        bx = x(b.get("t", 0))
        out.append(f'<g class="break"><line x1="{bx:.1f}" x2="{bx:.1f}" y1="{_TOP}" y2="{height:.0f}"/>'
                   f'<text x="{bx + 3:.1f}" y="{_TOP + 21}">{escape(str(b.get("kind", "broken")))}</text>'
                   f'<title>{escape(str(b.get("kind")))}: {escape(str(b.get("message")))}</title></g>')
    for e in range(t.engines):
        out.append(_lane(t, e, lane_y[e], row_h[e], rows[e], x, named))
    for time in sorted(named.times) if len(named.times) <= 6 else []:  # more would hide the timeline
        out.append(f'<line class="named-t" x1="{x(time):.1f}" x2="{x(time):.1f}" y1="{_TOP}" y2="{height:.0f}">'
                   f'<title>named by a witness: t={_fmt_t(time)} s</title></line>')
    out.append("</svg>")
    return "".join(out)


def _lane(t: Timeline, e: int, y0: float, rh: float, rows: int, x, named: Named) -> str:
    lane_h = _MARK_H + max(1, rows) * rh + 4
    node = t.node_of(e)
    hl = " hl" if e in named.engines else ""
    out = [f'<g class="lane{hl}" data-e="{e}"><rect class="lane-bg" x="0" y="{y0 - 2:.1f}" width="{WIDTH}" '
           f'height="{lane_h + 2:.1f}"/><text class="lane-label" x="4" y="{y0 + 10:.1f}">engine {e}</text>'
           + (f'<text class="node-label" x="4" y="{y0 + 21:.1f}">node {escape(node)}<title>node '
              f'{escape(str(t.nodes[e]))}</title></text>' if node is not None else "")]
    for p in (p for p in t.pauses if p.engine == e):
        resident = ", ".join(f"{n} {origin}" for origin, n in p.resident.items()) or "none"
        end = "never continued" if p.t1 is None else f"continued at t={_fmt_t(p.t1)} s"
        out.append(f'<rect class="pause m-{escape(p.mode)}{"" if p.t1 is not None else " open"}" '
                   f'x="{x(p.t0):.1f}" y="{y0:.1f}" width="{max(1.0, x(p.t1) - x(p.t0)):.1f}" height="{lane_h:.1f}">'
                   f'<title>engine {e} paused ({escape(p.mode)}; {escape(p.how)}) '
                   f'at t={_fmt_t(p.t0)} s, {end}; requests resident: {escape(resident)}</title></rect>')
    for u in (u for u in t.unpublished if u.engine == e):
        end = "to the end of the run" if u.t1 is None else f"until the load at t={_fmt_t(u.t1)} s"
        served = (f"served {len(u.served)} of the integration's requests on them ({escape(', '.join(u.served[:4]))}"
                  f"{', …' if len(u.served) > 4 else ''})" if u.served else "served nothing on them")
        out.append(f'<rect class="unpub{" served" if u.served else ""}" x="{x(u.t0):.1f}" y="{y0:.1f}" '
                   f'width="{max(1.0, x(u.t1) - x(u.t0)):.1f}" height="{lane_h:.1f}"><title>engine {e} held weights '
                   f'of no published version after failed cycle {u.cycle}, from t={_fmt_t(u.t0)} s {end}; '
                   f'{served}</title></rect>')
    for r in (r for r in t.requests if r.engine == e):
        rid = " ".join(r.rids)
        cls = f"rq o-{r.outcome}" + (" s" if r.origin != "integration" else "") + \
            (" continued" if r.continued_by else "") + (" hl" if named.rids.intersection(r.rids) else "")
        versions = "→".join(r.versions) or "?"
        span = f"{_fmt_t(r.t0)}–{_fmt_t(r.t1)} s" if r.t1 is not None else f"{_fmt_t(r.t0)} s – no answer"
        cycles = f", in flight during cycle {', '.join(map(str, r.cycles))}" if r.cycles else ""
        cycles += f", continued by {r.continued_by}" if r.continued_by else ""
        out.append(f'<rect class="{cls}" data-rid="{escape(rid)}" x="{x(r.t0):.1f}" '
                   f'y="{y0 + _MARK_H + r.row * rh:.1f}" '
                   f'width="{max(1.0, x(r.t1) - x(r.t0)):.1f}" height="{max(1.0, rh - 1):.1f}">'
                   f'<title>{escape(rid or f"#{r.seq}")} ({r.origin}) engine {e}: {span}, {r.outcome}, versions '
                   f'{escape(versions)}, {r.tokens} tokens{cycles}</title></rect>')
    for m in (m for m in t.marks if m.engine == e):
        mx = x(m.t)
        cls = f"mk k-{m.kind}" + ("" if m.ok else " bad")
        if m.kind == "version":
            out.append(f'<g class="{cls}"><line x1="{mx:.1f}" x2="{mx:.1f}" y1="{y0:.1f}" y2="{y0 + lane_h:.1f}"/>'
                       f'<text x="{mx + 2:.1f}" y="{y0 + 9:.1f}">{escape(m.label)}</text>'
                       f'<title>{escape(m.detail)}</title></g>')
        else:
            out.append(f'<rect class="{cls}" x="{mx - 2:.1f}" y="{y0 + 2:.1f}" width="4" height="8">'
                       f'<title>{escape(m.detail)}</title></rect>')
    out.append("</g>")
    return "".join(out)


def bar_chart(title: str, categories: Sequence[str], series: Sequence[tuple[str, Sequence[float], str]], *,
              labels: Sequence[Sequence[str]] | None = None, y_max: float | None = None,
              marker: tuple[float, str] | None = None, empty: str = "nothing to show") -> str:
    """Grouped bars: one group per category, one bar per series (name, values, CSS class); ``labels`` (per
    series, per category) are printed above the bars; ``marker`` draws a dashed line at a category position."""
    w, h, left, bottom, top = 372, 150, 34, 18, 22
    out = [f'<svg viewBox="0 0 {w} {h}" width="{w}" height="{h}" xmlns="http://www.w3.org/2000/svg">'
           f'<text class="chart-title" x="4" y="13">{escape(title)}</text>']
    values = [v for _, vs, _ in series for v in vs]
    if not categories or not values:
        out.append(f'<text class="empty" x="{w / 2}" y="{h / 2}">{escape(empty)}</text></svg>')
        return '<figure class="chart">' + "".join(out) + "</figure>"
    top_v = y_max or max(values) or 1.0
    plot_w, plot_h = w - left - 6, h - bottom - top
    slot = plot_w / len(categories)
    bar_w = max(1.0, min(26.0, (slot - 4) / max(1, len(series))))
    out.append(f'<line class="axis" x1="{left}" x2="{w - 6}" y1="{top + plot_h}" y2="{top + plot_h}"/>'
               f'<text class="tick" x="{left - 3}" y="{top + 4}" text-anchor="end">{top_v:.3g}</text>'
               f'<text class="tick" x="{left - 3}" y="{top + plot_h}" text-anchor="end">0</text>')
    step = max(1, len(categories) // 12)
    for i, cat in enumerate(categories):
        cx = left + slot * i + slot / 2
        if i % step == 0:
            out.append(f'<text class="tick" x="{cx:.1f}" y="{top + plot_h + 12}">{escape(cat)}</text>')
        for j, (name, vs, cls) in enumerate(series):
            v = vs[i]
            bh = plot_h * min(v, top_v) / top_v
            bx = cx - bar_w * len(series) / 2 + j * bar_w
            text = labels[j][i] if labels else f"{v:.3g}"
            out.append(f'<rect class="bar {cls}" x="{bx:.1f}" y="{top + plot_h - bh:.1f}" width="{bar_w - 1:.1f}" '
                       f'height="{bh:.1f}"><title>{escape(name)} · {escape(cat)}: {escape(text)}</title></rect>')
            if labels and len(categories) * len(series) <= 16:
                out.append(f'<text class="val" x="{bx + bar_w / 2:.1f}" y="{top + plot_h - bh - 2:.1f}">'
                           f'{escape(text)}</text>')
    if marker is not None:
        mx = left + slot * marker[0]
        out.append(f'<line class="bound" x1="{mx:.1f}" x2="{mx:.1f}" y1="{top}" y2="{top + plot_h}"/>'
                   f'<text class="tick" x="{mx - 3:.1f}" y="{top + 8}" text-anchor="end">{escape(marker[1])}</text>')
    out.append("</svg>")
    if len(series) > 1:
        keys = "".join(f'<span><span class="key bar {cls}"></span>{escape(name)}</span>' for name, _, cls in series)
        out.append(f'<div class="chart-keys">{keys}</div>')
    return '<figure class="chart">' + "".join(out) + "</figure>"
