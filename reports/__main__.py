"""``python -m reports``: render a conformance result, or compare it with a baseline.

    python -m reports render RESULT [--out DIR]          → RESULT.md and RESULT.html (self-contained)
    python -m reports diff BASE NEW [--threshold M=X] [--subset]
                                                         → exit 1 on a new failure or a metric regression
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from .diff import THRESHOLDS, diff
from .render import render
from .result import ResultError, load_result


def _threshold(text: str) -> tuple[str, float]:
    name, sep, value = text.partition("=")
    try:
        if not sep or name not in THRESHOLDS:
            raise ValueError
        return name, float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not METRIC=NUMBER with METRIC one of {sorted(THRESHOLDS)}") \
            from None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m reports", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    p_render = sub.add_parser("render", help="write the Markdown summary and the HTML report of a result")
    p_render.add_argument("result", type=Path)
    p_render.add_argument("--out", type=Path, default=None, help="folder for the .md and .html (default: beside it)")
    p_diff = sub.add_parser("diff", help="compare NEW with BASE; exit 1 on a regression")
    p_diff.add_argument("base", type=Path)
    p_diff.add_argument("new", type=Path)
    p_diff.add_argument("--threshold", type=_threshold, action="append", default=[], metavar="METRIC=X",
                        help=f"allowed increase of a metric (defaults: {THRESHOLDS})")
    p_diff.add_argument("--subset", action="store_true",
                        help="NEW ran only some cases: baseline cases missing from it are not regressions")
    args = parser.parse_args(argv)
    try:
        if args.command == "render":
            t0 = time.perf_counter()
            html = render(args.result, args.out)
            print(f"{html.with_suffix('.md')}\n{html}  ({html.stat().st_size / 1e6:.2f} MB, "
                  f"{time.perf_counter() - t0:.2f} s)")
            return 0
        changes = diff(load_result(args.base), load_result(args.new), dict(args.threshold), subset=args.subset)
    except ResultError as exc:
        print(f"python -m reports: {exc}", file=sys.stderr)
        return 2
    print("\n".join(changes.lines()))
    return 1 if changes.regressions else 0


if __name__ == "__main__":
    sys.exit(main())
