"""The conformance suite as importable test classes: subclass :class:`ConformanceSuite` in your own test tree.

    # tests/test_weight_sync_conformance.py
    from conformance.suite import ConformanceSuite

    class TestOurWeightSync(ConformanceSuite):
        integration = "ourframework.testing:integration"   # an Integration, a factory, or "module:attr"

Every (invariant, scenario) case is then an ordinary pytest item of your tree,
``TestOurWeightSync::test_case[<case id>-<backend>]``: select with ``-k``, mark one through :attr:`marks` (or your
own ``pytest_collection_modifyitems``), parametrise the integration by overriding the ``conformance_integration``
fixture with ``params``. Each scenario runs once per integration and backend, and its cases are judged on that run.
Known failures: the expectations file (``--conformance-expectations``, :mod:`conformance.expectations`).

The fixtures it uses (``conformance_session``, ``conformance_record``) come from the pytest plugin, which pytest
loads from the installed package's entry point.
"""

from __future__ import annotations

import fnmatch
import json
from typing import Any, ClassVar, Collection, Mapping

import pytest

from ..backend_table import BACKENDS
from ..cases import CASES, Case, scenario_bound_s
from ..preflight import probe_bound_s
from ..scenarios import DEADLINES
from ..session import ScenarioRunError


class ConformanceSuite:
    """Every conformance case as a test method; subclass it (its name must match your ``python_classes``, by
    default ``Test*``) and set what differs."""

    integration: ClassVar[Any] = None
    """The integration under test: an Integration, a factory called with no arguments, or ``"module:attr"``.
    None: the session's (``--conformance-integration``, ini ``conformance_integration``, the reference)."""
    backends: ClassVar[Collection[str] | None] = None
    """Backends to run the cases on (None: every one of :data:`conformance.backend_table.BACKENDS`; each case
    carries its backend's marker: ``-m cpu`` / ``-m gpu`` / ``-m sglang`` select among them)."""
    scenarios: ClassVar[Collection[str] | None] = None
    """Only these scenarios (None: every one)."""
    invariants: ClassVar[Collection[str] | None] = None
    """Only these invariants (None: every one)."""
    marks: ClassVar[Mapping[str, Any]] = {}
    """Case id or glob → a pytest mark (or a list of marks) for those cases, e.g.
    ``{"I3-steady-*": pytest.mark.xfail(reason="abort-mode pauses, #123", strict=True)}``."""

    @pytest.fixture(scope="class")
    @classmethod
    def conformance_integration(cls, request: pytest.FixtureRequest, conformance_session: Any) -> Any:
        """The class's integration; override with ``params`` to parametrise it (class scope keeps one object per
        parameter, so each scenario runs once per parameter)."""
        chosen = request.cls.integration if request.cls is not None else None
        return conformance_session.integration() if chosen is None else conformance_session.resolve(chosen)

    def pytest_generate_tests(self, metafunc: pytest.Metafunc) -> None:
        if metafunc.definition.originalname != "test_case":
            return
        cls = metafunc.cls
        cases = [c for c in CASES if (cls.scenarios is None or c.scenario in cls.scenarios)
                 and (cls.invariants is None or c.check in cls.invariants)]
        bound = pytest.mark.timeout(case_timeout_s(metafunc.config))
        metafunc.parametrize("case", [pytest.param(c, marks=[bound, *self._marks(c)], id=c.id) for c in cases])
        metafunc.parametrize("backend", [pytest.param(b, marks=getattr(pytest.mark, BACKENDS[b].marker))
                                         for b in (BACKENDS if cls.backends is None else cls.backends)])

    def _marks(self, case: Case) -> list[Any]:
        found: list[Any] = []
        for pattern, marks in type(self).marks.items():
            if fnmatch.fnmatchcase(case.id, pattern):
                found += marks if isinstance(marks, (list, tuple)) else [marks]
        return found

    def test_case(self, case: Case, backend: str, conformance_integration: Any, conformance_session: Any,
                  conformance_record: Any, request: pytest.FixtureRequest) -> None:
        """One case: its scenario's run (shared by the scenario's cases), judged by its invariant. A case passes
        only on a ``pass`` verdict: ``unknown`` fails too, with the reason; a skip says why."""
        expectations = conformance_session.expectations()
        entry = expectations.lookup(case.id, backend) if expectations is not None else None
        try:
            result = conformance_session.run(conformance_integration, case.scenario, backend,
                                             ahead=_scenarios_collected(request, backend))
        except ScenarioRunError as exc:  # no verdict at all: never the listed failure
            listed = entry and expectations.judge(entry, case.id, "error", witness=[str(exc)])
            pytest.fail(f"{listed.message}\n{exc}" if listed else str(exc), pytrace=False)
        reason = result.skip_reason(case.check)
        verdict = None if reason else result.verdicts[case.check]
        judgement = entry and expectations.judge(entry, case.id, verdict and verdict.status,
                                                 bool(verdict and verdict.run_broke),
                                                 verdict.witness if verdict else ())
        conformance_record(case, backend, result, expected=judgement and {
            "reason": entry.reason, "link": entry.link, "entry": entry.pattern, "kind": entry.kind,
            "outcome": judgement.outcome})
        if reason:
            pytest.skip(reason)
        request.node.user_properties.append(("verdict", json.dumps({"status": verdict.status,
                                                                     "metrics": verdict.metrics}, default=str)))
        if judgement is not None and judgement.as_listed:  # failed, or answered unknown, as listed
            pytest.xfail(f"{judgement.message}: {verdict.explain()}")
        if judgement is not None:  # passes although listed, or another verdict than listed
            pytest.fail(judgement.message + ("" if verdict.passed else "\n" + verdict.explain()), pytrace=False)
        if not verdict.passed:
            pytest.fail(verdict.explain(), pytrace=False)
        if BACKENDS[backend].bounds_aborted_rate and case.check == "I1-I2":  # real engines: aborted rate near 0
            rate, bound = verdict.metrics.get("aborted_sample_rate"), \
                request.config.getoption("conformance_max_aborted_rate")
            if rate is None or rate > bound:
                pytest.fail(f"aborted_sample_rate {rate} on {case.scenario} exceeds --conformance-max-aborted-rate "
                            f"{bound}", pytrace=False)


