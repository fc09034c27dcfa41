"""ZB-H1 (zero bubble, "handcrafted 1"; Qi et al., *Zero Bubble Pipeline Parallelism*, 2024):
1F1B with each backward split into ``B`` (input gradient, which the previous stage waits for) and
``W`` (weight gradient, which nothing waits for).

Stage ``i`` of ``S`` runs 1F1B's ``w = min(S-1-i, m)`` warm-up forwards and its steady ``F, B``
rounds, but holds back its first ``i`` weight gradients: from steady round ``i`` on, each round
ends with the oldest pending ``W``; each cool-down ``B`` is followed by one ``W``; the rest end the
step. The held-back ``W``\\ s fill the waits of 1F1B's cool-down, so with equal stages the bubble
shrinks from ``(S-1)(F+B+W)`` to ``(S-1)(F+B-W)`` (the paper's figure; the simulator checks it).
Activations are held until ``W``: every stage holds ``min(S, m)`` micro-batches at most, 1F1B's
peak on its first stage. Worked example, ``S=2, m=3``::

    stage 0:  F0 F1 B0 W0 F2 B1 W1 B2 W2
    stage 1:  F0 B0 F1 B1 W0 F2 B2 W1 W2
"""

from __future__ import annotations

from planner.schedules.ops import StageOp


def zb_h1_ops(stages: int, stage: int, micro_batches: int) -> list[StageOp]:
    m = micro_batches
    w = min(stages - 1 - stage, m)
    order = [StageOp("F", j) for j in range(w)]
    done = 0  # weight gradients run so far, oldest first
    for k in range(m - w):
        order += [StageOp("F", w + k), StageOp("B", k)]
        if k >= stage:
            order.append(StageOp("W", done))
            done += 1
    for k in range(m - w, m):
        order += [StageOp("B", k), StageOp("W", done)]
        done += 1
    return order + [StageOp("W", j) for j in range(done, m)]
