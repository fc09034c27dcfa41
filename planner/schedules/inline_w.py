"""Which ``W`` ops of a split backward are better fused into their ``B``: a pure function of a
stage's op order and place, decided once (the executor runs it, the memory rule charges it, the
bubble benchmark counts it).

On the pipeline's first stage a ``B`` sends nothing (no stage before it waits for its input
gradient). When its micro-batch's ``W`` (same chunk) is the very next op, deferring gains nothing —
no op runs between them — and costs memory: the linears' inputs and output gradients of the whole
micro-batch stay queued until the ``W`` (:mod:`executor.parallel.weight_grad_store`), where a plain
backward frees them layer by layer. Such a ``B`` runs the plain backward (weight gradients
inline) and its ``W`` does nothing. Not on a later stage: a plain backward reaches the stage's
input gradient only after every weight gradient, so the previous stage would wait a ``W`` longer
for it. Not with any op between ``B`` and ``W``: the weight gradients would accumulate in another
micro-batch order than the ops say, or before an op that the ``W`` was placed after. ZB-H1's first
stage fuses every ``W`` (``W(k)`` follows ``B(k)``)::

    stage 0 of ZB-H1, S=2, m=3:  F0 F1 B0 W0 F2 B1 W1 B2 W2  ->  {(0, 0), (1, 0), (2, 0)}
"""

from __future__ import annotations

from collections.abc import Sequence

from planner.schedules.ops import StageOp


def inline_w(ops: Sequence[StageOp], first_stage: bool) -> frozenset[tuple[int, int]]:
    """``(micro_batch, chunk)`` of every ``B`` of the pipeline's first layer chunk (``first_stage``
    and chunk 0) directly followed by its own ``W``."""
    if not first_stage:
        return frozenset()
    return frozenset((op.micro_batch, op.chunk) for op, nxt in zip(ops, ops[1:])
                     if op.kind == "B" and op.chunk == 0 and nxt == StageOp("W", op.micro_batch, op.chunk))
