"""``python -m conformance`` (also ``python -m weightsync_conformance``): run the conformance suite (fake backend by
default) and write the report (JSON result, Markdown summary, self-contained HTML).

    python -m conformance [--integration MODULE:ATTR [--integration-option KEY=VALUE ...]] [--out results/]
                          [--engine sglang|vllm] [--sglang-profile V | --profiles all|V1,V2] [--expectations FILE]
                          [--write-expectations FILE] [-- PYTEST ARGS]
    python -m conformance --list-cases                       the case ids (<invariant>-<scenario>), one a line
    python -m conformance --case-table                       the scenarios, what each builds, the checks judging it
    python -m conformance new-adapter PATH [--sync|--async]  a commented adapter that fails every case with
                                                             "implement <method>: ..." until it is filled in

With ``--profiles`` the suite runs once per SGLang profile (results in ``OUT/<profile>/``) and prints the
integration × profile matrix (also written to ``OUT/profiles.md``). With ``--engine vllm`` the fake engines are vLLM
0.32.0 and the default integration is the reference on vLLM (``conformance.reference:vllm``).
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import sys
import time
from pathlib import Path
from typing import NoReturn

import pytest

PROG = "python -m conformance"
PLUGIN = "weightsync_conformance.plugin"
"""The plugin's module (the ``pytest11`` entry point ``weightsync_conformance``)."""


def plugin_installed() -> bool:
    """True when the ``pytest11`` entry point is installed (``pip install -e .``): pytest then loads it itself."""
    return any(ep.value == PLUGIN for ep in importlib.metadata.entry_points(group="pytest11"))