def case_timeout_s(config: pytest.Config, update_budget_s: float | None = None) -> float:
    """pytest-timeout's bound on one case: never under the suite's own bounds on what the case may wait for (the
    release check before a session's first scenario, :func:`conformance.preflight.probe_bound_s`, then the scenario:
    its script's deadline plus the teardown margin, :func:`conformance.cases.scenario_bound_s`) plus a minute, so a
    hung scenario gets its verdict from the suite, once, and every case of it the hang witness; a larger
    ``--timeout`` (or ini ``timeout``) stands. ``update_budget_s``: the integration's declared update budget
    (``Capabilities.update_budget_s``), which extends the scenario's deadlines."""
    try:
        configured = config.getoption("timeout", None)
        configured = float(config.getini("timeout") if configured is None else configured)
    except (ValueError, TypeError):
        configured = 0.0
    return max(configured, probe_bound_s() + scenario_bound_s(DEADLINES.with_update_budget(update_budget_s)) + 60.0)


_COLLECTED = pytest.StashKey[dict[tuple[Any, str], list[str]]]()


def _scenarios_collected(request: pytest.FixtureRequest, backend: str) -> list[str]:
    """The scenarios of the cases collected in this case's class on ``backend``, in collection order (what the
    session may run ahead); read off the session's items once per session."""
    if _COLLECTED not in request.session.stash:
        found: dict[tuple[Any, str], dict[str, None]] = {}
        for item in request.session.items:
            params = getattr(getattr(item, "callspec", None), "params", {})
            if "case" in params and "backend" in params:
                found.setdefault((getattr(item, "cls", None), params["backend"]), {})[params["case"].scenario] = None
        request.session.stash[_COLLECTED] = {key: list(names) for key, names in found.items()}
    return request.session.stash[_COLLECTED].get((request.node.cls, backend), [])


__all__ = ["ConformanceSuite", "case_timeout_s"]
