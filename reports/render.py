"""Writing a result and its renderings: JSON, the Markdown summary and the self-contained HTML report."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from .html import render_html
from .markdown import render_markdown
from .result import load_result


def write_report(path: Path, result: dict[str, Any]) -> Path:
    """``path`` gets the JSON result, ``.md`` and ``.html`` beside it get its renderings; returns the HTML's path."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=1, default=str))
    return render(path)


def render(result_path: Path, out_dir: Path | None = None) -> Path:
    """Render a result file to ``<stem>.md`` and ``<stem>.html`` (beside it, or in ``out_dir``); the HTML's path."""
    result = load_result(result_path)
    out = (out_dir or result_path.parent) / result_path.stem
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".md").write_text(render_markdown(result))
    html = out.with_suffix(".html")
    html.write_text(render_html(result, result_path, html.parent))
    return html
