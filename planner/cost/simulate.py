"""A small discrete-event simulator of one pipeline's schedule, any schedule of the registry.

Model: stage ``i`` runs its ops one at a time in the schedule's fixed order
(:mod:`planner.schedules`, the same ops the executor runs); an op starts when the stage is free and
its input is ready, and lasts its duration. With ``v`` layer chunks per stage, chunk ``c`` of stage
``i`` is virtual stage ``k = c·S + i`` (``v = 1``: ``k = i``), and does the part ``shares[i][c]``
of the stage's compute (``1/v`` below, unless given):

* ``F(k, j)`` (forward of micro-batch ``j``) lasts ``fwd[i]/v`` and needs ``F(k-1, j)`` done;
* ``B(k, j)`` (backward) lasts ``bwd[i]/v`` and needs ``B(k+1, j)`` done (the last virtual
  stage: ``F(k, j)``);
* ``W(k, j)`` (the weight-gradient half of a split backward) lasts ``wgrad[i]/v``, taken out of
  ``B``'s time, and needs ``B(k, j)`` done; nothing waits for it but the stage's own next op.

Point-to-point sends are *blocking for the sender*: pass them folded into the durations
(``fold_p2p``): stage ``i``'s forward includes sending its activation to ``i+1``, its backward
includes sending the input gradient to ``i-1``. This matches :mod:`planner.cost.schedule`. With
chunks, pass the sends apart (``sends``): every op that sends (:func:`planner.schedules.comm.op_peers`:
each chunk's, the last stage's to the first between chunks too) carries one whole send, as the
executor sends one whole activation per virtual-stage boundary.

Per-stage micro-batch durations may also vary per micro-batch (``fwd_mb[i][j]``), which the
planner's benchmarks use for uneven micro-batch sizes.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from planner.schedules import StageOp, schedule_named
from planner.schedules.comm import op_peers


@dataclass
class SimResult:
    makespan: float
    busy: list[float]  # per stage: total op time
    first_start: list[float]  # per stage: start of its first op
    last_backward_end: list[float]  # per stage: end of its last op (a backward)
    ops: list[list[tuple[str, int, float, float]]] = field(default_factory=list)  # (kind, mb, start, end)
    op_chunks: list[list[int]] = field(default_factory=list)  # per stage: the layer chunk of each recorded op

    @property
    def idle(self) -> list[float]:
        """Per stage: time inside [0, makespan] not spent on ops (bubble)."""
        return [self.makespan - b for b in self.busy]


def fold_p2p(fwd: Sequence[float], bwd: Sequence[float], p2p_fwd: Sequence[float],
             p2p_bwd: Sequence[float]) -> tuple[list[float], list[float]]:
    """Add blocking sends to stage durations: ``p2p_fwd[i]`` (activation i -> i+1) to ``fwd[i]``,
    ``p2p_bwd[i]`` (gradient i+1 -> i) to ``bwd[i+1]``. Both p2p lists have ``S - 1`` entries."""
    s = len(fwd)
    f = [fwd[i] + (p2p_fwd[i] if i < s - 1 else 0.0) for i in range(s)]
    b = [bwd[i] + (p2p_bwd[i - 1] if i > 0 else 0.0) for i in range(s)]
    return f, b


Table = Sequence[float] | Sequence[Sequence[float]]


def _dur(table: Table, i: int, j: int) -> float:
    v = table[i]
    return float(v[j]) if isinstance(v, Sequence) else float(v)


def simulate(fwd: Table, bwd: Table, m: int, schedule: str = "1f1b", record: bool = False,
             wgrad: Table | None = None, sends: tuple[Table, Table] | None = None,
             chunks: int | None = None, shares: Sequence[Sequence[float]] | None = None) -> SimResult:
    """Simulate one pipeline. ``fwd[i]`` / ``bwd[i]`` are stage ``i``'s per-micro-batch durations
    (a number, or a list of ``m`` numbers); ``wgrad[i]`` the weight-gradient part of ``bwd[i]``,
    needed by schedules that split the backward into ``B`` and ``W`` ops; ``sends`` (``fwd`` and
    ``bwd`` then exclude them): stage ``i``'s send of an activation to the stage of the next virtual
    stage and of a gradient to the previous one's, added to every op that sends; ``chunks``: layer
    chunks per stage (None: the schedule's default); ``shares[i][c]``: the part of stage ``i``'s
    compute that its chunk ``c`` does (None: ``1/v`` each). An unknown schedule name is a
    :class:`~planner.errors.SpecError`."""
    s = len(fwd)
    if s == 0 or len(bwd) != s or m < 1:
        raise ValueError("need one forward and one backward duration per stage and m >= 1")
    sched = schedule_named(schedule)
    v = sched.chunks_of(chunks)
    orders = [sched.ops(s, i, m, v) for i in range(s)]
    split = any(op.kind == "W" for o in orders for op in o)
    if split and wgrad is None:
        raise ValueError(f"schedule {schedule!r} splits the backward: give wgrad, the weight-gradient times")

    def duration(op: StageOp, i: int) -> float:
        j = op.micro_batch
        send = 0.0
        if sends is not None and op_peers(op, s, i, v).send is not None:
            send = _dur(sends[0] if op.kind == "F" else sends[1], i, j)
        part = shares[i][op.chunk] if shares is not None else 1.0 / v
        if op.kind == "F":
            return _dur(fwd, i, j) * part + send
        w = _dur(wgrad, i, j) if split and wgrad is not None else 0.0
        return (w if op.kind == "W" else _dur(bwd, i, j) - w) * part + send

    end: dict[tuple[str, int, int], float] = {}  # (kind, virtual stage, micro-batch) -> end

    def ready(op: StageOp, i: int) -> float | None:
        k = op.chunk * s + i
        if op.kind == "F":
            dep = ("F", k - 1, op.micro_batch) if k > 0 else None
        elif op.kind == "B":
            dep = ("B", k + 1, op.micro_batch) if k < v * s - 1 else ("F", k, op.micro_batch)
        else:
            dep = ("B", k, op.micro_batch)
        return 0.0 if dep is None else end.get(dep)

    pos = [0] * s
    free = [0.0] * s
    busy = [0.0] * s
    first = [0.0] * s
    ops: list[list[tuple[str, int, float, float]]] = [[] for _ in range(s)]
    op_chunks: list[list[int]] = [[] for _ in range(s)]
    remaining = sum(len(o) for o in orders)
    while remaining:
        progressed = False
        for i in range(s):
            while pos[i] < len(orders[i]):
                op = orders[i][pos[i]]
                at = ready(op, i)
                if at is None:
                    break
                d = duration(op, i)
                start = max(free[i], at)
                end[op.kind, op.chunk * s + i, op.micro_batch] = start + d
                if pos[i] == 0:
                    first[i] = start
                free[i] = start + d
                busy[i] += d
                if record:
                    ops[i].append((op.kind, op.micro_batch, start, start + d))
                    op_chunks[i].append(op.chunk)
                pos[i] += 1
                remaining -= 1
                progressed = True
        if not progressed:
            raise RuntimeError(f"schedule {schedule!r} deadlocked: its op orders wait on each other")
    return SimResult(makespan=max(free), busy=busy, first_start=first, last_backward_end=list(free), ops=ops,
                     op_chunks=op_chunks)
