"""Dispatch: one step's sequences to the pipelines of one plan, then packing on each pipeline.

Pipelines may differ (an asymmetric plan: one high-TP pipeline for long sequences next to
low-TP replicas): each has its own per-sequence cost ``w_j(s) = a·s² + b·s + d`` on its bottleneck
stage, its token cap (no sequence longer than the cap may go there) and, for GPipe, a cap on its
tokens per step (:mod:`planner.varlen.seq_cost`). The pipelines run in parallel, so the step
takes as long as the slowest one.

**Pipeline time for dispatch** (the packing decides micro-batches later): with work
``W_j = Σ w_j(s_i)``, ``M_j`` micro-batches and the fill/drain factor
``φ_j = Σ_stages b / b_bottleneck − 1`` (``S − 1`` for equal stages)::

    T_j ≈ W_j·(1 + φ_j / M_j) + c_j·(M_j + φ_j)

with ``M_j`` the packing's choice near ``sqrt(φ_j·W_j / c_j)`` (:mod:`planner.varlen.packing`).

**1. Randomised greedy** (Hydraulis' remedy for ILPs too slow per step): sequences longest first,
each to the pipeline whose ``T_j`` grows least; ``RESTARTS`` more runs with the order perturbed
(seeded, so deterministic), keeping the best.

**2. ILP refinement**, warm-started from the greedy and time-capped. Sequences of equal length
are interchangeable, so the variables count them per length class ``l`` (``n_l`` sequences of
``s_l`` tokens); ``M_j`` is fixed at the greedy's value, which makes ``T_j`` linear::

    variables  y_lj ∈ Z, 0..n_l     sequences of class l sent to pipeline j (0 if s_l > cap_j)
               z ≥ 0                the slowest pipeline's time
    minimise   z
    subject to Σ_j y_lj = n_l                              every sequence dispatched once
               Σ_l (1 + φ_j/M_j)·w_j(s_l)·y_lj + K_j <= z  K_j = c_j·(M_j + φ_j) for a used pipeline
               Σ_l s_l·y_lj <= share_cap_j                 (GPipe pipelines: every micro-batch in flight)

Then every pipeline's share is packed (:func:`planner.varlen.packing.pack`) and the dispatch is
scored by the packed schedule times.
"""

from __future__ import annotations

import math
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from planner.errors import SpecError
from planner.milp import Milp, solve
from planner.varlen.packing import pack
from planner.varlen.seq_cost import PipelineCost

RESTARTS = 8
ILP_MAX_VARS = 4000


@dataclass(frozen=True)
class Dispatch:
    """One plan's share of a step: per pipeline, its micro-batches of sequence indices."""

    pipelines: tuple[tuple[tuple[int, ...], ...], ...]
    pipeline_s: tuple[float, ...]  # packed schedule time of every pipeline
    solve_s: float  # wall time of dispatch + packing
    refined: bool  # the ILP improved on the greedy

    @property
    def time_s(self) -> float:
        return max(self.pipeline_s, default=0.0)


@dataclass(frozen=True)
class _Pipe:
    cost: PipelineCost
    a: float
    b: float
    c: float
    phi: float
    d: float = 0.0  # per document (SeqCost.d)

    @classmethod
    def of(cls, cost: PipelineCost) -> _Pipe:
        k = cost.bottleneck()
        phi = sum(st.b for st in cost.stages) / k.b - 1 if k.b > 0 else len(cost.stages) - 1.0
        return cls(cost, k.a, k.b, k.c, phi, k.d)

    def w(self, s: float) -> float:
        return self.a * s * s + self.b * s + self.d

    def micro_batches(self, work: float, tokens: int, n: int) -> int:
        lo = max(1, math.ceil(tokens / self.cost.token_cap))
        if n == 0:
            return 0
        star = math.sqrt(self.phi * work / self.c) if self.c > 0 else float(n)
        return int(min(n, max(lo, round(star))))

    def time(self, work: float, tokens: int, n: int) -> float:
        if n == 0:
            return 0.0
        m = self.micro_batches(work, tokens, n)
        return work * (1 + self.phi / m) + self.c * (m + self.phi)


def _greedy(order: Sequence[int], lengths: Sequence[int], pipes: Sequence[_Pipe]) -> list[list[int]] | None:
    share: list[list[int]] = [[] for _ in pipes]
    work = [0.0] * len(pipes)
    tokens = [0] * len(pipes)
    for i in order:
        s = lengths[i]
        best, best_t = -1, math.inf
        for j, p in enumerate(pipes):
            if s > p.cost.token_cap or tokens[j] + s > p.cost.share_cap:
                continue
            t = p.time(work[j] + p.w(s), tokens[j] + s, len(share[j]) + 1)
            if t < best_t - 1e-15:
                best, best_t = j, t
        if best < 0:
            return None
        share[best].append(i)
        work[best] += pipes[best].w(s)
        tokens[best] += s
    return share


def _score(share: Sequence[Sequence[int]], lengths: Sequence[int], pipes: Sequence[_Pipe]) -> float:
    return max(p.time(sum(p.w(lengths[i]) for i in sh), sum(lengths[i] for i in sh), len(sh))
               for p, sh in zip(pipes, share))


