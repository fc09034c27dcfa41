"""One op of a pipeline schedule, and the memory rules every schedule derives from its op order.

A stage runs its ops one at a time, in order. ``F`` is the forward of one micro-batch through one
layer chunk of the stage, ``B`` its backward (for schedules with ``W`` ops only the input-gradient
half, which the previous stage waits for), ``W`` the weight-gradient half of a split backward,
which nothing downstream waits for. ``chunk`` indexes the stage's layer chunks (virtual stages of
an interleaved schedule; 0 when a stage holds one chunk).

Memory: a micro-batch's activations of one chunk are held from its ``F`` until its last backward
op (``W`` where the schedule has one, else ``B``). Counts are in whole-stage micro-batches (a chunk
holds ``1/chunks`` of the stage's layers), rounded up. For ``W`` schedules that is an upper bound
(``B`` already frees what only the input gradient needed): the cost model and the executor's
preflight charge them op by op instead (:mod:`planner.schedules.held`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

OpKind = Literal["F", "B", "W"]


@dataclass(frozen=True)
class StageOp:
    """One op of one stage: ``kind`` of micro-batch ``micro_batch`` on layer chunk ``chunk``."""

    kind: OpKind
    micro_batch: int
    chunk: int = 0


def _live_after(ops: Sequence[StageOp]) -> list[int]:
    """Chunk-activations held right after each op starts (an ``F`` adds one when it starts; the
    last backward op of a (micro-batch, chunk) releases it when it ends)."""
    has_w = {(op.micro_batch, op.chunk) for op in ops if op.kind == "W"}
    live, out = 0, []
    for op in ops:
        if op.kind == "F":
            live += 1
        out.append(live)
        if op.kind == "W" or (op.kind == "B" and (op.micro_batch, op.chunk) not in has_w):
            live -= 1
    return out


def in_flight_of(ops: Sequence[StageOp], chunks: int = 1) -> int:
    """Micro-batches whose activations the stage holds at its peak (at least 1)."""
    return max(1, math.ceil(max(_live_after(ops), default=0) / chunks))


def held_with_grads_of(ops: Sequence[StageOp], chunks: int = 1) -> int:
    """Micro-batches the stage holds, at most, once its first backward op has ended (autograd's
    gradients exist from then on): the live count after it and at every later op."""
    first_b = next((k for k, op in enumerate(ops) if op.kind != "F"), None)
    if first_b is None:
        return 0
    live = _live_after(ops)
    has_w = any(op.kind == "W" for op in ops)
    after = [live[first_b] - (0 if has_w else 1)] + live[first_b + 1:]
    return max(0, math.ceil(max(after) / chunks))
