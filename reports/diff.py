"""Comparing a result against a baseline: new failures, cases no longer verified, and metric regressions."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

THRESHOLDS: dict[str, float] = {
    "aborted_sample_rate": 0.01,
    "aborted_request_rate": 0.01,
    "aborts_per_update": 0.5,
    "staleness_max": 0.0,
    "staleness_mean": 0.5,
}
"""Metrics where higher is worse → how much higher than the baseline is still no regression (absolute)."""
_BAD = ("fail", "unknown", "error")


@dataclass
class Diff:
    """What changed from a baseline to a new result. ``regressions`` make ``python -m reports diff`` fail."""

    regressions: list[str] = field(default_factory=list)
    fixed: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def lines(self) -> list[str]:
        return ([f"REGRESSION {r}" for r in self.regressions] + [f"fixed {f}" for f in self.fixed]
                + [f"note {n}" for n in self.notes]
                + ([f"no regression ({len(self.fixed)} fixed)"] if not self.regressions else []))


def _by_key(result: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {f"{c['case']} [{c['backend']}]": c for c in result["cases"]}


def diff(base: dict[str, Any], new: dict[str, Any], thresholds: dict[str, float] | None = None,
         subset: bool = False) -> Diff:
    """Compare cases by (case, backend). A regression: a case that fails, is unknown or broke where the baseline
    did not; a case the baseline verified that was skipped or did not run (unless ``subset``: the new run ran only
    some cases); a watched metric higher than the baseline's by more than its threshold."""
    limits = {**THRESHOLDS, **(thresholds or {})}
    old_cases, new_cases = _by_key(base), _by_key(new)
    out = Diff()
    for key, c in new_cases.items():
        b = old_cases.get(key)
        if c["status"] in _BAD and (b is None or b["status"] not in _BAD):
            was = "not in the baseline" if b is None else f"was {b['status']}"
            evidence = "; ".join(map(str, (c.get("witness") or [])[:2]))
            out.regressions.append(f"{key}: {c['status']} ({was}): {evidence}")
        elif b is not None and b["status"] in _BAD and c["status"] == "pass":
            out.fixed.append(f"{key}: {b['status']} → pass")
        elif b is not None and b["status"] == "pass" and c["status"] == "skipped":
            out.regressions.append(f"{key}: passed in the baseline, now skipped ({c.get('reason')})")
        if b is None:
            continue
        for metric, limit in limits.items():
            old, now = (b.get("metrics") or {}).get(metric), (c.get("metrics") or {}).get(metric)
            if _number(old) and _number(now) and now - old > limit:
                out.regressions.append(f"{key}: {metric} {old:.3g} → {now:.3g} (more than +{limit:g})")
    missing = [key for key, b in old_cases.items() if key not in new_cases and b["status"] != "skipped"]
    if missing:
        shown = ", ".join(missing[:5]) + (f" and {len(missing) - 5} more" if len(missing) > 5 else "")
        (out.notes if subset else out.regressions).append(
            f"{len(missing)} case(s) of the baseline did not run: {shown}"
            + (" (--subset)" if subset else " (pass --subset when the new run selects only some cases)"))
    return out


def _number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)