class UsageError(Exception):
    """Bad input: one line on stderr, exit 2, nothing written."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        raise UsageError(message)


def _parser() -> argparse.ArgumentParser:
    from fakes.profiles import DEFAULT_PROFILE, PROFILES

    parser = _Parser(prog=PROG, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    from conformance.families import DEFAULT_FAMILY, FAMILIES

    parser.add_argument("--integration", default=None, help="MODULE:ATTR of the integration under test "
                                                             "(default: the reference integration, for --engine)")
    parser.add_argument("--engine", default=DEFAULT_FAMILY, choices=list(FAMILIES),
                        help=f"engine family of the fake backend (default: {DEFAULT_FAMILY})")
    parser.add_argument("--integration-option", action="append", default=[], metavar="KEY=VALUE",
                        help="keyword argument for an integration factory (repeatable)")
    parser.add_argument("--isolate-scenarios", action="store_true", help="each scenario in its own process")
    parser.add_argument("--out", default="results", help="report folder (default: results/)")
    parser.add_argument("--sglang-profile", default=DEFAULT_PROFILE, choices=sorted(PROFILES),
                        help=f"fake SGLang version (default {DEFAULT_PROFILE})")
    parser.add_argument("--profiles", default=None, metavar="all|V1,V2",
                        help="run once per SGLang profile and print the integration x profile matrix")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("-m", dest="marker", default="cpu", help="pytest marker expression (default: cpu)")
    parser.add_argument("--expectations", default=None, metavar="FILE",
                        help="known failures and known unknowns (TOML): each listed case must still fail, or "
                             "still answer unknown, as listed")
    parser.add_argument("--write-expectations", default=None, metavar="FILE",
                        help="after the run, write FILE listing every failing case as [[xfail]] and every unknown one "
                             "as [[unknown]] (reason TODO), to adopt in one step")
    parser.add_argument("--list-cases", action="store_true", help="print every case id and exit")
    parser.add_argument("--case-table", action="store_true",
                        help="print the scenarios, what each builds and the checks judging it (Markdown) and exit")
    return parser


def _adapter_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog=f"{PROG} new-adapter", description="write a commented adapter that runs at once and "
                     "fails every case with 'implement <method>: ...' until it is filled in")
    parser.add_argument("path", type=Path, help="the adapter module to write (a new .py file)")
    style = parser.add_mutually_exclusive_group()
    style.add_argument("--sync", dest="sync", action="store_true",
                       help="your engine wrapper is blocking (requests): the adapter runs it in threads")
    style.add_argument("--async", dest="sync", action="store_false", help="your client is async (default)")
    return parser


def _new_adapter(argv: list[str]) -> int:
    from conformance.scaffold import write_adapter

    try:
        args = _adapter_parser().parse_args(argv)
        path = write_adapter(args.path, args.sync)
    except (UsageError, ValueError) as exc:
        print(f"{PROG} new-adapter: error: {exc}", file=sys.stderr)
        return 2
    module = path.stem
    print(f"wrote {path}; run it (every case fails with what to implement first):\n"
          f"  cd {path.parent} && pytest -m cpu --pyargs conformance.suite "
          f"--conformance-integration {module}:integration")
    return 0


def _list_cases() -> str:
    from conformance.cases import CASES

    width = max(len(c.id) for c in CASES)
    return "\n".join(f"{c.id:<{width}}  scenario={c.scenario} invariant={c.check}" for c in CASES)


def _write_expectations(path: Path, report: Path | None, spec: str) -> None:
    """The run's failing cases as [[xfail]] entries and its unknown ones as [[unknown]] entries (reason TODO); the
    cases with no verdict of their own (an error, a broken run), which no entry excuses, named on stderr."""
    from conformance.expectations import render_expectations

    if report is None:
        raise UsageError(f"--write-expectations: the run wrote no result, so {path} was not written")
    cases = json.loads(report.read_text())["cases"]
    broke = [c for c in cases if c["status"] == "error" or (c.get("details") or {}).get("run_broke")]
    failing = [(c["case"], c["backend"]) for c in cases if c["status"] == "fail" and c not in broke]
    unknown = [(c["case"], c["backend"], c.get("witness") or []) for c in cases if c["status"] == "unknown"]
    path.write_text(render_expectations(failing, f"written from a run of {spec}", unknown))
    print(f"expectations: {len(failing)} failing case(s) written as [[xfail]] and {len(unknown)} unknown as "
          f"[[unknown]] to {path} (reason TODO; then burn the list down)")
    if broke:
        print(f"expectations: {len(broke)} case(s) not written, as no entry excuses a run that broke or raised "
              f"(fix it, or rerun if it was the machine): {', '.join(sorted({c['case'] for c in broke}))}",
              file=sys.stderr)


def _profiles(value: str | None, default: str) -> list[str]:
    from fakes.facts import parse_version
    from fakes.profiles import PROFILES

    if value is None:
        return [default]
    known = sorted(PROFILES, key=parse_version)
    chosen = known if value == "all" else [v.strip() for v in value.split(",") if v.strip()]
    unknown = [v for v in chosen if v not in PROFILES]
    if unknown or not chosen:
        raise UsageError(f"--profiles: unknown profile(s) {unknown or [value]}; known: {', '.join(known)} or all")
    return chosen


def _check_integration(args: argparse.Namespace) -> str:
    from conformance.cases import IntegrationError, load_integration, parse_options

    from conformance.families import family

    spec = args.integration or family(args.engine).reference
    try:
        load_integration(spec, parse_options(args.integration_option))
    except IntegrationError as exc:
        raise UsageError(str(exc)) from None
    return spec


def _pytest_args(extra: list[str]) -> list[str]:
    """What goes to pytest: the options this command does not know, then what follows ``--``, without that first
    ``--`` (argparse keeps it, after any unknown option before it: ``-q -- -k NAME``); left in, pytest would take
    what follows for paths (``module or package not found: -k``)."""
    if "--" in extra:
        at = extra.index("--")
        return extra[:at] + extra[at + 1:]
    return extra


def _judged_no_case(code: int, report: Path | None, extra: list[str], marker: str) -> str | None:
    """Why the run judged no case, when its result holds none (and no preflight finding): what to give instead."""
    if report is None or code not in (pytest.ExitCode.USAGE_ERROR, pytest.ExitCode.NO_TESTS_COLLECTED):
        return None
    result = json.loads(report.read_text())
    if result.get("cases") or result.get("preflight"):
        return None
    if code == pytest.ExitCode.USAGE_ERROR:
        return (f"pytest refused its arguments {extra} (its error is above), so no case ran and {report} holds "
                f"none; this command's own options go before --, pytest's after it: {PROG} --out results -- -k V1-lora")
    return (f"the pytest arguments {extra} with -m {marker} selected no case, so {report} holds none; -k matches "
            f"the node ids test_case[<case id>-<backend>] (e.g. -k V1-lora-fake), -m {marker} keeps only its "
            f"backends' cases; list the case ids with {PROG} --list-cases")


UNUSED_PLUGINS = ("-p", "no:respx", "-p", "no:anyio", "-p", "no:benchmark", "-p", "no:hypothesispytest")
"""Installed pytest plugins the packaged suite does not use (they are the suite's own tests' dependencies), kept out
of the main job's start-up; like the working directory's ``conftest.py`` files (``--noconftest``), which belong to
that directory's own tests."""


