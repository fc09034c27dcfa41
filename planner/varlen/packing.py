"""Packing one pipeline's sequences into micro-batches under a token cap.

With the stage cost ``t_i(mb) = a_i·Σs² + b_i·Σs + c_i`` (:mod:`planner.varlen.seq_cost`), the
steady-state work ``Σ_j t_k(j)`` of the bottleneck stage ``k`` is the same for every packing
except for ``c_k`` per micro-batch, while the fill and drain of the pipeline cost about
``(S - 1)`` times the largest micro-batch. So packing is two decisions (as in Hydraulis):

1. **How many micro-batches** ``M``: with equal micro-batches the schedule time is about
   ``W + c·M + (S - 1)·(W/M + c)`` (``W`` the sequences' bottleneck work), smallest near
   ``M* = sqrt((S - 1)·W / c)``; at least ``⌈tokens / cap⌉``. A few values around ``M*`` are
   tried, each packed greedily and scored by :meth:`PipelineCost.time`.
2. **Which sequences share a micro-batch**, for the chosen ``M``: minimise the largest
   micro-batch's bottleneck cost under the token cap. Greedy: longest-processing-time first (each
   sequence, most costly first, to the cheapest micro-batch it fits). Then, unless the greedy is
   already within 1 % of the lower bound ``max(W/M, max_i w_i)``, the ILP below refines it,
   warm-started from the greedy, capped in time and nodes (:mod:`planner.milp`):

       variables  x_ij ∈ {0,1}   sequence i goes to micro-batch j;   z ≥ 0 the largest cost
       minimise   z
       subject to Σ_j x_ij = 1                 every sequence packed once
                  Σ_i s_i·x_ij <= cap          token cap (memory) of micro-batch j
                  Σ_i w_i·x_ij <= z            z bounds every micro-batch's work
                  x_ij = 0 for j > i           symmetry: sequences sorted by w, so the i-th may
                                               open at most micro-batch i (LPT's solution obeys it)

   ``w_i = a_k·s_i² + b_k·s_i`` on the bottleneck stage. Problems above ``ILP_MAX_CELLS``
   variables keep the greedy (many small sequences pack near the bound anyway).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from planner.errors import SpecError
from planner.milp import Milp, solve
from planner.varlen.seq_cost import PipelineCost

ILP_MAX_CELLS = 6000
GAP = 0.01


@dataclass(frozen=True)
class Packing:
    micro_batches: tuple[tuple[int, ...], ...]  # indices into the lengths, per micro-batch
    time_s: float  # PipelineCost.time of the packing
    refined: bool  # the ILP improved on the greedy


def _lpt(order: Sequence[int], lengths: Sequence[int], w: Sequence[float], m: int, cap: int) -> list[list[int]] | None:
    bins: list[list[int]] = [[] for _ in range(m)]
    load = [0.0] * m
    tokens = [0] * m
    for i in order:
        best = -1
        for j in range(m):
            if tokens[j] + lengths[i] <= cap and (best < 0 or load[j] < load[best]):
                best = j
        if best < 0:
            return None
        bins[best].append(i)
        load[best] += w[i]
        tokens[best] += lengths[i]
    return bins


def _refine(order: Sequence[int], lengths: Sequence[int], w: Sequence[float], bins: list[list[int]], cap: int,
            time_limit_s: float) -> list[list[int]] | None:
    """The ILP of the module docstring, warm-started from ``bins``; None if it found nothing better."""
    m = len(bins)
    model = Milp()
    z = model.var(cost=1.0)
    pos = {i: r for r, i in enumerate(order)}  # rank in cost order (symmetry rows)
    x: dict[tuple[int, int], int] = {}
    for i in order:
        for j in range(min(m, pos[i] + 1)):
            x[i, j] = model.binary()
    for i in order:
        model.row([(x[i, j], 1.0) for j in range(m) if (i, j) in x], 1.0, 1.0)
    for j in range(m):
        members = [i for i in order if (i, j) in x]
        model.row([(x[i, j], float(lengths[i])) for i in members], hi=float(cap))
        model.row([(x[i, j], w[i]) for i in members] + [(z, -1.0)], hi=0.0)
    start = [0.0] * len(model.cost)
    where = {i: j for j, b in enumerate(bins) for i in b}
    if any((i, where[i]) not in x for i in order):
        return None
    for i in order:
        start[x[i, where[i]]] = 1.0
    start[z] = max(sum(w[i] for i in b) for b in bins)
    res = solve(model, time_limit_s=time_limit_s, start=start)
    if res.x is None or res.objective >= start[z] * (1 - 1e-9):
        return None
    out: list[list[int]] = [[] for _ in range(m)]
    for (i, j), v in x.items():
        if res.x[v] > 0.5:
            out[j].append(i)
    return out


def pack(lengths: Sequence[int], cost: PipelineCost, *, time_limit_s: float = 0.05, refine: bool = True) -> Packing:
    """Micro-batches for ``lengths`` on a pipeline of cost ``cost`` (see the module docstring)."""
    if not lengths:
        return Packing((), 0.0, False)
    cap = cost.token_cap
    if max(lengths) > cap:
        raise SpecError("lengths", f"a sequence of {max(lengths)} tokens exceeds the pipeline's token cap {cap}",
                        "dispatch it to a pipeline with more memory per token (higher TP or PP)")
    k = cost.bottleneck()
    w = [k.sequence_s(s) for s in lengths]
    order = sorted(range(len(lengths)), key=lambda i: (-w[i], i))
    n, total, work = len(lengths), sum(lengths), sum(w)
    m_min = max(1, math.ceil(total / cap))
    s = len(cost.stages)
    m_star = math.sqrt((s - 1) * work / k.c) if k.c > 0 and s > 1 else (m_min if s == 1 else n)
    tries = sorted({min(n, max(m_min, round(m_star * f))) for f in (0.5, 0.71, 1.0, 1.41, 2.0)} | {m_min})
    best: tuple[float, list[list[int]]] | None = None
    for m in tries:
        bins = _lpt(order, lengths, w, m, cap)
        while bins is None and m < n:  # the cap needs more micro-batches than the token count says
            m += 1
            bins = _lpt(order, lengths, w, m, cap)
        if bins is None:
            continue
        t = cost.time([[lengths[i] for i in b] for b in bins])
        if best is None or t < best[0] - 1e-15:
            best = (t, bins)
    assert best is not None, "one sequence per micro-batch always fits"
    t, bins = best
    refined = False
    m = len(bins)
    bound = max(work / m, max(w))
    if refine and m > 1 and n * m <= ILP_MAX_CELLS and max(sum(w[i] for i in b) for b in bins) > bound * (1 + GAP):
        better = _refine(order, lengths, w, bins, cap, time_limit_s)
        if better is not None:
            t2 = cost.time([[lengths[i] for i in b] for b in better])
            if t2 < t:
                t, bins, refined = t2, better, True
    bins = [b for b in bins if b]
    bins.sort(key=lambda b: -sum(lengths[i] for i in b))
    return Packing(tuple(tuple(sorted(b)) for b in bins), t, refined)
