"""Watching a checkpoint directory with Linux inotify (ctypes, no dependency).

The top level tells how each checkpoint arrived, race-free: by rename (``IN_MOVED_TO``: written elsewhere,
published atomically) or created in place (``IN_CREATE``: filled where it is read). The kernel queues events, so none
is lost to timing. Once a checkpoint has arrived, its inside is watched too, for files written into it afterwards
(``written``: a checkpoint still being filled, or a path reused across versions and rewritten in place rather than
replaced by a rename): its arrival is read, and the watch added, no later than the next wire call is stamped
(:meth:`DirectoryWatch.sync`), so every write after an engine was told to load it is seen. Deletions inside are
recorded as the start of its removal (``deleted_inside``). A checkpoint moved or deleted away is no longer followed.
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

_IN_MODIFY, _IN_CREATE, _IN_DELETE, _IN_MOVED_FROM, _IN_MOVED_TO = 0x2, 0x100, 0x200, 0x40, 0x80
_IN_ISDIR = 0x40000000
_KINDS = {_IN_CREATE: "created", _IN_DELETE: "deleted", _IN_MOVED_FROM: "moved_out", _IN_MOVED_TO: "moved_in"}
_INSIDE = _IN_MODIFY | _IN_CREATE | _IN_MOVED_TO | _IN_DELETE
"""What counts as writing into an arrived checkpoint."""
_HEADER = struct.Struct("iIII")


class DirectoryWatch:
    """Records top-level changes of ``path`` as :class:`FsEvent` until :meth:`stop`. ``events`` is None on
    platforms without inotify (checkers then answer unknown)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.events: list[FsEvent] | None = None
        self._fd = -1
        self._libc: ctypes.CDLL | None = None
        self._top = -1
        self._inside: dict[int, str] = {}
        """Watch descriptor → the checkpoint (top-level name) whose inside it watches."""
        self._followed: set[str] = set()
        """The checkpoints whose inside is watched (read from other threads)."""
        self._stop = threading.Event()
        self._lock = threading.Lock()
        """Held while events are read: by the watching thread, or by :meth:`sync` from a recorder's."""
        self._thread: threading.Thread | None = None

    def start(self) -> "DirectoryWatch":
        if not sys.platform.startswith("linux"):
            return self
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        fd = libc.inotify_init1(os.O_NONBLOCK | os.O_CLOEXEC)
        if fd < 0:
            return self
        mask = _IN_CREATE | _IN_DELETE | _IN_MOVED_FROM | _IN_MOVED_TO
        self._top = libc.inotify_add_watch(fd, str(self.path).encode(), mask)
        if self._top < 0:
            os.close(fd)
            return self
        self._fd, self._libc, self.events = fd, libc, []
        self._wake_r, self._wake_w = os.pipe()
        self._thread = threading.Thread(target=self._run, name="conformance-fswatch", daemon=True)
        self._thread.start()
        return self

    def sync(self) -> None:
        """Read the events the kernel has queued so far, so each is stamped no later than now: a stamp read after
        this call (a wire call's start or answer) orders every change made before it after the change."""
        if self._thread is not None:
            self._drain()

    def _drain(self) -> None:
        with self._lock:
            if self._fd < 0:
                return
            while True:
                try:
                    data = os.read(self._fd, 65536)
                except BlockingIOError:
                    return
                self._record(data)

    def _record(self, data: bytes) -> None:
        offset = 0
        while offset < len(data):
            wd, mask, _, length = _HEADER.unpack_from(data, offset)
            name = data[offset + _HEADER.size: offset + _HEADER.size + length].rstrip(b"\0").decode()
            offset += _HEADER.size + length
            now = time.monotonic()
            if wd != self._top:
                if wd in self._inside and mask & _INSIDE:
                    event = FsEvent(now, "deleted_inside" if mask & _IN_DELETE else "written", self._inside[wd], name)
                    last = self.events[-1] if self.events else None
                    if last is None or (last.kind, last.name, last.inner) != (event.kind, event.name, event.inner):
                        self.events.append(event)  # one event per run of writes to a file (not one per write())
                continue
            for bit, kind in _KINDS.items():
                if mask & bit:
                    self.events.append(FsEvent(now, kind, name))
                    self._follow(name, inside=bit in (_IN_MOVED_TO, _IN_CREATE) and bool(mask & _IN_ISDIR))

    def following(self, name: str) -> bool:
        """Whether the inside of checkpoint ``name`` is watched yet (it is once its arrival has been read)."""
        return name in self._followed

    def _follow(self, name: str, inside: bool) -> None:
        """Watch the inside of checkpoint ``name`` once it arrived (by rename, or created in place); stop when it is
        moved or deleted away."""
        assert self._libc is not None
        for wd in [wd for wd, n in self._inside.items() if n == name]:
            del self._inside[wd]
            self._libc.inotify_rm_watch(self._fd, wd)
        self._followed.discard(name)
        if inside:
            wd = self._libc.inotify_add_watch(self._fd, str(self.path / name).encode(), _INSIDE)
            if wd >= 0:
                self._inside[wd] = name
                self._followed.add(name)

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
            with self._lock:
                for fd in (self._fd, self._wake_r, self._wake_w):
                    os.close(fd)
                self._fd, self._thread = -1, None
        return self.events