def _refine(share: list[list[int]], lengths: Sequence[int], pipes: Sequence[_Pipe],
            time_limit_s: float) -> list[list[int]] | None:
    """The ILP of the module docstring; the new shares, or None if nothing better was found."""
    classes = sorted(Counter(lengths).items())
    if len(classes) * len(pipes) > ILP_MAX_VARS:
        return None
    model = Milp()
    z = model.var(cost=1.0)
    ms = [p.micro_batches(sum(p.w(lengths[i]) for i in sh), sum(lengths[i] for i in sh), len(sh))
          for p, sh in zip(pipes, share)]
    y: dict[tuple[int, int], int] = {}
    for li, (s, n) in enumerate(classes):
        for j, p in enumerate(pipes):
            if s <= p.cost.token_cap and ms[j] > 0:
                y[li, j] = model.var(lb=0, ub=n, integer=True)
        if not any((li, j) in y for j in range(len(pipes))):
            return None
        model.row([(y[li, j], 1.0) for j in range(len(pipes)) if (li, j) in y], n, n)
    for j, p in enumerate(pipes):
        if ms[j] == 0:
            continue
        slope = 1 + p.phi / ms[j]
        terms = [(y[li, j], slope * p.w(s)) for li, (s, _) in enumerate(classes) if (li, j) in y]
        model.row(terms + [(z, -1.0)], hi=-p.c * (ms[j] + p.phi))
        if math.isfinite(p.cost.share_cap):
            model.row([(y[li, j], float(s)) for li, (s, _) in enumerate(classes) if (li, j) in y],
                      hi=float(p.cost.share_cap))
    start = [0.0] * len(model.cost)
    cls_index = {s: li for li, (s, _) in enumerate(classes)}
    for j, sh in enumerate(share):
        for i in sh:
            start[y[cls_index[lengths[i]], j]] += 1
    start[z] = _score(share, lengths, pipes)
    res = solve(model, time_limit_s=time_limit_s, start=start)
    if res.x is None or res.objective >= start[z] * (1 - 1e-6):
        return None
    pools = {s: [i for i in sorted(range(len(lengths)), key=lambda i: i) if lengths[i] == s] for s, _ in classes}
    out: list[list[int]] = [[] for _ in pipes]
    for (li, j), v in sorted(y.items()):
        count = int(round(res.x[v]))
        s = classes[li][0]
        out[j].extend(pools[s][:count])
        pools[s] = pools[s][count:]
    if any(pools.values()):
        return None
    return out


def dispatch(lengths: Sequence[int], costs: Sequence[PipelineCost], *, time_limit_s: float = 0.2, seed: int = 0,
             refine: bool = True, restarts: int = RESTARTS) -> Dispatch:
    """Sequences (their lengths) to pipelines and micro-batches (see the module docstring)."""
    t0 = time.perf_counter()
    pipes = [_Pipe.of(c) for c in costs]
    if not lengths:
        return Dispatch(tuple(() for _ in pipes), tuple(0.0 for _ in pipes), 0.0, False)
    longest = max(lengths)
    if longest > max(p.cost.token_cap for p in pipes):
        raise SpecError("lengths", f"a sequence of {longest} tokens fits no pipeline (token caps "
                        f"{[p.cost.token_cap for p in pipes]})", "use a plan with more memory per token")
    base = sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))
    rng = np.random.Generator(np.random.PCG64(seed))
    best: tuple[float, list[list[int]]] | None = None
    for r in range(restarts + 1):
        order = base if r == 0 else sorted(base, key=lambda i: -lengths[i] * (1 + 0.3 * rng.random()))
        share = _greedy(order, lengths, pipes)
        if share is not None:
            score = _score(share, lengths, pipes)
            if best is None or score < best[0] - 1e-15:
                best = (score, share)
    if best is None:
        raise SpecError("lengths", "the step's sequences exceed the GPipe pipelines' memory",
                        "use 1F1B or smaller steps")
    candidates = [best[1]]
    if refine and len(pipes) > 1:
        left = time_limit_s - (time.perf_counter() - t0)
        better = _refine(best[1], lengths, pipes, max(left * 0.6, 1e-3))
        if better is not None:
            candidates.append(better)
    chosen: tuple[float, int, list[tuple[tuple[int, ...], ...]], list[float]] | None = None
    for c, share in enumerate(candidates):  # scored by the packed schedules: the ILP's model is a proxy
        left = max(1e-3, (time_limit_s - (time.perf_counter() - t0)) / len(candidates))
        out, times = [], []
        for p, sh in zip(pipes, share):
            pk = pack([lengths[i] for i in sh], p.cost, time_limit_s=left / len(pipes), refine=refine)
            out.append(tuple(tuple(sh[k] for k in mb) for mb in pk.micro_batches))
            times.append(pk.time_s)
        if chosen is None or max(times) < chosen[0] * (1 - 1e-9):
            chosen = (max(times), c, out, times)
    assert chosen is not None
    return Dispatch(tuple(chosen[2]), tuple(chosen[3]), time.perf_counter() - t0, chosen[1] == 1)
