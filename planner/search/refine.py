"""Refinement: layers to stages (exact DP/greedy) and samples to pipelines (ILP, HiGHS).

**Stage cost model used here.** Llama layers are identical, so a contiguous layer range is fixed
by its *length*: stage ``s`` of a pipeline with ``n_s`` layers costs, per micro-batch (forward +
backward, its p2p sends included) ``t_s(n) = a_s·n + e_s`` seconds and needs
``w_s·n + f_s <= cap_s`` bytes per device (``e_s``/``f_s`` hold the embedding on the first stage and
the final norm + LM head on the last one). The numbers come from the cost model (:mod:`.oracle`).

**1. Layer split (exact)** — :func:`split_layers`. For one pipeline with ``m`` micro-batches the
1F1B / GPipe time is ``T = (m - 1)·max_s t_s + Σ_s t_s`` (the slowest stage paces the steady
state, the warm-up and cool-down cross every stage once). Minimise ``T`` over integers
``1 <= n_s <= u_s`` (``u_s`` = most layers that fit stage ``s``'s memory) with ``Σ n_s = L``:

* Some stage attains the maximum, so the optimal ``θ* = max_s t_s`` is one of the ``Σ u_s``
  values ``a_s·n + e_s``.
* For a candidate ``θ``, stage ``s`` may take at most ``c_s(θ) = min(u_s, ⌊(θ - e_s)/a_s⌋)`` layers;
  the smallest ``Σ_s a_s·n_s`` under ``1 <= n_s <= c_s``, ``Σ n_s = L`` is greedy: every stage
  one layer, the rest to the stages with the smallest ``a_s`` first (a knapsack with unit
  weights and box bounds, where greedy is exact).
* Bracket the smallest feasible ``θ`` by a short bisection, then scan the candidates above the
  bracket's infeasible end in increasing order and stop once ``(m - 1)·θ + Σ_min >= best``
  (``Σ_min`` = the unconstrained smallest sum: no larger ``θ`` can win). At ``θ*`` the greedy
  solution is at least as good as the optimum, so the best scanned value is optimal. With
  ``m = 1`` only the sum counts: the unconstrained greedy is optimal at once.

**2. Batch split (ILP)** — :func:`allocate_batch`. Pipelines come in *types* (identical pipelines
share one), type ``j`` with ``c_j`` pipelines, slowest stage ``M_j``, one-micro-batch sum
``Σ_j`` (both from the layer split), fixed per-step time ``F_j`` and at most ``mmax_j``
micro-batches (memory, GPipe). With ``μ`` the micro-batch size, ``B`` the global batch:

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
is fixed inside the ILP; :func:`refine` alternates split (for the micro-batch counts the ILP
chose) and ILP until the counts stop changing. Pipelines of a type that end up with 0 samples
are dropped from the plan. HiGHS solves it through pulp; on any solver failure a greedy
allocation by bisection on ``T`` (:func:`waterfill`, also the search's inner loop) is used instead.
"""

from __future__ import annotations

import math
import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass

import pulp

EPS = 1e-12
BISECT_STEPS = 14  # brackets θ0 to 1/16384 of the first interval; exactness does not depend on it


@dataclass(frozen=True)
class StageCost:
    """Linear cost of one stage holding ``n`` layers (see the module docstring)."""

    per_layer_s: float
    fixed_s: float
    per_layer_bytes: float
    fixed_bytes: float
    capacity_bytes: float

    def max_layers(self) -> int:
        room = self.capacity_bytes - self.fixed_bytes
        if room < 0:
            return 0
        if self.per_layer_bytes <= 0:
            return 1 << 30
        return int(math.floor(room / self.per_layer_bytes + 1e-9))

    def time(self, n: int) -> float:
        return self.per_layer_s * n + self.fixed_s


@dataclass(frozen=True)
class LayerSplit:
    counts: tuple[int, ...]
    bottleneck_s: float  # max_s t_s
    sum_s: float  # Σ_s t_s

    def pipeline_time(self, micro_batches: int) -> float:
        return (micro_batches - 1) * self.bottleneck_s + self.sum_s


def _greedy_fill(order: Sequence[int], caps: Sequence[int], num_layers: int) -> list[int] | None:
    counts = [1] * len(caps)
    rest = num_layers - len(caps)
    for s in order:
        if rest <= 0:
            break
        take = min(rest, caps[s] - 1)
        counts[s] += take
        rest -= take
    return counts if rest == 0 else None


