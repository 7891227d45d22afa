"""vLLM's native weight transfer in the suite's vocabulary (``conformance.dialect``): the session ≈ SGLang's
begin/end weight update, the transfer ≈ ``/update_weights_from_distributed``, the group ≈ a weight-update group; and
the reference on vLLM running the distributed scenarios through it on the fake vLLM (gloo)."""

from __future__ import annotations

import pytest

from conformance.backends import FakeBackend, FakeBackendConfig
from conformance.cases import run_one
from conformance.checks.effective import effective
from conformance.dialect import VOCABULARY_PROFILE, VllmDialect
from conformance.history import WireCall
from conformance.reference import vllm

pytestmark = pytest.mark.cpu


def _recorded(dialect: VllmDialect, path: str, payload: object = None) -> WireCall:
    path, payload = dialect.recorded("POST", path, "", payload)
    return WireCall(0, 0, "POST", path, payload, 0.0)


def test_the_lifecycle_is_recorded_as_sglangs_group_session_and_distributed_transfer() -> None:
    d = VllmDialect()
    init = _recorded(d, "/init_weight_transfer_engine", {"init_info": {
        "master_address": "127.0.0.1", "master_port": 1234, "rank_offset": 1, "world_size": 3, "group_name": "g7"}})
    assert (init.path, init.payload) == ("/init_weights_update_group", {
        "master_address": "127.0.0.1", "master_port": 1234, "rank_offset": 1, "world_size": 3, "group_name": "g7",
        "backend": "gloo"})
    assert _recorded(d, "/start_weight_update").path == "/begin_weight_update"
    update = _recorded(d, "/update_weights", {"update_info": {"names": ["w"], "dtype_names": ["bfloat16"],
                                                             "shapes": [[2, 3]]}})
    assert update.path == "/update_weights_from_distributed"
    assert update.payload["dtypes"] == ["bfloat16"] and update.payload["group_name"] == "g7"
    # vLLM's update neither flushes a cache nor aborts: the checkers must read it so (SGLang's defaults differ)
    assert effective(update, "flush_cache", VOCABULARY_PROFILE) is False
    assert effective(update, "abort_all_requests", VOCABULARY_PROFILE) is False
    finish = _recorded(d, "/finish_weight_update", {"weight_version": "3"})
    assert (finish.path, finish.payload) == ("/end_weight_update", {"weight_version": "3"})
    assert _recorded(d, "/shutdown_weight_transfer_engine").payload == {"group_name": "g7"}


def test_a_start_after_a_failed_update_continues_the_session_the_checkers_see() -> None:
    d = VllmDialect()
    assert _recorded(d, "/start_weight_update").path == "/begin_weight_update"
    d.answered("/update_weights_from_distributed", {}, {"error": {"message": "boom", "code": 500}})
    assert _recorded(d, "/start_weight_update").path == "/start_weight_update"  # reopened: outside the vocabulary
    assert _recorded(d, "/finish_weight_update").path == "/end_weight_update"
    assert _recorded(d, "/start_weight_update").path == "/begin_weight_update"  # a new cycle's session


@pytest.mark.parametrize("scenario", ["steady-distributed-in_place", "failing-transfer-distributed"])
def test_the_vllm_reference_passes_the_distributed_scenarios_over_vllms_native_transfer(scenario: str) -> None:
    assert "distributed" in vllm.capabilities.transports
    result = run_one(scenario, vllm, lambda: FakeBackend(FakeBackendConfig(engine="vllm")), 0)
    assert result.history is not None
    assert {c: v.explain() for c, v in result.verdicts.items() if v.status != "pass"} == {}
    sent = {(c.path, c.sent_as) for c in result.history.wire if c.origin == "integration"}
    assert {("/init_weights_update_group", "POST /init_weight_transfer_engine"),
            ("/begin_weight_update", "POST /start_weight_update"),
            ("/update_weights_from_distributed", "POST /update_weights"),
            ("/update_weight_version", "POST /update_weight_version"),
            ("/end_weight_update", "POST /finish_weight_update")} <= sent
    assert not any(c.path == "/update_weights_from_disk" for c in result.history.wire)
