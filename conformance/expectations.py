"""Known failures as data: an expectations file listing the cases an integration is known to fail, and the known
unknowns (cases whose situation its design never lets arise), each with a reason.

    # conformance-expectations.toml
    [[xfail]]
    case = "I3-steady-*"                  # a case id (python -m conformance --list-cases), or a glob over them
    reason = "our pause is abort-mode; tracked in #123"
    link = "https://github.com/org/framework/issues/123"     # optional
    backend = "gpu"                       # optional: only on this backend (a name in conformance.backend_table)

    [[unknown]]
    case = "S2-mixed-versions"            # the same keys, and one more
    reason = "we drop every group that spans an update: no mixed group ever reaches training"
    witness = "no group generated under more than one version"  # optional: the suite's reason must contain it

Each ``[[xfail]]`` case runs as a strict expected failure: it must still fail, on its own invariant, with ``fail``.
A verdict of ``unknown`` (the scenario never built the situation the invariant needs) or a run that broke (an error,
a hang, a timeout) is reported as "expected a failure, got unknown (<why>)" and fails the run: the listed failure
was not seen. Each ``[[unknown]]`` case must likewise still answer ``unknown`` (and, with ``witness``, for that
reason: the text must occur in the verdict's witness, its lines joined by spaces; without it any reason will do);
a ``fail``, a broken run or an unknown for another reason fails the run. A listed case that passes is an error
telling you to delete the entry. An entry that matches no case of the suite is an error, with the closest ids
suggested; so is a case listed as both at once (an exact id outranks a glob). ``--write-expectations`` leaves
``witness`` out and writes the suite's reason as a comment: that text carries the run's numbers ("in 8 updates"),
so a ``witness`` copies a stable part of it.
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

Kind = Literal["xfail", "unknown"]
KINDS: tuple[Kind, ...] = ("xfail", "unknown")
_KEYS: dict[str, set[str]] = {"xfail": {"case", "reason", "link", "backend"},
                              "unknown": {"case", "reason", "link", "backend", "witness"}}
_WHY = {"xfail": "why it fails (e.g. a tracking issue)",
        "unknown": "why the situation cannot arise in your design (e.g. a design note or an issue)"}


class ExpectationsError(Exception):
    """The expectations file is unreadable or lists something wrong; the message says what to fix."""


@dataclass(frozen=True)
class Expectation:
    """One entry: the cases it names, the verdict expected of them (``kind``), why, and where that is tracked."""

    pattern: str
    reason: str
    link: str | None = None
    backend: str | None = None
    kind: Kind = "xfail"
    witness: str | None = None
    """``[[unknown]]`` only: a text the verdict's witness must contain (None: any reason)."""

    @property
    def is_glob(self) -> bool:
        return any(ch in self.pattern for ch in "*?[")

    def matches(self, case_id: str, backend: str | None = None) -> bool:
        return (self.backend is None or backend is None or backend == self.backend) and (
            fnmatch.fnmatchcase(case_id, self.pattern) if self.is_glob else case_id == self.pattern)

    def describe(self) -> str:
        """The reason, with the link when there is one."""
        return self.reason + (f" ({self.link})" if self.link else "")


Outcome = Literal["xfail", "expected-unknown", "unexpected-pass", "other-failure", "not-judged"]