def _run(args: argparse.Namespace, extra: list[str], spec: str, profile: str, out: Path) -> tuple[int, Path | None]:
    """One pytest run of the suite; its exit code and the result it wrote (None when it wrote none)."""
    report = out / "conformance-result.json"
    plugin = [] if plugin_installed() else ["-p", PLUGIN]
    pytest_args = ["--pyargs", "conformance.suite", "-m", args.marker, *plugin, "--noconftest", *UNUSED_PLUGINS,
                   "-W", "ignore::pytest.PytestAssertRewriteWarning",
                   f"--conformance-engine={args.engine}", f"--conformance-sglang-profile={profile}",
                   f"--conformance-seed={args.seed}",
                   f"--conformance-report={report}", f"--conformance-integration={spec}",
                   *(f"--conformance-integration-option={o}" for o in args.integration_option),
                   *(["--conformance-isolate-scenarios"] if args.isolate_scenarios else []),
                   *([f"--conformance-expectations={Path(args.expectations).resolve()}"] if args.expectations else []),
                   *extra]  # joined forms: pytest must not take them for paths
    started = time.time()
    code = int(pytest.main(pytest_args))
    written = report.exists() and report.stat().st_mtime >= started
    return code, report if written else None


def _matrix(spec: str, rows: list[tuple[str, int, Path | None]]) -> str:
    """The integration x profile matrix as Markdown."""
    lines = [f"# {spec}: conformance per SGLang profile", "",
             "| profile | passed | failed | skipped | failing invariants |", "|---|---|---|---|---|"]
    for profile, code, report in rows:
        if report is None:
            lines.append(f"| {profile} | – | – | – | no result (pytest exit {code}) |")
            continue
        cases = json.loads(report.read_text()).get("cases", [])
        count = {s: sum(c.get("status") == s for c in cases) for s in ("pass", "fail", "unknown", "skipped")}
        failing = sorted({c["invariant"] for c in cases if c.get("status") in ("fail", "unknown", "error")})
        lines.append(f"| {profile} | {count['pass']} | {count['fail'] + count['unknown']} | {count['skipped']} | "
                     f"{', '.join(failing) or '–'} |")
    return "\n".join(lines) + "\n"


def _writable_dir(path: Path) -> Path:
    """``path`` created (with its parents), or UsageError saying why it cannot be."""
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UsageError(f"--out {path}: cannot create the report folder ({exc.strerror or exc}); choose a "
                         f"writable path") from None
    return path


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["new-adapter"]:
        return _new_adapter(argv[1:])
    try:
        args, extra = _parser().parse_known_args(argv)
        if args.case_table:
            from conformance.cases import case_table

            print(case_table())
            return 0
        if args.list_cases:
            print(_list_cases())
            return 0
        extra = _pytest_args(extra)
        from conformance.families import family

        if args.profiles and not family(args.engine).profiles:
            raise UsageError(f"--profiles runs the fake SGLang's releases; --engine {args.engine} fakes one release")
        profiles = _profiles(args.profiles, args.sglang_profile)
        spec = _check_integration(args)
        out = _writable_dir(Path(args.out))
        if args.write_expectations and len(profiles) > 1:
            raise UsageError("--write-expectations takes one profile (the file lists one run's failures)")
        if args.expectations and not Path(args.expectations).is_file():
            raise UsageError(f"--expectations {args.expectations}: no such file (write one with "
                             f"--write-expectations {args.expectations})")
    except UsageError as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return 2
    if len(profiles) == 1:
        code, report = _run(args, extra, spec, profiles[0], out)
        no_case = _judged_no_case(code, report, extra, args.marker)
        if no_case is not None:
            written = f"; {args.write_expectations} was not written" if args.write_expectations else ""
            print(f"{PROG}: error: {no_case}{written}", file=sys.stderr)
            return code
        if report is not None:
            print(f"\nconformance result: {report} (summary {report.with_suffix('.md')})\n"
                  f"HTML report: {report.with_suffix('.html')}")
        if args.write_expectations:
            try:
                _write_expectations(Path(args.write_expectations), report, spec)
            except (UsageError, OSError) as exc:
                print(f"{PROG}: error: {exc}", file=sys.stderr)
                return 2
        return code
    rows = [(profile, *_run(args, extra, spec, profile, out / profile)) for profile in profiles]
    matrix = _matrix(spec, rows)
    out.mkdir(parents=True, exist_ok=True)
    (out / "profiles.md").write_text(matrix)
    print("\n" + matrix + f"\nper-profile results under {out}/<profile>/; this matrix in {out / 'profiles.md'}")
    return max(code for _, code, _ in rows)
