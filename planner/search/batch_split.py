"""Batch split: samples and micro-batch counts to pipelines (ILP, HiGHS; greedy waterfill).

**The ILP** — :func:`ilp_split`. Pipelines come in *types* (identical pipelines share one),
type ``j`` with ``c_j`` pipelines, slowest stage ``M_j``, one-micro-batch sum ``Σ_j`` (both
from the layer split), fixed per-step time ``F_j`` and at most ``mmax_j`` micro-batches (memory,
GPipe). With ``μ`` the micro-batch size, ``B`` the global batch:

    variables  q_j ∈ Z≥0   samples of each of the type's pipelines
               r_j ∈ Z, 0..c_j   how many of them take one sample more (q_j + 1)
               m_j ∈ Z≥0   micro-batches per pipeline of the type
               z_j ∈ {0,1} 1 if r_j > 0;  a_j ∈ {0,1} 1 if the type is used;  T ≥ 0 the step time
    minimise   T + ε·Σ_j m_j
    subject to Σ_j (c_j·q_j + r_j) = B                       every sample is trained once
               r_j <= c_j·z_j                                 extra samples only where allowed
               q_j + z_j <= μ·m_j                             micro-batches of at most μ samples
               a_j <= m_j <= mmax_j·a_j;  q_j + r_j <= B·a_j  unused types take nothing
               T >= M_j·m_j + (Σ_j - M_j + F_j)·a_j            min-max, linear: T >= every used type's time

The product "micro-batches × slowest stage" is linear because the layer split (and so ``M_j``)
is fixed inside the ILP; :func:`planner.search.candidate.evaluate` alternates the layer split
(:mod:`.layer_split`, for the micro-batch counts the ILP chose) and the ILP until the counts stop
changing. Pipelines of a type that end up with 0 samples are dropped from the plan. HiGHS solves
it (:func:`ilp_split`, through :mod:`planner.milp`); where it reports no optimum a greedy
allocation by bisection on ``T`` (:func:`waterfill`, also the search's inner loop) is used instead.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from planner.milp import Milp, solve


@dataclass(frozen=True)
class PipeType:
    """Identical pipelines for the batch ILP (module docstring)."""

    count: int
    bottleneck_s: float
    sum_s: float
    fixed_s: float = 0.0
    max_micro_batches: int = 1 << 20

    def time(self, micro_batches: int) -> float:
        return (micro_batches - 1) * self.bottleneck_s + self.sum_s + self.fixed_s


@dataclass(frozen=True)
class BatchSplit:
    """Per type: ``base`` samples for each pipeline, ``extra`` pipelines with one more, micro-batches."""

    base: tuple[int, ...]
    extra: tuple[int, ...]
    micro_batches: tuple[int, ...]
    time_s: float

    def per_pipeline(self, counts: Sequence[int]) -> list[list[int]]:
        """Samples for each pipeline of each type (0 = pipeline dropped)."""
        return [[q + 1] * r + [q] * (c - r) for q, r, c in zip(self.base, self.extra, counts)]


def allocate_batch(types: Sequence[PipeType], global_batch: int, micro_batch_size: int,
                   *, use_ilp: bool = True) -> BatchSplit | None:
    """Samples and micro-batch counts per pipeline type minimising the slowest pipeline's time.

    ``use_ilp=False`` uses :func:`waterfill` (the search's inner loop); the ILP is the final word."""
    if use_ilp:
        split = ilp_split(types, global_batch, micro_batch_size)
        if split is not None:
            return split
    return waterfill(types, global_batch, micro_batch_size)


def waterfill(types: Sequence[PipeType], B: int, mu: int) -> BatchSplit | None:
    """The ILP's min-max by bisection on the step time ``T``.

    At time ``T`` a pipeline of type ``j`` can run ``m_j(T) = min(mmax_j, ⌊(T - Σ_j - F_j)/M_j⌋ + 1)``
    micro-batches, i.e. ``μ·m_j(T)`` samples; the smallest ``T`` whose capacity
    ``Σ_j c_j·μ·m_j(T)`` reaches ``B`` is the ILP optimum up to how the last type's samples are
    rounded (equal per type, one more for ``r_j`` of them). Samples above ``B`` are taken back from
    the slowest types first. ``O(types · log)``; used in the search's inner loop."""
    if not types:
        return None

    def m_at(t: PipeType, T: float) -> int:
        start = t.sum_s + t.fixed_s
        if T < start - 1e-15:
            return 0
        if t.bottleneck_s <= 0:
            return min(t.max_micro_batches, B)
        return min(t.max_micro_batches, B, int(math.floor((T - start) / t.bottleneck_s + 1e-9)) + 1)

    def capacity(T: float) -> int:
        return sum(t.count * mu * m_at(t, T) for t in types)

    hi = min(t.time(min(t.max_micro_batches, max(1, math.ceil(B / (t.count * mu))))) for t in types)
    if capacity(hi) < B:
        hi = max(t.time(min(t.max_micro_batches, B)) for t in types)
        if capacity(hi) < B:
            return None
    lo = min(t.sum_s + t.fixed_s for t in types) * (1 - 1e-12)
    for _ in range(100):
        mid = (lo + hi) / 2
        if capacity(mid) >= B:
            hi = mid
        else:
            lo = mid
        if hi - lo <= 1e-9 * hi:
            break
    ms = [m_at(t, hi) for t in types]
    totals = [t.count * mu * m for t, m in zip(types, ms)]
    over = sum(totals) - B
    for j in sorted(range(len(types)), key=lambda j: -types[j].time(max(1, ms[j]))):
        cut = min(over, totals[j])
        totals[j] -= cut
        over -= cut
    base, extra, mbs = [], [], []
    for t, total in zip(types, totals):
        q, r = divmod(total, t.count)
        base.append(q)
        extra.append(r)
        mbs.append(math.ceil((q + (1 if r else 0)) / mu) if total else 0)
    return BatchSplit(tuple(base), tuple(extra), tuple(mbs), _step_time(types, base, extra, mbs))


def _step_time(types: Sequence[PipeType], base: Sequence[int], extra: Sequence[int], mbs: Sequence[int]) -> float:
    return max((t.time(m) for t, q, r, m in zip(types, base, extra, mbs) if q + r > 0), default=math.inf)


def ilp_split(types: Sequence[PipeType], B: int, mu: int) -> BatchSplit | None:
    """The ILP of the module docstring, solved to optimality by HiGHS (no time or node cap, as the
    instance is small: five integers per pipeline type). ``None`` where HiGHS reports anything but
    an optimum (infeasible, or a limit hit) or the answer does not add up to ``B``."""
    model = Milp()
    T = model.var(cost=1.0)
    scale = max((t.bottleneck_s for t in types), default=1.0) * 1e-6  # ε: fewest micro-batches on ties
    q: list[int] = []  # column indices
    r: list[int] = []
    m: list[int] = []
    for t in types:
        mmax = min(t.max_micro_batches, B)
        qj, rj = model.var(0.0, 0, B, integer=True), model.var(0.0, 0, t.count, integer=True)
        mj, zj, aj = model.var(scale, 0, mmax, integer=True), model.binary(), model.binary()
        model.row([(rj, 1), (zj, -t.count)], hi=0)                    # r_j <= c_j·z_j
        model.row([(qj, 1), (zj, 1), (mj, -mu)], hi=0)                # q_j + z_j <= μ·m_j
        model.row([(mj, 1), (aj, -1)], lo=0)                          # a_j <= m_j
        model.row([(mj, 1), (aj, -mmax)], hi=0)                       # m_j <= mmax_j·a_j
        model.row([(qj, 1), (rj, 1), (aj, -B)], hi=0)                 # q_j + r_j <= B·a_j
        model.row([(T, 1), (mj, -t.bottleneck_s), (aj, -(t.sum_s - t.bottleneck_s + t.fixed_s))], lo=0)
        q.append(qj)
        r.append(rj)
        m.append(mj)
    model.row([(v, float(t.count)) for v, t in zip(q, types)] + [(v, 1.0) for v in r], lo=B, hi=B)
    res = solve(model, time_limit_s=None, max_nodes=None)
    if not res.optimal or res.x is None:
        return None
    x = res.x
    base_l = [int(round(x[v])) for v in q]
    extra_l = [int(round(x[v])) for v in r]
    for j, t in enumerate(types):
        if extra_l[j] == t.count:  # every pipeline of the type takes one more: same thing, said simply
            base_l[j], extra_l[j] = base_l[j] + 1, 0
    base, extra = tuple(base_l), tuple(extra_l)
    mbs = tuple(int(round(x[v])) for v in m)
    if sum(t.count * b + e for t, b, e in zip(types, base, extra)) != B:
        return None
    return BatchSplit(base, extra, mbs, _step_time(types, base, extra, mbs))
