"""Open an HTML report in headless Chromium (Debian's ``chromium`` package) over the DevTools protocol.

What a person would see, checked by a program: element boxes, screenshots (of the viewport or of an element),
every console error, uncaught exception or browser log error, and every request the page makes beyond its own
file (a self-contained report makes none). Stdlib only: a minimal WebSocket client speaks the protocol.

    python -m reports.browser REPORT.html SHOT.png [--width 1280 --height 1400]   # the README's screenshot
"""

from __future__ import annotations

import argparse
import base64
import itertools
import json
import os
import queue
import shutil
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync", "--hide-scrollbars"]
CANDIDATES = ("chromium", "chromium-browser", "/usr/bin/chromium")


class BrowserError(Exception):
    """Chromium could not be started or did not answer in time; the message says which step failed."""


def find_chromium() -> str | None:
    """The Chromium executable, or None when none is installed."""
    return next((path for name in CANDIDATES if (path := shutil.which(name))), None)


class _WebSocket:
    """Just enough RFC 6455 for the DevTools protocol: text frames out (masked), text frames in."""

    def __init__(self, url: str, timeout_s: float) -> None:
        parts = urllib.parse.urlsplit(url)
        self.sock = socket.create_connection((parts.hostname, parts.port), timeout=timeout_s)
        key = base64.b64encode(os.urandom(16)).decode()
        self.sock.sendall(f"GET {parts.path} HTTP/1.1\r\nHost: {parts.netloc}\r\nUpgrade: websocket\r\n"
                          f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n\r\n"
                          .encode())
        head = b""
        while b"\r\n\r\n" not in head:
            chunk = self.sock.recv(4096)
            if not chunk:
                raise BrowserError("the DevTools WebSocket closed during the handshake")
            head += chunk
        status = head.split(b"\r\n", 1)[0]
        if b" 101 " not in status:
            raise BrowserError(f"the DevTools WebSocket refused the upgrade: {status!r}")
        self.buffer = head.split(b"\r\n\r\n", 1)[1]

    def _read(self, n: int) -> bytes:
        while len(self.buffer) < n:
            chunk = self.sock.recv(max(65536, n - len(self.buffer)))
            if not chunk:
                raise BrowserError("the DevTools WebSocket closed")
            self.buffer += chunk
        out, self.buffer = self.buffer[:n], self.buffer[n:]
        return out

    def send(self, text: str) -> None:
        payload, mask = text.encode(), os.urandom(4)
        n = len(payload)
        size = bytes([0x80 | n]) if n < 126 else bytes([0x80 | 126]) + struct.pack(">H", n) if n < 65536 \
            else bytes([0x80 | 127]) + struct.pack(">Q", n)
        masked = bytes(b ^ mask[i % 4] for i, b in enumerate(payload))
        self.sock.sendall(b"\x81" + size + mask + masked)

    def recv(self) -> str:
        message = b""
        while True:
            b0, b1 = self._read(2)
            n = b1 & 0x7F
            n = struct.unpack(">H", self._read(2))[0] if n == 126 else struct.unpack(">Q", self._read(8))[0] \
                if n == 127 else n
            data = self._read(n)
            opcode = b0 & 0x0F
            if opcode == 8:
                raise BrowserError("the DevTools WebSocket was closed by the browser")
            if opcode in (0, 1, 2):
                message += data
                if b0 & 0x80:
                    return message.decode()

    def close(self) -> None:
        self.sock.close()


