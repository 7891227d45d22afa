"""The Markdown summary of a result: fit for a CI step summary (GitHub ``$GITHUB_STEP_SUMMARY``)."""

from __future__ import annotations

from typing import Any

_CELL = {"pass": "✅", "fail": "❌", "unknown": "❔", "skipped": "⏭", "error": "💥"}
_MEASURED = ("I1-I2", "S3")


def render_markdown(result: dict[str, Any]) -> str:
    """The run, then per backend the invariant × scenario matrix, the measured costs and every case not passed."""
    run, cases = result["run"], result["cases"]
    integration = run["integration"]
    backends = sorted({c["backend"] for c in cases})
    name = integration.get("name") or integration["spec"]
    lines = [f"# Conformance: {name} on {', '.join(backends) or 'no backend'} "
             f"(SGLang {run['sglang_profile']}, seed {run['seed']}, {run['nodes']} node(s))", "",
             " · ".join(f"{_CELL[s]} {s} {n}" for s, n in result["summary"].items())]
    for backend in backends:
        mine = [c for c in cases if c["backend"] == backend]
        scenarios = sorted({c["scenario"] for c in mine})
        by_key = {(c["invariant"], c["scenario"]): c for c in mine}
        lines += ["", f"## {backend}", "", "| invariant | " + " | ".join(scenarios) + " |",
                  "|---|" + "---|" * len(scenarios)]
        for inv in sorted({c["invariant"] for c in mine}):
            cells = [_CELL[by_key[(inv, s)]["status"]] if (inv, s) in by_key else "" for s in scenarios]
            lines.append(f"| {inv} | " + " | ".join(cells) + " |")
    measured = [c for c in cases if c["invariant"] in _MEASURED and c.get("metrics")]
    if measured:
        lines += ["", "## Metrics", "", "| case | metrics |", "|---|---|"]
        for c in measured:
            shown = ", ".join(f"{k}={v:.3g}" if isinstance(v, float) else f"{k}={v}" for k, v in c["metrics"].items())
            lines.append(f"| {c['case']} | {shown} |")
    bad = [c for c in cases if c["status"] != "pass"]
    if bad:
        lines += ["", "## Not passed", ""]
        for c in bad:
            evidence = [w if isinstance(w, str) else str(w) for w in c.get("witness") or []] or [c.get("reason") or ""]
            lines.append(f"- **{c['case']}** ({c['status']}): " + "; ".join(evidence))
    return "\n".join(lines) + "\n"
