"""A stand-in engine program for the supervisor's tests: takes SGLang's launch flags, serves /health on --port.

``STUB_MODE`` says how it behaves: ``healthy`` (200), ``never_healthy`` (503 forever), ``exit`` (prints an error
and exits 3 at once), ``spawn`` (healthy, and starts a grandchild that sleeps, printing its pid).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    args, _ = parser.parse_known_args()
    mode = os.environ.get("STUB_MODE", "healthy")
    print(f"stub engine starting in mode {mode} on {args.host}:{args.port}", flush=True)
    if mode == "exit":
        print("stub engine: error: cannot load the model (on purpose)", flush=True)
        return 3
    if mode == "spawn":
        # sleep-ok: an idle grandchild, not a wait: the engine's teardown must kill its whole process group
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])  # sleep-ok
        print(f"grandchild pid {child.pid}", flush=True)
    status = 503 if mode == "never_healthy" else 200

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(status if self.path == "/health" else 404)
            self.end_headers()

        def log_message(self, fmt: str, *a: object) -> None:
            print("stub engine:", fmt % a, flush=True)

    ThreadingHTTPServer((args.host, args.port), Handler).serve_forever()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