@dataclass(frozen=True)
class Judgement:
    """What a listed case's verdict means: ``xfail`` (failed as listed), ``expected-unknown`` (unknown as listed),
    ``unexpected-pass`` (an error: delete the entry), ``other-failure`` (not the listed verdict: for ``[[xfail]]``
    an unknown, an error or a broken run; for ``[[unknown]]`` a fail, an error, a broken run or another reason;
    fails the run) or ``not-judged`` (skipped)."""

    outcome: Outcome
    message: str

    @property
    def as_listed(self) -> bool:
        """The listed verdict was seen: the case counts as expected (pytest's xfail)."""
        return self.outcome in ("xfail", "expected-unknown")


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
        """Strict semantics for a listed case whose verdict is ``status`` (None: skipped; ``error``: the run raised
        before a verdict existed). Only ``fail`` on an unbroken run is an ``[[xfail]]`` entry's verdict; only
        ``unknown`` (with the entry's ``witness`` text, when it has one) an ``[[unknown]]`` entry's."""
        where = f"{self.path.name}: {entry.pattern!r}"
        if status is None or status == "skipped":
            return Judgement("not-judged", f"listed in {where} ({entry.describe()}), not run")
        listed_as = "an expected failure" if entry.kind == "xfail" else "a known unknown"
        if status == "pass":
            return Judgement("unexpected-pass", f"{case_id} passes now but is listed as {listed_as} in "
                                                f"{where} ({entry.describe()}): delete the entry"
                                                + (" or narrow the glob" if entry.is_glob else ""))
        if entry.kind == "unknown":
            return self._judge_unknown(entry, case_id, status, run_broke, witness, where)
        if status == "fail" and not run_broke:
            return Judgement("xfail", f"expected failure ({entry.describe()})")
        why = _why(status, run_broke, witness)
        return Judgement("other-failure", f"{case_id} is listed in {where} ({entry.describe()}): expected a failure, "
                                          f"got unknown ({why}): that is a new failure, not the listed one")

    @staticmethod
    def _judge_unknown(entry: Expectation, case_id: str, status: str, run_broke: bool, witness: Sequence[str],
                       where: str) -> Judgement:
        """An ``[[unknown]]`` entry's verdict: ``unknown`` as listed, or which other verdict came and what to do."""
        head = f"{case_id} is listed as a known unknown in {where} ({entry.describe()}): "
        why = _why(status, run_broke, witness)
        if status == "unknown" and not run_broke:
            said = " ".join(w.strip() for w in witness if w.strip())
            if entry.witness is None or entry.witness in said:
                return Judgement("expected-unknown", f"known unknown ({entry.describe()})")
            return Judgement("other-failure", head + f"expected unknown with witness {entry.witness!r}, got unknown "
                                                     f"for another reason ({why}): if that is your design too, "
                                                     f"change the entry's witness to a part of it")
        if status == "fail" and not run_broke:
            return Judgement("other-failure", head + f"it now fails ({why}): the situation arose and the invariant "
                                                     f"broke; fix it, or list it as [[xfail]] in place of [[unknown]]")
        return Judgement("other-failure", head + f"expected unknown, got no verdict of its own ({why}): that is a "
                                                 f"new failure, not the listed unknown")


def _why(status: str, run_broke: bool, witness: Sequence[str]) -> str:
    """One line on a listed case's verdict: the first two lines of its witness (after the status, when there was no
    verdict of its own)."""
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
    unknown_tables = sorted(set(data) - set(KINDS))
    if unknown_tables:
        raise ExpectationsError(f"{path}: unknown table(s) {unknown_tables}; list entries as [[xfail]] (known "
                                f"failures) or [[unknown]] (known unknowns) with case = ..., reason = ...")
    entries: list[Expectation] = []
    for kind in KINDS:
        raw = data.get(kind, [])
        if not isinstance(raw, list):
            raise ExpectationsError(f"{path}: '{kind}' must be an array of tables ([[{kind}]] entries)")
        entries += [_entry(path, kind, i, item, known) for i, item in enumerate(raw, 1)]
    if len({e.kind for e in entries}) > 1:
        _check_one_kind_per_case(path, entries, known)
    return Expectations(path, tuple(entries))


