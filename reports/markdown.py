"""The Markdown summary of a result: fit for a CI step summary (GitHub ``$GITHUB_STEP_SUMMARY``)."""

from __future__ import annotations

from typing import Any

from .result import engine_label, undeclared_line, witness_lines

_CELL = {"pass": "✅", "fail": "❌", "unknown": "❔", "skipped": "⏭", "error": "💥"}


def render_markdown(result: dict[str, Any]) -> str:
    """The run, then per backend the invariant × scenario matrix, the measured costs and every case not passed."""
    run, cases = result["run"], result["cases"]
    integration = run["integration"]
    backends = sorted({c["backend"] for c in cases})
    name = integration.get("name") or integration["spec"]
    preflight = result.get("preflight") or []
    where = ", ".join(backends) or ("no backend: stopped by the preflight" if preflight else "no backend")
    lines = [f"# Conformance: {name} on {where} "
             f"({engine_label(run)}, seed {run['seed']}, {run['nodes']} node(s))", "",
             " · ".join(f"{_CELL[s]} {s} {n}" for s, n in result["summary"].items())
             + "".join(f" · {_CELL['fail']} {p['check']} fail" for p in preflight) + _expected_note(cases)]
    for p in preflight:
        lines += ["", f"## Preflight: {p['check']} failed ({p['integration']}, SGLang {p['profile']})", "",
                  p["message"], "", *(f"- {w}" for w in p["witness"])]
    if result.get("undeclared"):
        lines += ["", "## Capabilities shown but not declared", "",
                  *(f"- {undeclared_line(u)}" for u in result["undeclared"])]
    for backend in backends:
        mine = [c for c in cases if c["backend"] == backend]
        scenarios = sorted({c["scenario"] for c in mine})
        by_key = {(c["invariant"], c["scenario"]): c for c in mine}
        lines += ["", f"## {backend}", "", "| invariant | " + " | ".join(scenarios) + " |",
                  "|---|" + "---|" * len(scenarios)]
        for inv in sorted({c["invariant"] for c in mine}):
            cells = [_CELL[by_key[(inv, s)]["status"]] if (inv, s) in by_key else "" for s in scenarios]
            lines.append(f"| {inv} | " + " | ".join(cells) + " |")
    measured = [c for c in cases if c["invariant"] in _measured() and c.get("metrics")]
    if measured:
        lines += ["", "## Metrics", "", "| case | metrics |", "|---|---|"]
        for c in measured:
            shown = ", ".join(f"{k}={v:.3g}" if isinstance(v, float) else f"{k}={v}" for k, v in c["metrics"].items())
            lines.append(f"| {c['case']} | {shown} |")
    expected: list[dict[str, Any]] = []
    for outcome, title in (("xfail", "Expected failures"), ("expected-unknown", "Known unknowns")):
        listed = [c for c in cases if (c.get("expected") or {}).get("outcome") == outcome]
        if listed:
            lines += ["", f"## {title} (listed in the expectations file)", "",
                      "| case | backend | reason | tracked |", "|---|---|---|---|"]
            lines += [f"| {c['case']} | {c['backend']} | {c['expected']['reason']} | "
                      f"{c['expected'].get('link') or '–'} |" for c in listed]
        expected += listed
    bad = [c for c in cases if c["status"] != "pass" and c not in expected]
    if bad:
        lines += ["", "## New failures" if expected or any(c.get("expected") for c in cases) else "## Not passed", ""]
        for c in bad:
            evidence = witness_lines(c) or [c.get("reason") or ""]
            lines.append(f"- **{c['case']}** ({c['status']}): " + "; ".join(evidence))
    stale = [c for c in cases if (c.get("expected") or {}).get("outcome") == "unexpected-pass"]
    if stale:
        lines += ["", "## Listed in the expectations file but passing now (delete their entries)", ""]
        lines += [f"- **{c['case']}** ({c['backend']}): entry {c['expected']['entry']!r}" for c in stale]
    return "\n".join(lines) + "\n"


def _expected_note(cases: list[dict[str, Any]]) -> str:
    outcomes = [(c.get("expected") or {}).get("outcome") for c in cases]
    n, k = outcomes.count("xfail"), outcomes.count("expected-unknown")
    notes = [*([f"{n} of the failures expected"] if n else []), *([f"{k} of the unknowns known"] if k else [])]
    return f" ({', '.join(notes)}: listed in the expectations file)" if notes else ""


def _measured() -> set[str]:
    """The checks whose metrics are what the run cost (``Check.measures``)."""
    from conformance.checks import REGISTRY

    return {c.id for c in REGISTRY.values() if c.measures}
