"""GPipe: all ``m`` forwards, then all ``m`` backwards in reverse order; every stage holds all
``m`` micro-batches at its peak. Worked example, ``m=3``, any stage: ``F0 F1 F2 B2 B1 B0``."""

from __future__ import annotations

from planner.schedules.ops import StageOp


def gpipe_ops(stages: int, stage: int, micro_batches: int) -> list[StageOp]:
    del stages, stage  # every stage runs the same order
    return [StageOp("F", j) for j in range(micro_batches)] + \
        [StageOp("B", j) for j in reversed(range(micro_batches))]
