"""The conformance result: a versioned JSON envelope (``reports/schema.json``) with each scenario's history stored
beside it as compact gzip JSON, referenced from the cases that were judged on it."""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

SCHEMA_VERSION = 2
"""2: each case carries its ``anomalies`` (what the witness names, as data). 1: prose witnesses only."""
READABLE_VERSIONS = (1, 2)
"""Result schema versions this suite reads (and renders)."""
SCHEMA_PATH = Path(__file__).with_name("schema.json")
STATUSES = ("pass", "fail", "unknown", "skipped", "error")
"""A case's status: the checker's verdict, ``skipped`` (with the reason) or ``error`` (the test broke before a
verdict existed)."""


class ResultError(Exception):
    """A result or history file cannot be read; the message says which and why."""


def histories_dir(result_path: Path) -> Path:
    """Where a result's histories live: ``conformance-result.json`` → ``conformance-result-histories/``."""
    return result_path.with_name(result_path.stem + "-histories")


def history_file_name(scenario: str, backend: str, worker: str | None, *, compress: bool) -> str:
    """``<scenario>.<backend>[.<xdist worker>].json[.gz]``: one file per scenario run (each xdist worker that
    ran a scenario ran it itself, so its cases name its own run)."""
    return ".".join([scenario, backend, *([worker] if worker else []), "json.gz" if compress else "json"])


def write_history(path: Path, history_json: str) -> None:
    """Write one history (``History.to_json()``), gzipped when ``path`` ends in ``.gz``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    data = history_json.encode()
    path.write_bytes(gzip.compress(data, compresslevel=6, mtime=0) if path.suffix == ".gz" else data)


def read_json(path: Path) -> Any:
    """A JSON file (gzipped when its name ends in ``.gz``), or ResultError saying what is wrong with it."""
    try:
        raw = path.read_bytes()
        return json.loads(gzip.decompress(raw) if path.suffix == ".gz" else raw)
    except FileNotFoundError:
        raise ResultError(f"{path}: no such file") from None
    except (OSError, ValueError, EOFError) as exc:
        raise ResultError(f"{path}: not a readable JSON file ({type(exc).__name__}: {exc})") from None


def load_result(path: Path) -> dict[str, Any]:
    """A result file, checked for the envelope this suite reads (full validation: :func:`validate`)."""
    result = read_json(path)
    if not isinstance(result, dict) or not isinstance(result.get("cases"), list):
        raise ResultError(f"{path}: not a conformance result (no 'cases' list)")
    if result.get("schema_version") not in READABLE_VERSIONS:
        raise ResultError(f"{path}: result schema version {result.get('schema_version')!r}, this suite reads "
                          f"{' and '.join(map(str, READABLE_VERSIONS))}")
    return result


def engine_label(run: dict[str, Any]) -> str:
    """The engines a run's fake backend behaved as (``SGLang 0.5.23``; results written before engine families: their
    SGLang profile)."""
    return run.get("engine") or f"SGLang {run['sglang_profile']}"


def witness_lines(case: dict[str, Any]) -> list[str]:
    """What a case's evidence says, one line each: its anomalies' sentences (schema 2), else its witness lines."""
    anomalies = case.get("anomalies")
    if isinstance(anomalies, list):
        return [str(a.get("text", "")) if isinstance(a, dict) else str(a) for a in anomalies]
    return [w if isinstance(w, str) else json.dumps(w) for w in case.get("witness") or []]


def load_history(result_path: Path, ref: str | None) -> dict[str, Any] | None:
    """The history a case names (relative to the result file), or None when it has none or the file is gone."""
    if not ref:
        return None
    try:
        history = read_json(result_path.parent / ref)
    except ResultError:
        return None
    return history if isinstance(history, dict) else None


def summarise(cases: list[dict[str, Any]]) -> dict[str, int]:
    """Cases per status."""
    return {s: sum(c["status"] == s for c in cases) for s in STATUSES}


def undeclared_capabilities(shown: list[tuple[str, dict[str, Any]]]) -> list[dict[str, Any]]:
    """Per capability the run showed undeclared (``(scenario, case["undeclared"] entry)`` pairs): its first evidence,
    the scenarios that showed it and those declaring it would run; by capability."""
    merged: dict[str, dict[str, Any]] = {}
    for scenario, u in sorted(shown, key=lambda pair: pair[0]):
        entry = merged.setdefault(u["capability"], {**u, "shown_in": []})
        if scenario not in entry["shown_in"]:
            entry["shown_in"].append(scenario)
    return [merged[c] for c in sorted(merged)]


def undeclared_line(u: dict[str, Any]) -> str:
    """One capability of :func:`undeclared_capabilities` as a sentence that says what to do."""
    unlocks = ", ".join(u["unlocks"]) or "no scenario"
    return (f"the run shows capability {u['capability']!r}, which the integration does not declare "
            f"({u['evidence']}; in {', '.join(u['shown_in'])}): declare Capabilities({u['capability']}=True) to run "
            f"{unlocks}")


def build_result(run: dict[str, Any], cases: list[dict[str, Any]], created: str,
                 preflight: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """The envelope around ``run`` metadata and ``cases`` (sorted by node id, so runs compare line by line), with
    the ``preflight`` checks that failed (a run they stopped has no case) and the capabilities the run showed but
    the integration did not declare, when there are any."""
    from conformance import __version__

    cases = sorted(cases, key=lambda c: c["nodeid"])
    undeclared = undeclared_capabilities([(c["scenario"], u) for c in cases for u in c.get("undeclared", [])])
    return {"schema_version": SCHEMA_VERSION, "suite_version": __version__, "created": created, "run": run,
            "summary": summarise(cases), **({"preflight": preflight} if preflight else {}),
            **({"undeclared": undeclared} if undeclared else {}), "cases": cases}


def validate(result: dict[str, Any]) -> None:
    """Validate against ``reports/schema.json`` (needs ``jsonschema``, a dev dependency); ResultError on the
    first violation, naming where it is."""
    import jsonschema

    schema = json.loads(SCHEMA_PATH.read_text())
    error = jsonschema.exceptions.best_match(jsonschema.Draft202012Validator(schema).iter_errors(result))
    if error is not None:
        where = "/".join(str(p) for p in error.absolute_path) or "(top)"
        raise ResultError(f"result does not match {SCHEMA_PATH.name} at {where}: {error.message}")
