"""C3 on the fake vLLM: what the wire attributes to the prefix cache agrees with the engine's own truth (which cached
tokens the old weights computed), the reference passes in both its pause modes (``in_place`` salts its requests
apart from the KV its cache kept), the mutant that keeps the cache across loads fails with a witness, and SGLang,
whose fake keeps no radix cache, skips the scenario saying so."""

from __future__ import annotations

from dataclasses import replace
from functools import partial

import pytest

from conformance.backends import FakeBackend, FakeBackendConfig
from conformance.cases import run_one
from conformance.dialect import VllmDialect
from conformance.families import FAMILIES, VLLM_FAMILY
from conformance.history import History
from conformance.mutants import VLLM_MUTANTS
from conformance.reference import integration as reference, vllm
from conformance.situations.prefix import prefix_hits

pytestmark = pytest.mark.cpu


def _vllm() -> FakeBackend:
    return FakeBackend(FakeBackendConfig(engine="vllm"))


def _stale_in_truth(h: History) -> set[str]:
    """The rids the fake's engines served KV of older weights to (``prefix.hit`` events)."""
    dialect = VllmDialect()
    return {dialect.rid(e["fields"]["rid"]) for events in h.engine_truth["engine_events"] for e in events
            if e["kind"] == "prefix.hit" and e["fields"]["stale_tokens"]}


DESIGNS = [(vllm, False),
           (replace(vllm, capabilities=replace(vllm.capabilities, pause_modes=frozenset({"in_place"}))), False),
           (VLLM_MUTANTS["vllm_prefix_cache_kept"].integration, True)]


@pytest.mark.parametrize("integration, fails", DESIGNS, ids=["retract", "in_place", "mutant"])
def test_the_wire_attribution_is_the_engines_truth(integration, fails: bool) -> None:
    result = run_one("prefix-reuse", integration, _vllm, 0)
    h = result.history
    assert h is not None and not result.skipped
    hits = prefix_hits(h)
    assert hits and not any(hit.decided and hit.computed_by is None and hit.reset is None for hit in hits)
    # the wire decides a hit only where it is certain (a request sent while its engine's reset or the load was on
    # its way may be on either side, on a loaded machine): every hit it decides is as the engine's truth says
    decided = {hit.call.payload["rid"]: hit for hit in hits if hit.decided}
    stale_on_wire = {rid for rid, hit in decided.items() if hit.stale}
    wrong = stale_on_wire ^ (_stale_in_truth(h) & set(decided))
    assert not wrong, [(rid, decided[rid]) for rid in sorted(wrong)]
    _judged_as(result, fails)


@pytest.mark.slow  # three more scenario runs: the one-rank ones above keep the README command's tier
@pytest.mark.parametrize("integration, fails", DESIGNS, ids=["retract", "in_place", "mutant"])
def test_two_data_parallel_ranks_per_server_judge_the_same(integration, fails: bool, monkeypatch) -> None:
    """Each server with two ranks, each its own prefix cache, which the wire does not name: what the wire calls stale
    is stale in truth, and every verdict is as on one rank."""
    monkeypatch.setitem(FAMILIES, "vllm", replace(VLLM_FAMILY, fake=partial(VLLM_FAMILY.fake, data_parallel_size=2)))
    result = run_one("prefix-reuse", integration, _vllm, 0)
    h = result.history
    assert h is not None and not result.skipped
    assert {e["fields"].get("rank") for events in h.engine_truth["engine_events"] for e in events
            if e["kind"] == "prefix.hit"} == {0, 1}  # both ranks served hits
    assert {hit.call.payload["rid"] for hit in prefix_hits(h) if hit.stale} <= _stale_in_truth(h)
    _judged_as(result, fails)


def _judged_as(result, fails: bool) -> None:
    verdict = result.verdicts["C3"]
    assert verdict.status == ("fail" if fails else "pass"), verdict.explain()
    if fails:
        assert "served" in verdict.witness[0] and "before the weights were loaded" in verdict.witness[0]
    others = {c: v.status for c, v in result.verdicts.items() if c != "C3" and not v.passed}
    assert others == {}, others


def test_sglang_skips_the_scenario_saying_why() -> None:
    result = run_one("prefix-reuse", reference, lambda: FakeBackend(FakeBackendConfig()), 0)
    assert result.skipped and "keeps no radix cache" in result.skipped
