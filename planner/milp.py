"""A small MILP, solved by HiGHS through ``highspy`` (no modelling layer in between).

Two kinds of callers: the batch split of the planner's search (:mod:`planner.search.batch_split`,
solved to optimality, no cap) and the per-step dispatch and packing ILPs of mixed-length training
(:mod:`planner.varlen`). The latter are solved once per training step, one step ahead, so each
solve must stop in time: HiGHS gets ``time_limit`` (wall clock) *and* ``mip_max_nodes`` (work); the
greedy solution is passed in with ``setSolution`` so the search starts from it and whatever is
returned is never worse than the greedy. Where the wall-clock cap stops the search the answer
depends on the machine's speed, so training computes each step's layout on one rank and
broadcasts it (:mod:`executor.data.step_prefetch`).

Model: minimise ``cᵀx`` subject to ``lo_r <= A_r·x <= hi_r``, ``lb <= x <= ub``, ``x_i``
integer where ``integer[i]``. Rows are lists of ``(column, coefficient)``.

Only calls that ``highspy`` has had since 1.7 are used (``setup.cfg`` states the tested range).
"""

from __future__ import annotations

import math
import os
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

INF = math.inf


@dataclass
class Milp:
    cost: list[float] = field(default_factory=list)
    lb: list[float] = field(default_factory=list)
    ub: list[float] = field(default_factory=list)
    integer: list[bool] = field(default_factory=list)
    rows: list[tuple[float, float, list[tuple[int, float]]]] = field(default_factory=list)

    def var(self, cost: float = 0.0, lb: float = 0.0, ub: float = INF, integer: bool = False) -> int:
        self.cost.append(cost)
        self.lb.append(lb)
        self.ub.append(ub)
        self.integer.append(integer)
        return len(self.cost) - 1

    def binary(self, cost: float = 0.0) -> int:
        return self.var(cost, 0.0, 1.0, True)

    def row(self, terms: Sequence[tuple[int, float]], lo: float = -INF, hi: float = INF) -> None:
        self.rows.append((lo, hi, list(terms)))


@dataclass(frozen=True)
class MilpResult:
    x: list[float] | None  # None: no solution found (infeasible, or the caps hit before any)
    objective: float
    optimal: bool  # HiGHS proved it optimal (within its default MIP gap)
    seconds: float


def solve(model: Milp, *, time_limit_s: float | None, max_nodes: int | None = 10_000,
          start: Sequence[float] | None = None) -> MilpResult:
    """Solve ``model`` (see the module docstring); ``None`` caps mean none; ``start`` is a feasible
    warm start."""
    import highspy

    _silence_highs_banner()
    t0 = time.perf_counter()
    h = highspy.Highs()
    h.setOptionValue("output_flag", False)
    h.setOptionValue("threads", 1)
    if time_limit_s is not None:
        h.setOptionValue("time_limit", float(max(time_limit_s, 1e-3)))
    if max_nodes is not None:
        h.setOptionValue("mip_max_nodes", int(max_nodes))
    n = len(model.cost)
    inf = highspy.kHighsInf
    clip = lambda v: inf if v == INF else (-inf if v == -INF else v)  # noqa: E731
    h.addVars(n, np.array([clip(v) for v in model.lb]), np.array([clip(v) for v in model.ub]))
    h.changeColsCost(n, np.arange(n, dtype=np.int32), np.array(model.cost, dtype=float))
    ints = np.array([i for i in range(n) if model.integer[i]], dtype=np.int32)
    if len(ints):
        h.changeColsIntegrality(len(ints), ints, np.array([highspy.HighsVarType.kInteger] * len(ints)))
    for lo, hi, terms in model.rows:
        idx = np.array([c for c, _ in terms], dtype=np.int32)
        val = np.array([v for _, v in terms], dtype=float)
        h.addRow(clip(lo), clip(hi), len(idx), idx, val)
    if start is not None:
        sol = highspy.HighsSolution()
        sol.col_value = list(map(float, start))
        h.setSolution(sol)
    h.run()
    status = h.getModelStatus()
    info = h.getInfo()
    secs = time.perf_counter() - t0
    if info.primal_solution_status < 2:  # no feasible solution
        return MilpResult(None, INF, False, secs)
    x = list(h.getSolution().col_value)
    return MilpResult(x, float(info.objective_function_value), status == highspy.HighsModelStatus.kOptimal, secs)


_HIGHS_READY = False


def _silence_highs_banner() -> None:
    """HiGHS prints a banner on stdout the first time a solver object is built in a process (even
    with output off); build that first one with the stdout file descriptor pointed at /dev/null."""
    global _HIGHS_READY
    if _HIGHS_READY:
        return
    _HIGHS_READY = True
    import highspy

    sys.stdout.flush()
    saved = os.dup(1)
    try:
        with open(os.devnull, "w") as null:
            os.dup2(null.fileno(), 1)
            highspy.Highs()
    finally:
        os.dup2(saved, 1)
        os.close(saved)
