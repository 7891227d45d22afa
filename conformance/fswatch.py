"""Watching the top of a checkpoint directory with Linux inotify (ctypes, no dependency).

Only the top level is watched, which is race-free: a checkpoint directory either arrives by rename
(``IN_MOVED_TO``: written elsewhere, published atomically) or is created in place (``IN_CREATE``: filled where
readers can see it half-written). The kernel queues events, so none is lost to timing.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import select
import struct
import sys
import threading
import time
from pathlib import Path

from .history import FsEvent

_IN_CREATE, _IN_DELETE, _IN_MOVED_FROM, _IN_MOVED_TO = 0x100, 0x200, 0x40, 0x80
_KINDS = {_IN_CREATE: "created", _IN_DELETE: "deleted", _IN_MOVED_FROM: "moved_out", _IN_MOVED_TO: "moved_in"}
_HEADER = struct.Struct("iIII")


class DirectoryWatch:
    """Records top-level changes of ``path`` as :class:`FsEvent` until :meth:`stop`. ``events`` is None on
    platforms without inotify (checkers then answer unknown)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.events: list[FsEvent] | None = None
        self._fd = -1
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> "DirectoryWatch":
        if not sys.platform.startswith("linux"):
            return self
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        fd = libc.inotify_init1(os.O_NONBLOCK | os.O_CLOEXEC)
        if fd < 0:
            return self
        mask = _IN_CREATE | _IN_DELETE | _IN_MOVED_FROM | _IN_MOVED_TO
        if libc.inotify_add_watch(fd, str(self.path).encode(), mask) < 0:
            os.close(fd)
            return self
        self._fd, self.events = fd, []
        self._wake_r, self._wake_w = os.pipe()
        self._thread = threading.Thread(target=self._run, name="conformance-fswatch", daemon=True)
        self._thread.start()
        return self

    def _drain(self) -> None:
        try:
            data = os.read(self._fd, 65536)
        except BlockingIOError:
            return
        offset = 0
        while offset < len(data):
            _, mask, _, length = _HEADER.unpack_from(data, offset)
            name = data[offset + _HEADER.size: offset + _HEADER.size + length].rstrip(b"\0").decode()
            offset += _HEADER.size + length
            for bit, kind in _KINDS.items():
                if mask & bit:
                    self.events.append(FsEvent(time.monotonic(), kind, name))

    def _run(self) -> None:
        while not self._stop.is_set():
            ready, _, _ = select.select([self._fd, self._wake_r], [], [])  # blocks: no CPU while nothing happens
            if self._fd in ready:
                self._drain()

    def stop(self) -> list[FsEvent] | None:
        if self._thread is not None:
            self._stop.set()
            os.write(self._wake_w, b"x")
            self._thread.join(timeout=5)
            self._drain()
            for fd in (self._fd, self._wake_r, self._wake_w):
                os.close(fd)
            self._thread = None
        return self.events