def split_layers(stages: Sequence[StageCost], num_layers: int, micro_batches: int) -> LayerSplit | None:
    """The exact minimiser of ``(m-1)·max t_s + Σ t_s`` (module docstring, part 1); None if no split fits."""
    S = len(stages)
    if S == 0 or S > num_layers:
        return None
    upper = [min(st.max_layers(), num_layers - S + 1) for st in stages]
    if min(upper) < 1 or sum(upper) < num_layers:
        return None
    order = sorted(range(S), key=lambda s: (stages[s].per_layer_s, s))

    def caps_for(theta: float) -> list[int]:
        out = []
        for st, u in zip(stages, upper):
            if st.per_layer_s <= 0:
                out.append(u if st.fixed_s <= theta + EPS else 0)
            else:
                out.append(min(u, int(math.floor((theta - st.fixed_s) / st.per_layer_s + 1e-9))))
        return out

    def feasible(theta: float) -> bool:
        caps = caps_for(theta)
        return min(caps) >= 1 and sum(caps) >= num_layers

    def split_at(theta: float) -> LayerSplit | None:
        counts = _greedy_fill(order, caps_for(theta), num_layers)
        if counts is None:
            return None
        times = [st.time(n) for st, n in zip(stages, counts)]
        return LayerSplit(tuple(counts), max(times), sum(times))

    unconstrained = _greedy_fill(order, upper, num_layers)
    assert unconstrained is not None
    times0 = [st.time(n) for st, n in zip(stages, unconstrained)]
    sum_min = sum(times0)
    weight = max(0, micro_batches - 1)
    if weight == 0:  # one micro-batch: only the sum counts, and the unconstrained greedy minimises it
        return LayerSplit(tuple(unconstrained), max(times0), sum_min)
    # bracket the smallest feasible bottleneck θ0 by a short bisection (feasibility is monotone in θ);
    # the scan below starts at the infeasible end ``lo``, so θ0 itself is always among the scanned
    lo, hi = max(st.time(1) for st in stages) * (1 - 1e-12), max(times0)
    for _ in range(BISECT_STEPS):
        mid = (lo + hi) / 2
        if feasible(mid):
            hi = mid
        else:
            lo = mid
    best = split_at(hi)
    assert best is not None
    best_obj = best.pipeline_time(micro_batches)
    theta_hi = (best_obj - sum_min) / weight  # beyond it (m-1)·θ + Σ_min cannot beat the best
    cands: set[float] = set()
    for st, u in zip(stages, upper):
        if st.per_layer_s <= 0:
            continue
        n_lo = max(1, int(math.floor((lo - st.fixed_s) / st.per_layer_s)))
        n_hi = min(u, int(math.floor((theta_hi - st.fixed_s) / st.per_layer_s + 1e-9)))
        cands.update(t for t in (st.time(n) for n in range(n_lo, n_hi + 1)) if t > lo)
    for theta in sorted(cands):
        if weight * theta + sum_min >= best_obj - EPS:
            break
        split = split_at(theta)
        if split is None:
            continue
        obj = split.pipeline_time(micro_batches)
        if obj < best_obj - EPS:
            best, best_obj = split, obj
    return best


@dataclass(frozen=True)
class PipeType:
    """Identical pipelines for the batch ILP (module docstring, part 2)."""

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
        split = _allocate_ilp(types, global_batch, micro_batch_size)
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


_HIGHS_READY = False


def _silence_highs_banner() -> None:
    """HiGHS prints a banner on stdout the first time a solver object is built in a process (even
    with output off); build that first one with the stdout file descriptor pointed at /dev/null."""
    global _HIGHS_READY
    if _HIGHS_READY:
        return
    _HIGHS_READY = True
    try:
        import highspy
    except ImportError:
        return
    sys.stdout.flush()
    saved = os.dup(1)
    try:
        with open(os.devnull, "w") as null:
            os.dup2(null.fileno(), 1)
            highspy.Highs()
    finally:
        os.dup2(saved, 1)
        os.close(saved)


def _allocate_ilp(types: Sequence[PipeType], B: int, mu: int) -> BatchSplit | None:
    _silence_highs_banner()
    prob = pulp.LpProblem("batch_split", pulp.LpMinimize)
    T = prob.add_variable("T", lowBound=0)
    q, r, m, z, a = [], [], [], [], []
    for j, t in enumerate(types):
        mmax = min(t.max_micro_batches, B)
        q.append(prob.add_variable(f"q{j}", 0, B, cat="Integer"))
        r.append(prob.add_variable(f"r{j}", 0, t.count, cat="Integer"))
        m.append(prob.add_variable(f"m{j}", 0, mmax, cat="Integer"))
        z.append(prob.add_variable(f"z{j}", 0, 1, cat="Integer"))
        a.append(prob.add_variable(f"a{j}", 0, 1, cat="Integer"))
        prob += r[j] <= t.count * z[j]
        prob += q[j] + z[j] <= mu * m[j]
        prob += m[j] >= a[j]
        prob += m[j] <= mmax * a[j]
        prob += q[j] + r[j] <= B * a[j]
        prob += T >= t.bottleneck_s * m[j] + (t.sum_s - t.bottleneck_s + t.fixed_s) * a[j]
    prob += pulp.lpSum(t.count * q[j] + r[j] for j, t in enumerate(types)) == B
    scale = max((t.bottleneck_s for t in types), default=1.0) * 1e-6
    prob += T + scale * pulp.lpSum(m)
    try:
        prob.solve(pulp.HiGHS(msg=False, threads=1))
    except pulp.PulpSolverError:
        return None
    if pulp.LpStatus[prob.status] != "Optimal":
        return None
    base_l = [int(round(v.value() or 0)) for v in q]
    extra_l = [int(round(v.value() or 0)) for v in r]
    for j, t in enumerate(types):
        if extra_l[j] == t.count:  # every pipeline of the type takes one more: same thing, said simply
            base_l[j], extra_l[j] = base_l[j] + 1, 0
    base, extra = tuple(base_l), tuple(extra_l)
    mbs = tuple(int(round(v.value() or 0)) for v in m)
    if sum(t.count * b + e for t, b, e in zip(types, base, extra)) != B:
        return None
    return BatchSplit(base, extra, mbs, _step_time(types, base, extra, mbs))
