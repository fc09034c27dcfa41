"""Pipeline schedules as data: one registry that the executor and the cost model both read.

``schedule_named(name).ops(stages, stage, m)`` is a stage's op order; ``.in_flight`` and
``.held_with_grads`` its memory rules, ``.held`` a split backward's op by op
(:mod:`planner.schedules.held`; which ``W`` ops run inside their ``B``:
:mod:`planner.schedules.inline_w`) (:mod:`planner.schedules.registry`). Registered: ``1f1b``,
``gpipe``, ``zb-h1`` (split backward) and ``interleaved-1f1b`` (the plan's ``v >= 2`` layer chunks
per stage, 2 by default; the messages between chunks in :mod:`planner.schedules.comm`); the
executor trains them all.
"""

from planner.schedules.ops import OpKind, StageOp
from planner.schedules.registry import REGISTRY, SCHEDULE_NAMES, TRAINED_SCHEDULES, Schedule, schedule_named

__all__ = ["REGISTRY", "SCHEDULE_NAMES", "OpKind", "Schedule", "StageOp", "TRAINED_SCHEDULES", "schedule_named"]
