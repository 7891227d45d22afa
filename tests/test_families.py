"""One row per engine family (:mod:`conformance.families`): a third family, invented here (a thin fake of an engine
that speaks SGLang's routes under another name), is registered with one row and the main job runs on it; nothing
else in the suite names it."""

from __future__ import annotations

from typing import Any

import pytest

from conformance.cases import fake_backend_factory, load_integration, run_cases
from conformance.families import FAMILIES, Family, FakeOptions, family
from fakes.engine import FakeEngine
from fakes.profiles import DEFAULT_PROFILE

pytestmark = pytest.mark.cpu


class ToyEngine(FakeEngine):
    """An invented engine: SGLang's routes, its own release, always as the vocabulary's profile."""


def toy_engine(o: FakeOptions) -> Any:
    return ToyEngine(profile=DEFAULT_PROFILE, tokens_per_second=o.tokens_per_second,
                     max_running_requests=o.max_running_requests, enable_lora=o.enable_lora, seed=o.seed,
                     engine_id=o.engine_id)


TOY = Family("toyllm", "ToyLLM", "conformance.dialect:SGLANG_DIALECT", "conformance.reference:integration", toy_engine,
             "conformance.mutants:MUTANTS", release=lambda _: "0.1.0")


@pytest.mark.slow  # the whole main job: 13 s
def test_a_family_registered_with_one_row_runs_the_main_job(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(FAMILIES, TOY.name, TOY)
    backend = fake_backend_factory(engine=TOY.name)()
    assert (backend.name, backend.profile, TOY.engine_label("0.5.23")) == \
        ("fake-toyllm", DEFAULT_PROFILE, "ToyLLM 0.1.0")
    results = run_cases(load_integration(TOY.reference), fake_backend_factory(engine=TOY.name))
    ran = {name: r for name, r in results.items() if r.history is not None}
    assert ran and {r.history.backend for r in ran.values()} == {"fake-toyllm"}
    failed = {f"{check}-{name}": v.explain() for name, r in ran.items() for check, v in r.verdicts.items()
              if v.status != "pass"}
    assert not failed, failed
    assert sum(len(r.verdicts) for r in ran.values()) >= 200


def test_an_unknown_family_is_named_with_the_known_ones() -> None:
    with pytest.raises(ValueError, match=r"unknown engine family 'trtllm'; known: sglang, vllm"):
        family("trtllm")
    with pytest.raises(ValueError, match="no real engines here"):
        TOY.load_real()
