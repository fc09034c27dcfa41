"""A lane's compute spans named by its schedule's ops: which ``F``, ``B`` or ``W`` each span is.

A timeline (measured by ``--trace`` or simulated, :mod:`planner.timeline`) records a split
backward's ``W`` as a ``backward`` span, like ``B``. The stage runs the registry's ops one at a
time in order (:mod:`planner.schedules`), so its forward and backward spans, in order, pair one to
one with those ops: pairing them names every span, and a pairing that fails (a forward where the
registry has a backward, another micro-batch, a span too many) means the stage did not run the
registry's order — which is what a benchmark checks before it prices ``W`` apart.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass

from planner.schedules import StageOp
from planner.timeline import Lane

COMPUTE_KINDS = ("forward", "backward")


@dataclass(frozen=True)
class OpTime:
    op: StageOp
    start: float
    end: float

    @property
    def seconds(self) -> float:
        return self.end - self.start


def op_times(lane: Lane, ops: Sequence[StageOp]) -> list[OpTime]:
    """``lane``'s compute spans paired in order with ``ops`` (the stage's op order); a lane whose
    spans are not that order is a ``ValueError`` naming the first op that differs."""
    spans = [s for s in lane.spans if s.kind in COMPUTE_KINDS]
    for k, (span, op) in enumerate(zip(spans, ops)):
        want = "forward" if op.kind == "F" else "backward"
        if span.kind != want or span.micro_batch != op.micro_batch:
            raise ValueError(f"{lane.label}: op {k} ran the {span.kind} of micro-batch {span.micro_batch}; the "
                             f"schedule's op {k} is {op.kind} of micro-batch {op.micro_batch}")
    if len(spans) != len(ops):
        raise ValueError(f"{lane.label}: {len(spans)} forward/backward spans, the schedule has {len(ops)} ops")
    return [OpTime(op, s.start, s.end) for s, op in zip(spans, ops)]


def seconds_by_kind(times: Sequence[OpTime], fused: Collection[tuple[int, int]] = ()) -> dict[str, float]:
    """Total seconds of the ``F``, ``B`` and ``W`` ops (0.0 for a kind the schedule lacks). The ``W``
    of a ``(micro-batch, chunk)`` in ``fused`` counts as ``B``: pass
    :func:`planner.schedules.inline_w.inline_w` of the ops to compare a measured lane (the executor
    computes those weight gradients inside the ``B``'s span and leaves the ``W`` empty) with a
    simulated one (which prices the ``W`` apart, at the same place in the timeline)."""
    out = {"F": 0.0, "B": 0.0, "W": 0.0}
    for t in times:
        kind = "B" if t.op.kind == "W" and (t.op.micro_batch, t.op.chunk) in fused else t.op.kind
        out[kind] += t.seconds
    return out
