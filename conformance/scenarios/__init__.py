"""Scenarios: a workload plus a trainer script, run against an integration on a backend, producing a History.

Split by responsibility: ``errors`` (how a run breaks, bounded waits), ``trainer`` (the stand-in trainer), ``run``
(what a script drives: update cycles with the faults injected at the wire, drains, failover, waits),
``capabilities`` (typed needs and their resolution against an integration), ``definition`` (the ``Scenario``),
``lifecycle`` (set-up, script, tear-down; shared with the model-based run) and ``catalogue`` (the scenarios as data).
Every wait has a deadline; a hung integration fails the scenario with a message, never hangs the run.
"""

from .capabilities import Needs
from .catalogue import SCENARIOS
from .definition import DEFAULT_ROLLOUT, Scenario, Script
from .errors import Hang, RunBroken, ScenarioTimeout, UnexpectedUpdateFailure, Unsupported, bounded, open_calls
from .lifecycle import build_env, new_history, new_run, run_scenario
from .run import DEADLINES, TRANSFER_FAILURES, Deadlines, Run
from .trainer import Trainer

__all__ = ["DEADLINES", "DEFAULT_ROLLOUT", "SCENARIOS", "TRANSFER_FAILURES", "Deadlines", "Hang", "Needs", "Run",
           "RunBroken", "Scenario", "ScenarioTimeout", "Script", "Trainer", "UnexpectedUpdateFailure", "Unsupported",
           "bounded", "build_env", "new_history", "new_run", "open_calls", "run_scenario"]
