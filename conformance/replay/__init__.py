"""The production-scale replay: an agentic async-RL run (seed 000's 16-node incident by default) in virtual time,
for any integration the suite loads, judged by the suite's checkers and costed (:mod:`.cost`)."""

from .cost import CostTable, cost_table
from .run import ReplayRun, TrainerStep, judge, replay
from .workload import REDUCED, ReplayConfig

__all__ = ["CostTable", "REDUCED", "ReplayConfig", "ReplayRun", "TrainerStep", "cost_table", "judge",
           "replay"]
