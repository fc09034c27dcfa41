"""1F1B (non-interleaved, PipeDream-flush / Megatron): the default schedule.

Stage ``i`` of ``S`` runs ``w = min(S-1-i, m)`` warm-up forwards, then ``m-w`` steady rounds of
one forward and one backward, then ``w`` cool-down backwards. At most ``min(S-i, m)``
micro-batches are in flight on stage ``i``. Worked example, ``S=3, m=4``::

    stage 0:  F0 F1 F2 B0 F3 B1 B2 B3
    stage 1:  F0 F1 B0 F2 B1 F3 B2 B3
    stage 2:  F0 B0 F1 B1 F2 B2 F3 B3
"""

from __future__ import annotations

from planner.schedules.ops import StageOp


def one_f_one_b_ops(stages: int, stage: int, micro_batches: int) -> list[StageOp]:
    w = min(stages - 1 - stage, micro_batches)
    order = [StageOp("F", j) for j in range(w)]
    for j in range(micro_batches - w):
        order += [StageOp("F", w + j), StageOp("B", j)]
    return order + [StageOp("B", j) for j in range(micro_batches - w, micro_batches)]