def _entry(path: Path, kind: Kind, n: int, item: Any, known: list[str]) -> Expectation:
    where = f"{path}: entry {n}" if kind == "xfail" else f"{path}: [[{kind}]] entry {n}"
    if not isinstance(item, dict):
        raise ExpectationsError(f"{where} must be a table with case = ..., reason = ...")
    extra = sorted(set(item) - _KEYS[kind])
    if extra:
        raise ExpectationsError(f"{where}: unknown key(s) {extra}; a [[{kind}]] entry has {sorted(_KEYS[kind])}")
    pattern, reason = item.get("case"), item.get("reason")
    if not isinstance(pattern, str) or not pattern:
        raise ExpectationsError(f"{where}: 'case' must be a case id or a glob (see python -m conformance --list-cases)")
    if not isinstance(reason, str) or not reason.strip():
        raise ExpectationsError(f"{where} ({pattern!r}): 'reason' must say {_WHY[kind]}")
    link, backend, witness = item.get("link"), item.get("backend"), item.get("witness")
    if link is not None and not isinstance(link, str):
        raise ExpectationsError(f"{where} ({pattern!r}): 'link' must be a string")
    if backend is not None and backend not in BACKENDS:
        raise ExpectationsError(f"{where} ({pattern!r}): 'backend' must be one of {backend_names()}, got {backend!r}")
    if witness is not None and (not isinstance(witness, str) or not witness.strip()):
        raise ExpectationsError(f"{where} ({pattern!r}): 'witness' must be a non-empty part of the suite's reason "
                                f"for the unknown (or leave it out: any reason)")
    entry = Expectation(pattern, reason.strip(), link, backend, kind, witness.strip() if witness else None)
    if not any(entry.matches(case_id) for case_id in known):
        raise ExpectationsError(f"{where}: {pattern!r} matches no case of the suite{closest(pattern, known)}")
    return entry


def _check_one_kind_per_case(path: Path, entries: Sequence[Expectation], known: Sequence[str]) -> None:
    """ExpectationsError when a case on a backend is listed as [[xfail]] and as [[unknown]] at the same rank (an
    exact id outranks a glob): it has one expected verdict."""
    for case_id in known:
        for backend in BACKENDS:
            found = [e for e in entries if e.matches(case_id, backend)]
            top = [e for e in found if not e.is_glob] or found
            xfail = next((e for e in top if e.kind == "xfail"), None)
            unknown = next((e for e in top if e.kind == "unknown"), None)
            if xfail is not None and unknown is not None:
                raise ExpectationsError(f"{path}: {case_id} is listed both as [[xfail]] ({xfail.pattern!r}) and as "
                                        f"[[unknown]] ({unknown.pattern!r}); a case has one expected verdict: keep "
                                        f"one entry, or narrow a glob")


def closest(pattern: str, known: Sequence[str], n: int = 3) -> str:
    """``"; closest: a, b"`` (ids nearest to ``pattern``), or ``""`` when none is near."""
    probe = pattern.replace("*", "").replace("?", "")
    near = difflib.get_close_matches(probe, known, n=n, cutoff=0.5)
    if not near and probe:
        near = [k for k in known if probe in k][:n]
    return f"; closest: {', '.join(near)}" if near else "; list the ids with `python -m conformance --list-cases`"


def render_expectations(failing: Iterable[tuple[str, str | None]], header: str = "",
                        unknown: Iterable[tuple[str, str | None, Sequence[str]]] = ()) -> str:
    """An expectations file for ``--write-expectations``: every failing ``(case id, backend)`` as an ``[[xfail]]``
    entry and every unknown ``(case id, backend, witness lines)`` as an ``[[unknown]]`` entry (the suite's reason
    in a comment), each with reason "TODO"."""
    lines = ["# Known failures and known unknowns of this integration (weightsync-conformance). Each entry is strict:",
             "# an [[xfail]] case must still fail, an [[unknown]] case still answer unknown (add witness = \"<part of",
             "# the suite's reason>\" to require that reason). Fix a case, then delete its entry. Case ids:",
             "# python -m conformance --list-cases.", *([f"# {header}"] if header else []), ""]
    for kind, rows in (("xfail", [(c, b, "") for c, b in failing]),
                       ("unknown", [(c, b, _why("unknown", False, w)) for c, b, w in unknown])):
        backends: dict[str, set[str]] = {}
        said: dict[str, str] = {}
        for case_id, backend, why in rows:
            backends.setdefault(case_id, set()).add(backend or REFERENCE_BACKEND)
            said.setdefault(case_id, why)
        for case_id, on in sorted(backends.items()):
            only = next(iter(on)) if len(on) == 1 and REFERENCE_BACKEND not in on else None  # there: everywhere
            why = " ".join(said[case_id].split())
            lines += [f"[[{kind}]]", f"case = {_toml_str(case_id)}", 'reason = "TODO"',
                      *([f"backend = {_toml_str(only)}"] if only else []),
                      *([f"# the suite: {why}"] if why else []), ""]
    return "\n".join(lines)


def _toml_str(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'
