"""The checkpoint directory watch: how each checkpoint arrived, and files written into one after it arrived."""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path

import pytest

from conformance.fswatch import DirectoryWatch

pytestmark = pytest.mark.cpu


def _publish(root: Path, name: str, content: bytes) -> None:
    """Write a checkpoint elsewhere and rename it into place (replacing an older one of the same name atomically:
    the old one is renamed away first)."""
    tmp = root / f".{name}.tmp"
    tmp.mkdir()
    (tmp / "model.safetensors").write_bytes(content)
    if (root / name).exists():
        os.rename(root / name, root / f".{name}.old")
        os.rename(tmp, root / name)
        shutil.rmtree(root / f".{name}.old")
    else:
        os.rename(tmp, root / name)


def _watch(tmp_path: Path, act) -> list:
    watch = DirectoryWatch(tmp_path).start()
    act(tmp_path, watch)
    events = watch.stop()
    if events is None:
        pytest.skip("no inotify on this platform")
    return events


def test_a_reused_path_replaced_by_rename_shows_no_write_inside(tmp_path: Path) -> None:
    def act(root: Path, watch: DirectoryWatch) -> None:
        _publish(root, "latest", b"v1")
        _publish(root, "latest", b"v2")
        shutil.rmtree(root / "latest")  # cleanup deletes the files first: not a write
    events = _watch(tmp_path, act)
    assert [e.kind for e in events if e.name == "latest" and e.kind != "deleted_inside"] == [
        "moved_in", "moved_out", "moved_in", "deleted"]
    assert not [e for e in events if e.kind == "written" and e.name == "latest"], events  # (the staging dir's own
    # writes are recorded under its name: no load names it)


def _until_followed(watch: DirectoryWatch, name: str) -> None:
    deadline = time.monotonic() + 10  # in a run the next version comes a cycle later: the watch follows by then
    while watch.events is not None and not watch.following(name) and time.monotonic() < deadline:
        time.sleep(0.001)


def test_a_reused_path_rewritten_in_place_is_seen(tmp_path: Path) -> None:
    def act(root: Path, watch: DirectoryWatch) -> None:
        _publish(root, "latest", b"v1")
        _until_followed(watch, "latest")
        (root / "latest" / "model.safetensors").write_bytes(b"v2")  # the next version written over the first
        (root / "latest" / "config.json").write_text("{}")
    events = _watch(tmp_path, act)
    written = [(e.name, e.inner) for e in events if e.kind == "written"]
    assert ("latest", "model.safetensors") in written and ("latest", "config.json") in written, events


def test_a_checkpoint_created_in_place_is_followed_inside(tmp_path: Path) -> None:
    """A checkpoint made in place (shards renamed in, a marker written last): its inside is watched once its
    creation is read, so a file still written after an engine was told to load it is seen."""
    def act(root: Path, watch: DirectoryWatch) -> None:
        (root / "v1").mkdir()
        _until_followed(watch, "v1")
        (root / "v1" / ".shard.tmp").write_bytes(b"w")
        os.rename(root / "v1" / ".shard.tmp", root / "v1" / "model.safetensors")
        (root / "v1" / "COMPLETE").write_text("")
    events = [e for e in _watch(tmp_path, act) if e.name == "v1"]
    assert events[0].kind == "created" and ("written", "model.safetensors") in [(e.kind, e.inner) for e in events]
    assert ("written", "COMPLETE") in [(e.kind, e.inner) for e in events], events


def test_a_removal_shows_from_its_first_deleted_file(tmp_path: Path) -> None:
    """``rmtree`` deletes the files before the folder: an engine still reading sees them go first (F3 dates the
    removal from there)."""
    def act(root: Path, watch: DirectoryWatch) -> None:
        _publish(root, "v1", b"v1")
        _until_followed(watch, "v1")
        shutil.rmtree(root / "v1")
    events = [e for e in _watch(tmp_path, act) if e.name == "v1"]
    assert [(e.kind, e.inner) for e in events] == [("moved_in", None), ("deleted_inside", "model.safetensors"),
                                                   ("deleted", None)], events


def test_a_change_made_before_a_wire_stamp_is_stamped_before_it_however_late_the_watch_thread(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A loaded machine lets the watching thread read its events late; a checkpoint removed before an engine answered
    must still be stamped before that answer (F3's witness is the order), so the wire reads the queue first."""
    import threading

    from conformance import fswatch
    from conformance.wire import WireLog
    stalled, select = threading.Event(), fswatch.select.select

    def late(*args, **kwargs):
        stalled.wait(10)  # the watching thread reads nothing until the wire has stamped
        return select(*args, **kwargs)
    monkeypatch.setattr(fswatch.select, "select", late)
    _publish(tmp_path, "v1", b"v1")
    log = WireLog()
    watch = DirectoryWatch(tmp_path).start()
    if watch.events is None:
        pytest.skip("no inotify on this platform")
    unsync = log.sync_with(watch.sync)
    try:
        shutil.rmtree(tmp_path / "v1")
        call = log.open(0, "POST", "/update_weights_from_disk", {"model_path": str(tmp_path / "v1")})
        log.close(call, 400, {"success": False})
    finally:
        unsync()
        stalled.set()
        events = watch.stop()
    removed = [e for e in events if e.name == "v1" and e.kind == "deleted"]
    assert removed and removed[0].t <= call.t_start, (removed, call)