@dataclass
class Page:
    """A page loaded in Chromium; use :meth:`Browser.open`."""

    browser: "Browser"
    load_ms: float = 0.0
    """Navigation start → load event end, as the page measured it."""
    problems: list[str] = field(default_factory=list)
    """Console errors and warnings, uncaught exceptions, browser log errors."""
    requests: list[str] = field(default_factory=list)
    """URLs the page requested other than its own file (``data:`` URLs excluded)."""

    def evaluate(self, expression: str) -> Any:
        """The JSON value of a JavaScript expression in the page."""
        answer = self.browser.call("Runtime.evaluate", expression=expression, returnByValue=True)
        if "exceptionDetails" in answer:
            raise BrowserError(f"evaluating {expression[:60]!r} raised: {answer['exceptionDetails'].get('text')}")
        return answer["result"].get("value")

    def box(self, selector: str) -> dict[str, float] | None:
        """The element's box in page coordinates (x, y, width, height), or None when nothing matches."""
        return self.evaluate(f"(function(){{var e=document.querySelector({json.dumps(selector)});if(!e)return null;"
                             "var r=e.getBoundingClientRect();return {x:r.left+scrollX,y:r.top+scrollY,"
                             "width:r.width,height:r.height};})()")

    def screenshot(self, clip: dict[str, float] | None = None) -> bytes:
        """A PNG of the viewport, or of ``clip`` (page coordinates, beyond the viewport too)."""
        params: dict[str, Any] = {"format": "png"}
        if clip is not None:
            params.update(clip={**clip, "scale": 1}, captureBeyondViewport=True)
        return base64.b64decode(self.browser.call("Page.captureScreenshot", **params)["data"])


