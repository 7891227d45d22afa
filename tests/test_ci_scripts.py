"""The CI scripts' own logic: a stage where every test skipped fails (``.ci/ran_something.py``)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.cpu
SCRIPT = Path(__file__).resolve().parents[1] / ".ci" / "ran_something.py"


@pytest.mark.parametrize(("tests", "skipped", "code"), [(3, 3, 1), (0, 0, 1), (3, 2, 0)])
def test_a_stage_where_no_test_ran_fails_with_the_counts(tmp_path: Path, tests: int, skipped: int, code: int) -> None:
    xml = tmp_path / "junit.xml"
    xml.write_text(f'<testsuites><testsuite name="pytest" tests="{tests}" skipped="{skipped}" failures="0" '
                   f'errors="0"/></testsuites>')
    done = subprocess.run([sys.executable, str(SCRIPT), str(xml)], capture_output=True, text=True, timeout=60)
    assert done.returncode == code, done.stderr
    assert (f"none of its {tests} tests ran ({skipped} skipped)" in done.stderr) == (code == 1)


def test_a_stage_that_wrote_no_report_fails_saying_so(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, str(SCRIPT), str(tmp_path / "none.xml")], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 1 and "no readable JUnit report" in done.stderr
