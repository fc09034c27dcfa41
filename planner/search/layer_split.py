"""Layer split of one pipeline: layers to stages, exact (greedy under a bisected bound).

**Stage cost model used here.** Llama layers are identical, so a contiguous layer range is fixed
by its *length*: stage ``s`` of a pipeline with ``n_s`` layers costs, per micro-batch (forward +
backward, its p2p sends included) ``t_s(n) = a_s·n + e_s`` seconds and needs
``w_s·n + f_s <= cap_s`` bytes per device (``e_s``/``f_s`` hold the embedding on the first stage and
the final norm + LM head on the last one). The numbers come from the cost model (:mod:`.oracle`).

**The split** — :func:`split_layers`. For one pipeline with ``m`` micro-batches the
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
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

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
