"""The HTML report in a real headless browser (Debian's Chromium, installed by ``.ci/run``): the matrix and a
timeline are on screen in its screenshots, nothing is logged as an error, nothing is fetched, and the "show in
the timeline" link highlights what the witness names."""

from __future__ import annotations

import struct
import time
import zlib
from pathlib import Path

import pytest
from conftest import RECORDED

from reports.browser import Browser, find_chromium
from reports.render import render

pytestmark = [pytest.mark.cpu, pytest.mark.slow, pytest.mark.skipif(find_chromium() is None, reason=(
    "no Chromium on this machine (apt-get install -y chromium; .ci/run installs it): the report was not opened "
    "in a browser"))]

PASS_CELL, FAIL_CELL = (0xD9, 0xF2, 0xE0), (0xF8, 0xD4, 0xD4)
FINISHED, ABORTED = (0x4C, 0x9A, 0x6A), (0xD6, 0x45, 0x45)


def png_pixels(png: bytes) -> list[tuple[int, int, int]]:
    """Every pixel (RGB) of an 8-bit RGB/RGBA, non-interlaced PNG (what Chromium writes)."""
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    pos, idat, header = 8, b"", None
    while pos < len(png):
        (length,), kind = struct.unpack(">I", png[pos:pos + 4]), png[pos + 4:pos + 8]
        data = png[pos + 8:pos + 8 + length]
        if kind == b"IHDR":
            header = struct.unpack(">IIBBBBB", data)
        elif kind == b"IDAT":
            idat += data
        pos += 12 + length
    width, height, depth, colour, _, _, interlace = header
    assert depth == 8 and colour in (2, 6) and interlace == 0, header
    bpp = 3 if colour == 2 else 4
    raw, stride, prev, pixels = zlib.decompress(idat), width * bpp, bytearray(width * bpp), []
    for y in range(height):
        kind, row = raw[y * (stride + 1)], bytearray(raw[y * (stride + 1) + 1:(y + 1) * (stride + 1)])
        for i in range(stride):
            a = row[i - bpp] if i >= bpp else 0
            b, c = prev[i], prev[i - bpp] if i >= bpp else 0
            if kind == 1:
                row[i] = (row[i] + a) & 0xFF
            elif kind == 2:
                row[i] = (row[i] + b) & 0xFF
            elif kind == 3:
                row[i] = (row[i] + (a + b) // 2) & 0xFF
            elif kind == 4:
                p = a + b - c
                pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                row[i] = (row[i] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 0xFF
        pixels += [tuple(row[x * bpp:x * bpp + 3]) for x in range(width)]
        prev = row
    return pixels


def test_the_report_in_headless_chromium(tmp_path: Path) -> None:
    html = render(RECORDED, tmp_path)
    t0 = time.perf_counter()
    with Browser(width=1280, height=1000) as browser:
        page = browser.open(html)
        assert page.problems == [] and page.requests == []
        assert page.load_ms < 2000
        matrix, timeline = page.box("#matrix table"), page.box("svg.timeline")
        assert matrix and timeline and matrix["width"] > 100 and timeline["width"] > 1000
        assert matrix["y"] + matrix["height"] < 1000, "the matrix is on the first screen"
        cells = png_pixels(page.screenshot(clip=matrix))
        assert cells.count(PASS_CELL) > 500 and cells.count(FAIL_CELL) > 100
        first = png_pixels(page.screenshot())
        assert first.count(PASS_CELL) > 500, "the viewport screenshot shows the matrix"
        bars = png_pixels(page.screenshot(clip={**timeline, "height": min(timeline["height"], 400)}))
        assert bars.count(FINISHED) > 200 and bars.count(ABORTED) > 200, "requests finished and aborted are drawn"
        assert page.evaluate("document.querySelectorAll('.focus').length") == 0
        page.evaluate("document.querySelector('a.show').click()")
        focused = page.evaluate("Array.from(document.querySelectorAll('.focus')).map(e => e.getAttribute('class'))")
        assert any(c.startswith("rq o-aborted") for c in focused) and any(c.startswith("lane") for c in focused)
        bad = tmp_path / "bad.html"  # the checks above can fail: the same session sees errors and fetches
        bad.write_text('<html><body><img src="http://127.0.0.1:9/x.png"><script>console.error("boom");'
                       "undefinedFunction();</script></body></html>")
        seen = browser.open(bad)
        assert any("boom" in p for p in seen.problems) and any("undefinedFunction" in p for p in seen.problems)
        assert seen.requests == ["http://127.0.0.1:9/x.png"]
    print(f"headless Chromium: started, loaded in {page.load_ms:.0f} ms, checked in {time.perf_counter() - t0:.1f} s")
