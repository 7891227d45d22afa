"""Every invariant of DESIGN §6, checked on every scenario it applies to, on each backend.

A case passes only on a ``pass`` verdict: ``unknown`` (the run could not show the property) fails too,
with the reason, so a conformance run never looks green by accident.
"""

from __future__ import annotations

import json

import pytest

from conformance.cases import CASES, Case

BACKENDS = [pytest.param("fake", marks=pytest.mark.cpu), pytest.param("gpu", marks=pytest.mark.gpu)]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("case", [pytest.param(c, marks=pytest.mark.xdist_group(c.scenario), id=c.id) for c in CASES])
def test_invariant(case: Case, backend: str, conformance_run, conformance_record,
                   request: pytest.FixtureRequest) -> None:
    result = conformance_run(case.scenario, backend)
    conformance_record(case, backend, result)
    if result.skip_reason(case.check):
        pytest.skip(result.skip_reason(case.check))
    verdict = result.verdicts[case.check]
    request.node.user_properties.append(("verdict", json.dumps({"status": verdict.status,
                                                                 "metrics": verdict.metrics}, default=str)))
    if not verdict.passed:
        pytest.fail(verdict.explain(), pytrace=False)
    if backend == "gpu" and case.check == "I1-I2":  # real engines: the aborted-sample rate must stay near 0
        rate, bound = verdict.metrics.get("aborted_sample_rate"), request.config.getoption("--max-aborted-rate")
        if rate is None or rate > bound:
            pytest.fail(f"aborted_sample_rate {rate} on {case.scenario} exceeds --max-aborted-rate {bound}",
                        pytrace=False)
