"""What a stage of a split-backward schedule holds, op by op: the memory rule of ``W`` schedules.

Between a micro-batch's ``F`` and its ``B`` the stage holds all its activations (``full``); between
a deferring ``B`` and its ``W`` only the operands of the linears' weight-gradient GEMMs that the
``B`` queued, each linear's input and output gradient (``deferred``,
:mod:`executor.parallel.weight_grad_store`; the cost model prices them,
:func:`planner.cost.wgrad_memory.deferred_wgrad_bytes`). A ``B`` whose ``W`` is inlined
(:func:`planner.schedules.inline_w.inline_w`) frees its activations as 1F1B's does. One moment per
op, taken as it starts (an ``F`` counts from its start, a ``B``'s micro-batch is still ``full``
while it runs, a ``W``'s still ``deferred``); ``grads``: autograd's gradients exist (the first
backward op has ended). Counts are chunk-activations (a whole-stage micro-batch is ``chunks``).

ZB-H1's stage ``i`` of ``S`` (``m >= S``) peaks at ``full = S - i`` and ``deferred = i``; its first
stage holds 1F1B's ``S`` and nothing deferred::

    stage 1 of 2, m=3:  F0 B0 F1 B1 W0 F2 B2 W1 W2
    full                1  1  1  1  0  1  1  0  0
    deferred            0  0  1  1  2  1  1  2  1
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from planner.schedules.inline_w import inline_w
from planner.schedules.ops import StageOp


@dataclass(frozen=True)
class Held:
    """Chunk-activations held as one op starts: ``full`` (forward done, backward not), ``deferred``
    (input gradient done, queued weight gradients not); ``grads``: after the first backward op."""

    full: int
    deferred: int
    grads: bool


def held_moments(ops: Sequence[StageOp], first_stage: bool) -> tuple[Held, ...]:
    """One :class:`Held` per op of a stage's ``ops``, in order (``first_stage``: the pipeline's first,
    whose adjacent ``W`` ops are inlined)."""
    fused = inline_w(ops, first_stage)
    has_w = {(op.micro_batch, op.chunk) for op in ops if op.kind == "W"}
    full = deferred = 0
    grads = False
    out = []
    for op in ops:
        key = (op.micro_batch, op.chunk)
        if op.kind == "F":
            full += 1
        out.append(Held(full, deferred, grads))
        if op.kind == "B":
            full -= 1
            deferred += key in has_w and key not in fused
        elif op.kind == "W" and key not in fused:
            deferred -= 1
        grads = grads or op.kind != "F"
    return tuple(out)
