"""Scenarios: a workload plus a trainer script, run against an integration on a backend, producing a History.

Split by responsibility: ``trainer`` (the stand-in trainer), ``run`` (what a script drives: update cycles, drains,
failover; the situations built around them live in :mod:`conformance.situations`, how a run breaks in
:mod:`conformance.breaks`),
``capabilities`` (typed needs and their resolution against an integration), ``definition`` (the ``Scenario``),
``lifecycle`` (set-up, script, tear-down; shared with the model-based run) and ``catalogue`` (the scenarios as data).
Every wait has a deadline; a hung integration fails the scenario with a message, never hangs the run.
"""

from .capabilities import Needs
from .catalogue import SCENARIOS
from .definition import DEFAULT_ROLLOUT, Scenario, Script
from ..breaks import Hang, RunBroken, ScenarioTimeout, UnexpectedUpdateFailure, Unsupported, bounded, open_calls
from ..situations.refused import TRANSFER_FAILURES
from ..situations.timing import DEADLINES, Deadlines
from .lifecycle import build_env, new_history, new_run, run_scenario
from .run import Run
from .trainer import Trainer

__all__ = ["DEADLINES", "DEFAULT_ROLLOUT", "SCENARIOS", "TRANSFER_FAILURES", "Deadlines", "Hang", "Needs", "Run",
           "RunBroken", "Scenario", "ScenarioTimeout", "Script", "Trainer", "UnexpectedUpdateFailure", "Unsupported",
           "bounded", "build_env", "new_history", "new_run", "open_calls", "run_scenario"]
