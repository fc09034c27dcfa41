"""Which ``W`` ops of a split backward are better fused into their ``B``: a pure function of a
stage's op order, decided once (the executor runs it, the memory rule charges it).

A ``B`` whose micro-batch's ``W`` (same chunk) is the very next op of the stage gains nothing by
deferring its weight gradients — no op runs between them — and deferring costs memory: the
linears' inputs and output gradients of the whole micro-batch stay queued until the ``W``
(:mod:`executor.parallel.weight_grad_store`) where a plain backward frees them layer by layer. Such
a ``B`` runs the plain backward (weight gradients inline) and its ``W`` does nothing. ZB-H1's
first stage fuses every micro-batch (its ``W(k)`` follows ``B(k)``), its other stages only none:
stage ``i`` holds ``i`` ``W``\\ s back, so the ``W`` after a ``B`` is an older micro-batch's.
Nothing but the adjacent ``W`` qualifies: with another op between, the weight gradients would
accumulate in another micro-batch order than the ops say (a ``W`` of an older micro-batch), or
the ``B``'s send would wait for them.

    stage 0 of ZB-H1, S=2, m=3:  F0 F1 B0 W0 F2 B1 W1 B2 W2  ->  {(0, 0), (1, 0), (2, 0)}
    stage 1:                     F0 B0 F1 B1 W0 F2 B2 W1 W2  ->  {}
"""

from __future__ import annotations

from collections.abc import Sequence

from planner.schedules.ops import StageOp


def inline_w(ops: Sequence[StageOp]) -> frozenset[tuple[int, int]]:
    """``(micro_batch, chunk)`` of every ``B`` directly followed by its own ``W``."""
    return frozenset((op.micro_batch, op.chunk) for op, nxt in zip(ops, ops[1:])
                     if op.kind == "B" and nxt == StageOp("W", op.micro_batch, op.chunk))
