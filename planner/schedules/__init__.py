"""Pipeline schedules as data: one registry that the executor and the cost model both read.

``schedule_named(name).ops(stages, stage, m)`` is a stage's op order; ``.in_flight`` and
``.held_with_grads`` its memory rules (:mod:`planner.schedules.registry`). Registered: ``1f1b``,
``gpipe`` and ``zb-h1`` (split backward; the executor trains them) and ``interleaved-1f1b`` (two
layer chunks per stage), which the cost model prices and the executor refuses so far.
"""

from planner.schedules.ops import OpKind, StageOp
from planner.schedules.registry import REGISTRY, SCHEDULE_NAMES, TRAINED_SCHEDULES, Schedule, schedule_named

__all__ = ["REGISTRY", "SCHEDULE_NAMES", "OpKind", "Schedule", "StageOp", "TRAINED_SCHEDULES", "schedule_named"]
