"""The README is a user's document: short, undated, and every link in it (and in docs/) resolves inside the
repository."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

pytestmark = pytest.mark.cpu

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")


def test_the_readme_is_at_most_350_lines_and_carries_no_dates_or_run_histories() -> None:
    text = (ROOT / "README.md").read_text()
    assert len(text.splitlines()) <= 350
    assert not re.findall(r"\b20\d\d-\d\d-\d\d\b|\bthe run at \d\d:\d\d", text)


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_every_link_resolves_inside_the_repository(doc: Path) -> None:
    targets = [t for t in LINK.findall(doc.read_text()) if not re.match(r"[a-z]+://|mailto:", t)]
    assert targets or doc.name != "README.md", "the link pattern finds the README's links"
    outside = [t for t in targets if ROOT not in (doc.parent / t).resolve().parents]
    missing = [t for t in targets if not (doc.parent / t).exists()]
    assert (outside, missing) == ([], [])
