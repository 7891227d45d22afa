"""Fail a CI stage whose tests all skipped: ``python .ci/ran_something.py JUNIT_XML`` exits 1 (saying so) when the
JUnit report pytest wrote (``--junitxml``) holds no test that ran, 0 otherwise. pytest itself exits 0 then, so a
real-engine stage whose engine never came up (every case skipped with its reason) would pass unseen."""

from __future__ import annotations

import sys
import xml.etree.ElementTree as ET


def counts(path: str) -> tuple[int, int]:
    """(tests, skipped) over every test suite of the report."""
    root = ET.parse(path).getroot()
    suites = [root] if root.tag == "testsuite" else root.findall("testsuite")
    return (sum(int(s.get("tests", 0)) for s in suites), sum(int(s.get("skipped", 0)) for s in suites))


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: ran_something.py JUNIT_XML", file=sys.stderr)
        return 2
    try:
        tests, skipped = counts(argv[0])
    except (OSError, ET.ParseError) as exc:
        print(f"CI: no readable JUnit report at {argv[0]} ({exc}) — failing", file=sys.stderr)
        return 1
    if tests - skipped <= 0:
        print(f"CI: {argv[0]}: none of its {tests} tests ran ({skipped} skipped) — failing", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
