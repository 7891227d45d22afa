"""``History.from_json`` is the inverse of ``History.to_json``, and reads histories of other suite versions."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from conformance.history import (BatchRecord, Breakage, FsEvent, History, Injected, OpenCall, Unmet, UpdateCycle,
                                 WireCall)
from conformance.interface import Batch, Group, Sample, Turn

pytestmark = pytest.mark.cpu

FIXTURES = Path(__file__).parent / "reports" / "fixtures"


def _every_record() -> History:
    turn = Turn("r1", "1", "abort", 3, weight_versions=["0", "1"], policy_version=1, continues=["r0"])
    return History(
        "s", "i", "fake", "0.5.23", 7, max_staleness=1, pause_mode="in_place", stamps_engines=False,
        wire=[WireCall(0, 1, "POST", "/generate", {"rid": "r1"}, 0.5, 0.9, 200, {"meta_info": {"id": "r1"}},
                       "sentinel")],
        cycles=[UpdateCycle(0, 0, "disk", False, "retract", 1.0, 2.0, True, None, 0, 1, 1, None, 1, ["0"], ["1"],
                            trainer_digest={"w": "ab"}, digests_after=[{"w": "ab"}])],
        batches=[BatchRecord(0, 2.5, Batch([Group(3, [Sample(0, [turn], aborted=True)], 1, 0)], 1, {"m": 1.0}), 1)],
        fs=[FsEvent(1.5, "moved_in", "ckpt-1")], injected=[Injected(0.7, "abort", 1, "x", "r1", 0.8)],
        breaks=[Breakage("hang", "stuck", 3.0, [OpenCall(0, "POST", "/flush_cache", 2.9)])],
        unmet=[Unmet(("I3", "I6"), "why", 0.1)], t_teardown=3.5, final_labels=["1", None],
        engine_truth={"nodes": ["a"]})


def test_from_json_inverts_to_json() -> None:
    h = _every_record()
    back = History.from_json(h.to_json())
    assert back == h and back.to_json() == h.to_json()
    assert History.from_json(json.loads(h.to_json())) == h


def test_histories_of_other_versions_load_with_defaults_and_without_unknown_fields() -> None:
    data = json.loads(_every_record().to_json())
    data["from_a_newer_suite"] = {"x": 1}
    data["wire"][0]["priority"] = 3
    del data["wire"][0]["origin"], data["stamps_engines"], data["batches"][0]["batch"]["groups"][0]["samples"][0][
        "turns"][0]["continues"]
    h = History.from_json(data)
    assert h.wire[0].origin == "integration" and h.stamps_engines is True
    assert h.batches[0].batch.groups[0].samples[0].turns[0].continues == []
    for path in FIXTURES.rglob("*.json.gz"):  # histories this suite wrote before
        assert History.from_json(json.loads(gzip.decompress(path.read_bytes()))).wire


def test_a_history_without_the_times_of_its_cycles_cannot_be_read() -> None:
    data = json.loads(_every_record().to_json())
    del data["cycles"][0]["t_start"]
    with pytest.raises(KeyError, match="t_start"):
        History.from_json(data)
