"""``python -m conformance``: run the conformance suite (fake backend by default) and write the report (JSON result,
Markdown summary, self-contained HTML).

    python -m conformance [--integration MODULE:ATTR] [--out results/] [--sglang-profile 0.5.23] [-- PYTEST ARGS]
"""

from __future__ import annotations

import argparse
import importlib.metadata
import sys
from pathlib import Path

import pytest


def plugin_installed() -> bool:
    """True when the ``pytest11`` entry point is installed (``pip install -e .``): pytest then loads it itself."""
    return any(ep.value == "conformance.plugin" for ep in importlib.metadata.entry_points(group="pytest11"))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m conformance", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--integration", default=None, help="MODULE:ATTR of the integration under test "
                                                             "(default: the reference integration)")
    parser.add_argument("--out", default="results", help="report folder (default: results/)")
    parser.add_argument("--sglang-profile", default="0.5.23", help="fake SGLang version: 0.5.4, 0.5.10, 0.5.23")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("-m", dest="marker", default="cpu", help="pytest marker expression (default: cpu)")
    args, extra = parser.parse_known_args(argv)
    report = Path(args.out) / "conformance-result.json"
    plugin = [] if plugin_installed() else ["-p", "conformance.plugin", "--noconftest"]
    pytest_args = ["--pyargs", "conformance.suite", "-m", args.marker, *plugin,
                   "-W", "ignore::pytest.PytestAssertRewriteWarning",
                   f"--sglang-profile={args.sglang_profile}", f"--conformance-seed={args.seed}",
                   f"--conformance-report={report}", *extra]  # joined forms: pytest must not take them for paths
    if args.integration:
        pytest_args.append(f"--integration={args.integration}")
    code = pytest.main(pytest_args)
    if report.exists():
        print(f"\nconformance result: {report} (summary {report.with_suffix('.md')})\n"
              f"HTML report: {report.with_suffix('.html')}")
    return int(code)


if __name__ == "__main__":
    sys.exit(main())
