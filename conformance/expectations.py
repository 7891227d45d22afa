"""Known failures as data: an expectations file listing the cases an integration is known to fail, with a reason.

    # conformance-expectations.toml
    [[xfail]]
    case = "I3-steady-*"                  # a case id (python -m conformance --list-cases), or a glob over them
    reason = "our pause is abort-mode; tracked in #123"
    link = "https://github.com/org/framework/issues/123"     # optional
    backend = "gpu"                       # optional: only on this backend (a name in conformance.backend_table)

Each listed case runs as a strict expected failure: it must still fail, on its own invariant, with ``fail``. A
verdict of ``unknown`` (the scenario never built the situation the invariant needs) or a run that broke (an error,
a hang, a timeout) is reported as "expected a failure, got unknown (<why>)" and fails the run: the listed failure
was not seen. One that passes is an error telling you to delete the entry. An entry that matches no case of the
suite is an error, with the closest ids suggested.
"""

from __future__ import annotations

import difflib
import fnmatch
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Literal, Sequence

from .backend_table import BACKENDS, REFERENCE_BACKEND, backend_names

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

_KEYS = {"case", "reason", "link", "backend"}


class ExpectationsError(Exception):
    """The expectations file is unreadable or lists something wrong; the message says what to fix."""


@dataclass(frozen=True)
class Expectation:
    """One entry: the cases it names, why they fail, and where that is tracked."""

    pattern: str
    reason: str
    link: str | None = None
    backend: str | None = None

    @property
    def is_glob(self) -> bool:
        return any(ch in self.pattern for ch in "*?[")

    def matches(self, case_id: str, backend: str | None = None) -> bool:
        return (self.backend is None or backend is None or backend == self.backend) and (
            fnmatch.fnmatchcase(case_id, self.pattern) if self.is_glob else case_id == self.pattern)

    def describe(self) -> str:
        """The reason, with the link when there is one."""
        return self.reason + (f" ({self.link})" if self.link else "")


Outcome = Literal["xfail", "unexpected-pass", "other-failure", "not-judged"]


@dataclass(frozen=True)
class Judgement:
    """What a listed case's verdict means: ``xfail`` (failed as listed), ``unexpected-pass`` (an error: delete the
    entry), ``other-failure`` (no listed failure seen: ``unknown``, an error or a broken run; fails the run) or
    ``not-judged`` (skipped)."""

    outcome: Outcome
    message: str


@dataclass(frozen=True)
class Expectations:
    """The entries of one expectations file."""

    path: Path
    entries: tuple[Expectation, ...]

    def lookup(self, case_id: str, backend: str | None = None) -> Expectation | None:
        """The entry naming ``case_id`` on ``backend``: an exact id before a glob, else the first glob in file order."""
        found = [e for e in self.entries if e.matches(case_id, backend)]
        exact = [e for e in found if not e.is_glob]
        return (exact or found or [None])[0]

    def judge(self, entry: Expectation, case_id: str, status: str | None, run_broke: bool = False,
              witness: Sequence[str] = ()) -> Judgement:
        """Strict-xfail semantics for a listed case whose verdict is ``status`` (None: skipped; ``error``: the run
        raised before a verdict existed). Only ``fail`` on an unbroken run is the listed failure."""
        where = f"{self.path.name}: {entry.pattern!r}"
        if status is None or status == "skipped":
            return Judgement("not-judged", f"listed in {where} ({entry.describe()}), not run")
        if status == "pass":
            return Judgement("unexpected-pass", f"{case_id} passes now but is listed as an expected failure in "
                                                f"{where} ({entry.describe()}): delete the entry"
                                                + (" or narrow the glob" if entry.is_glob else ""))
        if status == "fail" and not run_broke:
            return Judgement("xfail", f"expected failure ({entry.describe()})")
        why = _why(status, run_broke, witness)
        return Judgement("other-failure", f"{case_id} is listed in {where} ({entry.describe()}): expected a failure, "
                                          f"got unknown ({why}): that is a new failure, not the listed one")


def _why(status: str, run_broke: bool, witness: Sequence[str]) -> str:
    """One line on why a listed case has no verdict of its own: the first lines of its witness."""
    lines = [w.strip() for w in witness if w.strip()]
    if status not in ("unknown", "fail"):
        lines.insert(0, f"{status}:")
    elif run_broke and not lines:
        lines = ["the run broke"]
    text = " ".join(lines[:2]) or "no verdict"
    return text if len(text) <= 300 else text[:297] + "..."


