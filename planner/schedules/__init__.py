"""Pipeline schedules as data: one registry that the executor and the cost model both read.

``schedule_named(name).ops(stages, stage, m)`` is a stage's op order; ``.in_flight`` and
``.held_with_grads`` its memory rules (:mod:`planner.schedules.registry`).
"""

from planner.schedules.ops import OpKind, StageOp
from planner.schedules.registry import REGISTRY, SCHEDULE_NAMES, TRAINED_SCHEDULES, Schedule, schedule_named

__all__ = ["REGISTRY", "SCHEDULE_NAMES", "OpKind", "Schedule", "StageOp", "TRAINED_SCHEDULES", "schedule_named"]
