"""``python -m conformance`` (also ``python -m weightsync_conformance``): run the conformance suite (fake backend by default) and write the report (JSON result,
Markdown summary, self-contained HTML).

    python -m conformance [--integration MODULE:ATTR [--integration-option KEY=VALUE ...]] [--out results/]
                          [--sglang-profile 0.5.23 | --profiles all|V1,V2] [-- PYTEST ARGS]

With ``--profiles`` the suite runs once per SGLang profile (results in ``OUT/<profile>/``) and prints the
integration × profile matrix (also written to ``OUT/profiles.md``).
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
    parser.add_argument("--integration", default=None, help="MODULE:ATTR of the integration under test "
                                                             "(default: the reference integration)")
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
    return parser


def _profiles(value: str | None, default: str) -> list[str]:
    from fakes.profiles import PROFILES

    if value is None:
        return [default]
    known = sorted(PROFILES, key=lambda v: tuple(int(p) for p in v.split(".")))
    chosen = known if value == "all" else [v.strip() for v in value.split(",") if v.strip()]
    unknown = [v for v in chosen if v not in PROFILES]
    if unknown or not chosen:
        raise UsageError(f"--profiles: unknown profile(s) {unknown or [value]}; known: {', '.join(known)} or all")
    return chosen


def _check_integration(args: argparse.Namespace) -> str:
    from conformance import DEFAULT_INTEGRATION
    from conformance.cases import IntegrationError, load_integration, parse_options

    spec = args.integration or DEFAULT_INTEGRATION
    try:
        load_integration(spec, parse_options(args.integration_option))
    except IntegrationError as exc:
        raise UsageError(str(exc)) from None
    return spec


def _run(args: argparse.Namespace, extra: list[str], spec: str, profile: str, out: Path) -> tuple[int, Path | None]:
    """One pytest run of the suite; its exit code and the result it wrote (None when it wrote none)."""
    report = out / "conformance-result.json"
    plugin = [] if plugin_installed() else ["-p", PLUGIN, "--noconftest"]
    pytest_args = ["--pyargs", "conformance.suite", "-m", args.marker, *plugin,
                   "-W", "ignore::pytest.PytestAssertRewriteWarning",
                   f"--sglang-profile={profile}", f"--conformance-seed={args.seed}",
                   f"--conformance-report={report}", f"--integration={spec}",
                   *(f"--integration-option={o}" for o in args.integration_option),
                   *(["--isolate-scenarios"] if args.isolate_scenarios else []),
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


def main(argv: list[str] | None = None) -> int:
    try:
        args, extra = _parser().parse_known_args(argv)
        extra = extra[1:] if extra[:1] == ["--"] else extra  # "-- PYTEST ARGS": pytest's own, not paths
        profiles = _profiles(args.profiles, args.sglang_profile)
        spec = _check_integration(args)
    except UsageError as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return 2
    out = Path(args.out)
    if len(profiles) == 1:
        code, report = _run(args, extra, spec, profiles[0], out)
        if report is not None:
            print(f"\nconformance result: {report} (summary {report.with_suffix('.md')})\n"
                  f"HTML report: {report.with_suffix('.html')}")
        return code
    rows = [(profile, *_run(args, extra, spec, profile, out / profile)) for profile in profiles]
    matrix = _matrix(spec, rows)
    out.mkdir(parents=True, exist_ok=True)
    (out / "profiles.md").write_text(matrix)
    print("\n" + matrix + f"\nper-profile results under {out}/<profile>/; this matrix in {out / 'profiles.md'}")
    return max(code for _, code, _ in rows)
