"""Each mutant is the reference with one small, intended difference (the kill tests live with the suite)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch

import conformance.mutants as mutants
from conformance.fswatch import DirectoryWatch
from conformance.interface import BuildEnv, RolloutConfig, Sample, Turn
from conformance.reference import (HttpEngineClient, ReferenceIntegration, ReferenceManager, ReferenceUpdater,
                                   integration as reference, partial_rollout, write_checkpoint_atomic)
from conformance.reference.transports import DiskTransport, LoraTransport

from reference_rig import prompt_source

pytestmark = pytest.mark.cpu

# mutant -> (integration fields that differ from the reference, methods its overriding classes define)
INTENDED = {
    "version_bump_aborts": ({"client_cls"}, {"version_payload"}),
    "lora_unstamped": ({"updater_cls"}, {"transfer", "stamp"}),
    "failover_regression_stored": ({"manager_cls"}, {"on_version_regression", "start_version"}),
    "none_as_zero": ({"manager_cls"}, {"current_version", "label_value"}),
    "oldest_wrong": ({"manager_cls"}, {"oldest_version"}),
    "filter_at_production": ({"manager_cls"}, {"enqueue", "rejected_at_consumption"}),
    "recycle_partial": ({"manager_cls"}, {"handle_aborted"}),
    "rejoins_unsynced": ({"manager_cls"}, {"engine_lost"}),
    "resume_not_finally": ({"updater_cls"}, {"release_on_failure"}),
    "resumes_on_partial_weights": ({"updater_cls"}, {"after_failed_load"}),
    "success_false_ignored": ({"client_cls"}, {"check_response"}),
    "non_atomic_checkpoint": ({"disk_writer", "disk_cls"}, {"transfer"}),
    "flush_under_in_place": ({"updater_cls"}, {"flush_needed"}),
    "publish_before_transfer": ({"updater_cls"}, {"transfer"}),
    "never_pauses": ({"updater_cls"}, {"pause_all"}),
    "lora_reload_in_place": ({"lora_cls"}, {"versioned_name", "load"}),
    "pause_abort": ({"client_cls"}, {"request_body"}),
    "loads_into_released": ({"client_cls"}, {"pause", "resume"}),
    "implicit_flush_in_place": ({"client_cls"}, {"request_body"}),
    "bucket_stamped": (set(), {"make_transports"}),
    "filter_admits_bound_plus_one": ({"manager_cls"}, {"too_stale"}),
    "filter_rejects_at_bound": ({"manager_cls"}, {"too_stale"}),
    "lora_stamped_before_load": ({"updater_cls"}, {"transfer"}),
    "resumed_turn_forgets_aborted_part": ({"manager_cls", "capabilities"}, {"resumed"}),
    "gated_call_stamped_at_send": ({"manager_cls", "capabilities"}, {"updating"}),
    "versions_from_first_trainer": ({"manager_cls", "updater_cls", "capabilities"},
                                    {"request_payload", "run_turn", "publish"}),
    "refusal_ignored_after_retry": ({"client_cls"}, {"update_weights_from_disk"}),
    "unconverted_names": ({"updater_cls"}, {"update"}),
    "aborts_own_requests": ({"updater_cls", "manager_cls"}, {"pause_all", "request_payload", "turn_record"}),
    "drops_requests_on_update": ({"manager_cls"}, {"_run_group", "set_weight_version"}),
    "checkpoint_rewritten_in_place": ({"disk_writer"}, set()),
    "bare_bump_after_refusal": ({"client_cls"}, {"check_response", "version_payload"}),
    "checkpoint_freed_by_first_load": ({"disk_cls"}, {"transfer"}),
}
BASES = (HttpEngineClient, ReferenceUpdater, ReferenceManager, ReferenceIntegration, LoraTransport, DiskTransport)


def own_methods(cls: type) -> set[str]:
    return {name for name, value in vars(cls).items() if callable(value) and not name.startswith("__")}


def test_every_mutant_is_listed_reachable_and_documented() -> None:
    assert set(mutants.MUTANTS) == set(INTENDED)
    for name, mutant in mutants.MUTANTS.items():
        assert getattr(mutants, name) is mutant.integration and mutant.integration.name == name
        assert mutant.bug and mutant.source and mutant.kills
        # the reference's capabilities, or those of the reference variant it mutates (partial rollout, versions kept
        # on the client side)
        assert mutant.integration.capabilities in (reference.capabilities, partial_rollout.capabilities,
                                                   dataclasses.replace(reference.capabilities, stamps_engines=False))
    with pytest.raises(AttributeError):
        mutants.no_such_mutant  # noqa: B018


@pytest.mark.parametrize("name", sorted(INTENDED))
def test_mutant_differs_from_the_reference_only_where_intended(name: str) -> None:
    fields, methods = INTENDED[name]
    integration = mutants.MUTANTS[name].integration
    differing = {f.name for f in dataclasses.fields(reference)
                 if f.name != "name" and getattr(integration, f.name) != getattr(reference, f.name)}
    assert differing == fields
    classes = [getattr(integration, f) for f in fields if isinstance(getattr(integration, f), type)]
    classes += [type(integration)] if type(integration) is not ReferenceIntegration else []
    assert all(issubclass(cls, BASES) for cls in classes)
    assert set().union(*(own_methods(cls) for cls in classes)) == methods


def test_version_bump_mutant_drops_the_abort_flag() -> None:
    assert reference.client_cls.version_payload(None, "3") == {"new_version": "3", "abort_all_requests": False}
    mutant = mutants.MUTANTS["version_bump_aborts"].integration
    assert mutant.client_cls.version_payload(None, "3") == {"new_version": "3"}


def _manager(cls: type[ReferenceManager], tmp_path: Path) -> ReferenceManager:
    env = BuildEnv(["http://x"], tmp_path, RolloutConfig(), prompt_source())
    return cls([object()], env)  # type: ignore[list-item]  # no engine is called


def test_manager_mutants_change_the_accounting(tmp_path: Path) -> None:
    spanning = [Sample(0, [Turn("a", "2", "length", 3, ["1", "2"]), Turn("b", "3", "length", 3)])]
    unversioned = [Sample(0, [Turn("c", "default", "length", 3)])]
    ref = _manager(ReferenceManager, tmp_path)
    assert (ref.oldest_version(spanning), ref.oldest_version(unversioned), ref.current_version()) == (
        (1, 0), (None, 1), None)
    wrong = _manager(mutants.LastTurnLabelManager, tmp_path)
    assert wrong.oldest_version(spanning) == (3, 0)
    zero = _manager(mutants.NoneAsZeroManager, tmp_path)
    assert (zero.oldest_version(unversioned)[0], zero.current_version()) == (0, 0)
    silent = _manager(mutants.SilentRegressionManager, tmp_path)
    silent.set_weight_version(5)
    silent.set_weight_version(1)
    assert silent.weight_version == 1
    assert mutants.MUTANTS["failover_regression_stored"].integration.start_version(silent) == 0
    assert reference.start_version(silent) == 1


def test_in_place_checkpoint_mutant_creates_its_final_directory_in_place(tmp_path: Path) -> None:
    tensors = {"w": torch.ones(2, 2)}
    arrivals = {}
    for name, writer in (("reference", write_checkpoint_atomic), ("mutant", mutants.write_checkpoint_in_place)):
        root = tmp_path / name
        root.mkdir()
        watch = DirectoryWatch(root).start()
        writer(root, "v1", tensors, {})
        events = watch.stop()
        if events is None:
            pytest.skip("no inotify on this platform")
        arrivals[name] = [e.kind for e in events if e.name == "v1" and e.kind in ("created", "moved_in")]
    assert arrivals == {"reference": ["moved_in"], "mutant": ["created"]}  # F3
