"""Version labels as SGLang reports them, read the same way by every checker."""

from __future__ import annotations

from typing import Any

from ..history import finish_type  # noqa: F401  (read with the other labels)


def numeric(label: Any) -> int | None:
    """An integer version from a label; None for ``"default"`` and other non-numeric labels (V5)."""
    if isinstance(label, bool):
        return None
    if isinstance(label, int):
        return label
    if isinstance(label, str) and label.strip().lstrip("-").isdigit():
        return int(label.strip())
    return None


def output_versions(output: dict) -> list[int]:
    """Numeric versions that produced an output's tokens: every span when SGLang reports spans (0.5.23),
    else the output-time ``weight_version`` label (which names only the version current at the end)."""
    meta = output.get("meta_info", {})
    spans = meta.get("weight_versions")
    labels = [s.get("version") for s in spans if isinstance(s, dict)] if isinstance(spans, list) and spans \
        else [meta.get("weight_version")]
    return [v for v in (numeric(label) for label in labels) if v is not None]


def cut_short(payload: Any, output: dict) -> bool:
    """Whether an output finished with ``finish_reason`` abort before its token budget: a partial answer. One that
    generated all of its ``max_new_tokens`` before the abort landed is complete (SGLang reports the abort all the
    same when it arrives in the step that finished the request)."""
    if finish_type(output) != "abort":
        return False
    params = payload.get("sampling_params") if isinstance(payload, dict) else None
    budget = params.get("max_new_tokens") if isinstance(params, dict) else None
    tokens = output.get("meta_info", {}).get("completion_tokens")
    return not (isinstance(budget, int) and isinstance(tokens, int) and tokens >= budget)