def load_expectations(path: str | Path, known_ids: Iterable[str]) -> Expectations:
    """Read and check an expectations file against the suite's case ids (:data:`conformance.cases.CASES`)."""
    path = Path(path)
    try:
        data = tomllib.loads(path.read_text())
    except FileNotFoundError:
        raise ExpectationsError(f"expectations file {path} does not exist (write one with "
                                f"`python -m conformance --write-expectations {path}`)") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ExpectationsError(f"expectations file {path} cannot be read ({exc})") from None
    except tomllib.TOMLDecodeError as exc:
        raise ExpectationsError(f"expectations file {path} is not valid TOML ({exc})") from None
    known = sorted(set(known_ids))
    unknown_tables = sorted(set(data) - {"xfail"})
    if unknown_tables:
        raise ExpectationsError(f"{path}: unknown table(s) {unknown_tables}; list entries as [[xfail]] with "
                                f"case = ..., reason = ...")
    raw = data.get("xfail", [])
    if not isinstance(raw, list):
        raise ExpectationsError(f"{path}: 'xfail' must be an array of tables ([[xfail]] entries)")
    entries = tuple(_entry(path, i, item, known) for i, item in enumerate(raw, 1))
    return Expectations(path, entries)


def _entry(path: Path, n: int, item: Any, known: list[str]) -> Expectation:
    where = f"{path}: entry {n}"
    if not isinstance(item, dict):
        raise ExpectationsError(f"{where} must be a table with case = ..., reason = ...")
    extra = sorted(set(item) - _KEYS)
    if extra:
        raise ExpectationsError(f"{where}: unknown key(s) {extra}; an entry has {sorted(_KEYS)}")
    pattern, reason = item.get("case"), item.get("reason")
    if not isinstance(pattern, str) or not pattern:
        raise ExpectationsError(f"{where}: 'case' must be a case id or a glob (see python -m conformance --list-cases)")
    if not isinstance(reason, str) or not reason.strip():
        raise ExpectationsError(f"{where} ({pattern!r}): 'reason' must say why it fails (e.g. a tracking issue)")
    link, backend = item.get("link"), item.get("backend")
    if link is not None and not isinstance(link, str):
        raise ExpectationsError(f"{where} ({pattern!r}): 'link' must be a string")
    if backend is not None and backend not in BACKENDS:
        raise ExpectationsError(f"{where} ({pattern!r}): 'backend' must be one of {backend_names()}, got {backend!r}")
    entry = Expectation(pattern, reason.strip(), link, backend)
    if not any(entry.matches(case_id) for case_id in known):
        raise ExpectationsError(f"{where}: {pattern!r} matches no case of the suite{closest(pattern, known)}")
    return entry


def closest(pattern: str, known: Sequence[str], n: int = 3) -> str:
    """``"; closest: a, b"`` (ids nearest to ``pattern``), or ``""`` when none is near."""
    probe = pattern.replace("*", "").replace("?", "")
    near = difflib.get_close_matches(probe, known, n=n, cutoff=0.5)
    if not near and probe:
        near = [k for k in known if probe in k][:n]
    return f"; closest: {', '.join(near)}" if near else "; list the ids with `python -m conformance --list-cases`"


def render_expectations(failing: Iterable[tuple[str, str | None]], header: str = "") -> str:
    """An expectations file listing every ``(case id, backend)`` with reason "TODO", for ``--write-expectations``."""
    lines = ["# Known failures of this integration (weightsync-conformance). Each entry runs as a strict expected",
             "# failure: fix the case, then delete its entry. Case ids: python -m conformance --list-cases.",
             *([f"# {header}"] if header else []), ""]
    backends: dict[str, set[str]] = {}
    for case_id, backend in failing:
        backends.setdefault(case_id, set()).add(backend or REFERENCE_BACKEND)
    for case_id, on in sorted(backends.items()):
        only = next(iter(on)) if len(on) == 1 and REFERENCE_BACKEND not in on else None  # failing there: everywhere
        lines += ["[[xfail]]", f"case = {_toml_str(case_id)}", 'reason = "TODO"',
                  *([f"backend = {_toml_str(only)}"] if only else []), ""]
    return "\n".join(lines)


def _toml_str(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'
