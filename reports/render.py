"""Write a conformance result as JSON and render it as a Markdown matrix (invariant × scenario)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

_CELL = {"pass": "✅", "fail": "❌", "unknown": "❔", "skipped": "⏭"}


def render_markdown(result: dict[str, Any]) -> str:
    """Invariant × scenario matrix, then the witness of every case that did not pass."""
    cases = result.get("cases", [])
    scenarios = sorted({c["scenario"] for c in cases})
    invariants = sorted({c["invariant"] for c in cases})
    by_key = {(c["invariant"], c["scenario"]): c for c in cases}
    counts = {s: sum(c["status"] == s for c in cases) for s in _CELL}
    lines = [f"# Conformance: {result.get('integration')} on {result.get('backend')} "
             f"(SGLang {result.get('sglang_profile')}, seed {result.get('seed')})", "",
             " · ".join(f"{_CELL[s]} {s} {n}" for s, n in counts.items()), "",
             "| invariant | " + " | ".join(scenarios) + " |", "|---|" + "---|" * len(scenarios)]
    for inv in invariants:
        cells = [_CELL[by_key[(inv, s)]["status"]] if (inv, s) in by_key else "" for s in scenarios]
        lines.append(f"| {inv} | " + " | ".join(cells) + " |")
    measured = [c for c in cases if c["invariant"] in ("I1-I2", "S3") and c.get("metrics")]
    if measured:
        lines += ["", "## Metrics", "", "| case | metrics |", "|---|---|"]
        for c in measured:
            shown = ", ".join(f"{k}={v:.3g}" if isinstance(v, float) else f"{k}={v}" for k, v in c["metrics"].items())
            lines.append(f"| {c['case']} | {shown} |")
    bad = [c for c in cases if c["status"] not in ("pass",)]
    if bad:
        lines += ["", "## Not passed", ""]
        for c in bad:
            lines.append(f"- **{c['case']}** ({c['status']}): " + "; ".join(c.get("witness") or [c.get("reason") or ""]))
    return "\n".join(lines) + "\n"


def write_report(path: Path, result: dict[str, Any]) -> None:
    """``path`` gets the JSON result, ``path.with_suffix('.md')`` the Markdown matrix."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=2, default=str))
    path.with_suffix(".md").write_text(render_markdown(result))