class Browser:
    """One headless Chromium with one tab, driven over the DevTools protocol. Use as a context manager: the
    process and its profile directory are always removed."""

    def __init__(self, width: int = 1280, height: int = 1400, timeout_s: float = 30.0,
                 executable: str | None = None) -> None:
        self.width, self.height, self.timeout_s = width, height, timeout_s
        self.executable = executable or find_chromium()
        if self.executable is None:
            raise BrowserError("no Chromium found (apt-get install -y chromium)")
        self._ids = itertools.count(1)
        self._events: list[dict[str, Any]] = []

    def __enter__(self) -> "Browser":
        self._profile = tempfile.mkdtemp(prefix="reports-chromium-")
        self._proc = subprocess.Popen([self.executable, *FLAGS, f"--user-data-dir={self._profile}",
                                       "--remote-debugging-port=0", "--remote-debugging-address=127.0.0.1",
                                       f"--window-size={self.width},{self.height}", "about:blank"],
                                      stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        try:
            self._ws = _WebSocket(self._page_url(self._devtools_port()), self.timeout_s)
            for domain in ("Page", "Runtime", "Log", "Network"):
                self.call(f"{domain}.enable")
            self.call("Emulation.setDeviceMetricsOverride", width=self.width, height=self.height,
                      deviceScaleFactor=1, mobile=False)
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        if getattr(self, "_ws", None) is not None:
            self._ws.close()
        self._proc.terminate()
        try:
            self._proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait(timeout=10)
        if self._proc.stderr is not None:
            self._proc.stderr.close()
        shutil.rmtree(self._profile, ignore_errors=True)

    def _devtools_port(self) -> int:
        """Chromium prints ``DevTools listening on ws://127.0.0.1:PORT/...`` on stderr once it is ready."""
        lines: queue.Queue[str] = queue.Queue()
        stderr = self._proc.stderr

        def pump() -> None:
            for raw in iter(stderr.readline, b""):
                lines.put(raw.decode(errors="replace"))
        threading.Thread(target=pump, daemon=True, name="chromium-stderr").start()
        deadline, tail = time.monotonic() + self.timeout_s, []
        while time.monotonic() < deadline:
            try:
                line = lines.get(timeout=0.2)
            except queue.Empty:
                if self._proc.poll() is not None:
                    break
                continue
            tail = (tail + [line.strip()])[-5:]
            if "DevTools listening on ws://" in line:
                return urllib.parse.urlsplit(line.split("listening on ", 1)[1].strip()).port
        raise BrowserError(f"Chromium did not open its DevTools port within {self.timeout_s:.0f}s "
                           f"(exit {self._proc.poll()}); last lines: {tail}")

    def _page_url(self, port: int) -> str:
        deadline = time.monotonic() + self.timeout_s
        while time.monotonic() < deadline:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list", timeout=self.timeout_s) as answer:
                pages = [t for t in json.load(answer) if t.get("type") == "page"]
            if pages:
                return pages[0]["webSocketDebuggerUrl"]
            time.sleep(0.05)  # the first tab is being created; /json/list is the only way to see it
        raise BrowserError("Chromium opened no tab")

    def call(self, method: str, **params: Any) -> dict[str, Any]:
        """Send one command and wait for its answer (events received meanwhile are kept)."""
        ident = next(self._ids)
        self._ws.send(json.dumps({"id": ident, "method": method, "params": params}))
        deadline = time.monotonic() + self.timeout_s
        while time.monotonic() < deadline:
            message = json.loads(self._ws.recv())
            if message.get("id") == ident:
                if "error" in message:
                    raise BrowserError(f"{method}: {message['error'].get('message')}")
                return message.get("result", {})
            if "method" in message:
                self._events.append(message)
        raise BrowserError(f"{method}: no answer within {self.timeout_s:.0f}s")

    def open(self, path: Path) -> Page:
        """Load a local HTML file and wait until it has loaded (its load event, with the document at its URL)."""
        url = path.resolve().as_uri()
        self._events.clear()
        self.call("Page.navigate", url=url)
        page = Page(self)
        deadline, seen = time.monotonic() + self.timeout_s, 0
        while not page.evaluate(f"document.readyState==='complete'&&location.href==={json.dumps(url)}"):
            if time.monotonic() > deadline:
                raise BrowserError(f"{url} did not finish loading within {self.timeout_s:.0f}s")
            while not any(e["method"] == "Page.loadEventFired" for e in self._events[seen:]):
                self._events.append(json.loads(self._ws.recv()))
            seen = len(self._events)
        page.load_ms = float(page.evaluate("(function(){var n=performance.getEntriesByType('navigation')[0];"
                                           "return n?n.loadEventEnd-n.startTime:0;})()") or 0.0)
        for e in self._events:
            p = e.get("params", {})
            if e["method"] == "Runtime.consoleAPICalled" and p.get("type") in ("error", "warning", "assert"):
                page.problems.append(f"console.{p['type']}: " + " ".join(str(a.get("value", a.get("description")))
                                                                        for a in p.get("args", [])))
            elif e["method"] == "Runtime.exceptionThrown":
                details = p.get("exceptionDetails", {})
                thrown = details.get("exception", {}).get("description") or details.get("text")
                page.problems.append(f"uncaught: {thrown}")
            elif e["method"] == "Log.entryAdded" and p.get("entry", {}).get("level") in ("error", "warning"):
                page.problems.append(f"log {p['entry']['level']}: {p['entry'].get('text')}")
            elif e["method"] == "Network.requestWillBeSent":
                requested = p.get("request", {}).get("url", "")
                if requested != url and not requested.startswith("data:"):
                    page.requests.append(requested)
        return page


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m reports.browser", description="Screenshot an HTML report "
                                     "in headless Chromium and list console errors and network requests.")
    parser.add_argument("html", type=Path)
    parser.add_argument("png", type=Path)
    parser.add_argument("--width", type=int, default=1280)
    parser.add_argument("--height", type=int, default=1400)
    args = parser.parse_args(argv)
    if not args.html.is_file():
        print(f"python -m reports.browser: {args.html}: no such file", file=sys.stderr)
        return 2
    try:
        with Browser(args.width, args.height) as browser:
            page = browser.open(args.html)
            args.png.write_bytes(page.screenshot())
    except BrowserError as exc:
        print(f"python -m reports.browser: {exc}", file=sys.stderr)
        return 2
    print(f"{args.png}: loaded in {page.load_ms:.0f} ms; problems: {page.problems or 'none'}; "
          f"requests: {page.requests or 'none'}")
    return 1 if page.problems or page.requests else 0


if __name__ == "__main__":
    sys.exit(main())
