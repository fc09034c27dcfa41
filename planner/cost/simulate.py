"""A small discrete-event simulator of one pipeline's schedule (1F1B or GPipe).

Model: stage ``i`` runs its ops one at a time in the schedule's fixed order; an op starts when
the stage is free and its input is ready, and lasts its duration:

* ``F(i, j)`` (forward of micro-batch ``j``) lasts ``fwd[i]`` and needs ``F(i-1, j)`` done;
* ``B(i, j)`` (backward) lasts ``bwd[i]`` and needs ``B(i+1, j)`` done (the last stage: ``F(S-1, j)``).

Point-to-point sends are *blocking for the sender*: pass them folded into the durations
(``fold_p2p``): stage ``i``'s forward includes sending its activation to ``i+1``, its backward
includes sending the input gradient to ``i-1``. This matches :mod:`planner.cost.schedule`.

Orders per stage (``S`` stages, ``m`` micro-batches):

* GPipe: ``F1 .. Fm, Bm .. B1`` (the executor's order, executor/schedules.py).
* 1F1B (non-interleaved, PipeDream-flush): ``w = min(S-1-i, m)`` warm-up forwards, then
  ``m - w`` pairs ``F, B``, then ``w`` cool-down backwards.

Per-stage micro-batch durations may also vary per micro-batch (``fwd_mb[i][j]``), which the
planner's benchmarks use for uneven micro-batch sizes.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field


@dataclass
class SimResult:
    makespan: float
    busy: list[float]  # per stage: total op time
    first_start: list[float]  # per stage: start of its first op
    last_backward_end: list[float]  # per stage: end of its last op (a backward)
    ops: list[list[tuple[str, int, float, float]]] = field(default_factory=list)  # (kind, mb, start, end)

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


def stage_order(schedule: str, stages: int, stage: int, m: int) -> list[tuple[str, int]]:
    """The op order of ``stage`` as (``'F'`` or ``'B'``, micro-batch index)."""
    if schedule == "gpipe":
        return [("F", j) for j in range(m)] + [("B", j) for j in reversed(range(m))]
    if schedule != "1f1b":
        raise ValueError(f"unknown schedule {schedule!r}")
    w = min(stages - 1 - stage, m)
    order = [("F", j) for j in range(w)]
    for j in range(m - w):
        order += [("F", w + j), ("B", j)]
    order += [("B", j) for j in range(m - w, m)]
    return order


def simulate(fwd: Sequence[float] | Sequence[Sequence[float]], bwd: Sequence[float] | Sequence[Sequence[float]],
             m: int, schedule: str = "1f1b", record: bool = False) -> SimResult:
    """Simulate one pipeline. ``fwd[i]`` / ``bwd[i]`` are stage ``i``'s per-micro-batch durations
    (a number, or a list of ``m`` numbers)."""
    s = len(fwd)
    if s == 0 or len(bwd) != s or m < 1:
        raise ValueError("need one forward and one backward duration per stage and m >= 1")

    def dur(table: Sequence[float] | Sequence[Sequence[float]], i: int, j: int) -> float:
        v = table[i]
        return float(v[j]) if isinstance(v, Sequence) else float(v)

    orders = [stage_order(schedule, s, i, m) for i in range(s)]
    pos = [0] * s
    free = [0.0] * s
    f_end = [[-1.0] * m for _ in range(s)]
    b_end = [[-1.0] * m for _ in range(s)]
    busy = [0.0] * s
    first = [0.0] * s
    ops: list[list[tuple[str, int, float, float]]] = [[] for _ in range(s)]
    remaining = sum(len(o) for o in orders)
    while remaining:
        progressed = False
        for i in range(s):
            while pos[i] < len(orders[i]):
                kind, j = orders[i][pos[i]]
                if kind == "F":
                    ready = 0.0 if i == 0 else f_end[i - 1][j]
                    d = dur(fwd, i, j)
                else:
                    ready = f_end[i][j] if i == s - 1 else b_end[i + 1][j]
                    d = dur(bwd, i, j)
                if ready < 0:
                    break
                start = max(free[i], ready)
                end = start + d
                (f_end if kind == "F" else b_end)[i][j] = end
                if pos[i] == 0:
                    first[i] = start
                free[i] = end
                busy[i] += d
                if record:
                    ops[i].append((kind, j, start, end))
                pos[i] += 1
                remaining -= 1
                progressed = True
        if not progressed:
            raise RuntimeError("schedule deadlocked")  # cannot happen for the orders above
    return SimResult(makespan=max(free), busy=busy, first_start=first, last_backward_end=list(free), ops=ops)
