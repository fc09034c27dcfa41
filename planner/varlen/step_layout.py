"""One training step over several strategies: which sequences run under which plan, then dispatch.

A step's sequences are split into *phases*; each phase runs one strategy (a plan over the same
devices) on its share, the phases run one after the other and their gradients accumulate, then one
optimizer step follows (:mod:`executor.switch.hot_switch`). Step time::

    T = Σ_phases (T_dispatch(phase) + switch_s(strategy))

``switch_s`` is the time to bring a strategy's working weights in and its gradients out (0 for
the home strategy, whose layout holds the master weights).

Assigning sequences to strategies:

* ``"threshold"`` — HotSPa's hand rule: strategies ordered by their bucket bound (``bucket``, by
  default the longest sequence they hold); a sequence goes to the first whose bound it does not
  exceed (length buckets such as ≤4K / ≤8K / ≤16K).
* ``"cost"`` — each sequence to the strategy where it is cheapest: the effective per-sequence time
  ``1 / Σ_j 1/w_j(s)`` over the strategy's pipelines that can hold it (pipelines run in parallel),
  or every sequence to one strategy if one alone is estimated faster (so the estimate is never
  worse than the best static strategy's); then, while it lowers the estimated step time, one
  phase at a time is dissolved into the sequences' next-cheapest strategies (a phase whose work is
  small does not pay for its switch).
  Estimates during this search use the greedy dispatch; the final phases get the ILP refinement,
  whose time cap is at most ``BUDGET_FRACTION`` of the estimated step (the layout is computed one
  step ahead, so this bounds the work, not a wait).
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import dataclass

from planner.errors import SpecError
from planner.varlen.dispatch import Dispatch, dispatch
from planner.varlen.seq_cost import PipelineCost

ASSIGN_MODES = ("cost", "threshold")
BUDGET_FRACTION = 0.03  # of the estimated step time, for the ILPs (the bound is 5 % in all)


@dataclass(frozen=True)
class StrategyCost:
    """What step planning needs to know of one strategy."""

    name: str
    pipelines: tuple[PipelineCost, ...]
    switch_s: float = 0.0
    bucket: int | None = None  # the hand rule's bound for this strategy (default: its longest sequence)

    @property
    def max_len(self) -> int:
        return max(p.token_cap for p in self.pipelines)

    @property
    def threshold(self) -> int:
        return min(self.bucket, self.max_len) if self.bucket is not None else self.max_len

    def effective_s(self, s: int) -> float:
        """Per-sequence time with every pipeline that holds ``s`` working in parallel."""
        rate = sum(1.0 / max(p.bottleneck().sequence_s(s), 1e-30) for p in self.pipelines if s <= p.token_cap)
        return 1.0 / rate if rate > 0 else math.inf


@dataclass(frozen=True)
class Phase:
    strategy: int
    sequences: tuple[int, ...]  # step-level sequence indices
    # per pipeline, micro-batches of step-level sequence indices
    pipelines: tuple[tuple[tuple[int, ...], ...], ...]
    time_s: float
    switch_s: float


@dataclass(frozen=True)
class StepLayout:
    phases: tuple[Phase, ...]
    solve_s: float

    @property
    def time_s(self) -> float:
        return sum(p.time_s + p.switch_s for p in self.phases)

    @property
    def switch_s(self) -> float:
        return sum(p.switch_s for p in self.phases)


def _threshold(lengths: Sequence[int], strategies: Sequence[StrategyCost]) -> list[int]:
    order = sorted(range(len(strategies)), key=lambda k: strategies[k].threshold)
    out = []
    for s in lengths:
        k = next((k for k in order if s <= strategies[k].threshold), None)
        if k is None:
            raise SpecError("lengths", f"a sequence of {s} tokens fits no strategy", "add a long-sequence strategy")
        out.append(k)
    return out


def _phase_time(lengths: Sequence[int], members: Sequence[int], st: StrategyCost) -> Dispatch:
    """A quick estimate: one greedy dispatch, greedy packing."""
    return dispatch([lengths[i] for i in members], st.pipelines, refine=False, restarts=0)


def _estimate(lengths: Sequence[int], assign: Sequence[int], strategies: Sequence[StrategyCost]) -> float:
    total = 0.0
    for k, st in enumerate(strategies):
        members = [i for i, a in enumerate(assign) if a == k]
        if members:
            total += _phase_time(lengths, members, st).time_s + st.switch_s
    return total


def _by_cost(lengths: Sequence[int], strategies: Sequence[StrategyCost]) -> list[int]:
    ranked = []
    for s in lengths:
        costs = sorted((strategies[k].effective_s(s), k) for k in range(len(strategies)))
        ranked.append([k for c, k in costs if math.isfinite(c)])
        if not ranked[-1]:
            raise SpecError("lengths", f"a sequence of {s} tokens fits no strategy", "add a long-sequence strategy")
    assign = [r[0] for r in ranked]
    best = _estimate(lengths, assign, strategies)
    for k in range(len(strategies)):  # start from the best single strategy when that is better
        if all(k in r for r in ranked):
            t = _estimate(lengths, [k] * len(lengths), strategies)
            if t < best:
                assign, best = [k] * len(lengths), t
    improved = True
    while improved:
        improved = False
        for k in sorted(set(assign)):
            trial = []
            for i, a in enumerate(assign):
                if a != k:
                    trial.append(a)
                    continue
                nxt = next((x for x in ranked[i] if x != k and x in assign), None)
                if nxt is None:
                    break
                trial.append(nxt)
            else:
                t = _estimate(lengths, trial, strategies)
                if t < best * (1 - 1e-9):
                    assign, best, improved = trial, t, True
                    break
    return assign


def plan_step(lengths: Sequence[int], strategies: Sequence[StrategyCost], *, assign: str = "cost",
              time_limit_s: float = 0.5, budget_fraction: float = BUDGET_FRACTION, refine: bool = True,
              seed: int = 0) -> StepLayout:
    """The phases of one step (see the module docstring), strategies in pool order. The ILPs get
    at most ``time_limit_s`` and at most ``budget_fraction`` of the step's estimated time."""
    if assign not in ASSIGN_MODES:
        raise SpecError("assign", f"{assign!r} is not one of {list(ASSIGN_MODES)}", "use cost or threshold")
    t0 = time.perf_counter()
    to = _threshold(lengths, strategies) if assign == "threshold" else _by_cost(lengths, strategies)
    if refine:
        time_limit_s = min(time_limit_s, budget_fraction * _estimate(lengths, to, strategies))
    used = sorted(set(to))
    phases = []
    for k in used:
        members = [i for i, a in enumerate(to) if a == k]
        left = max(1e-3, (time_limit_s - (time.perf_counter() - t0)) / max(1, len(used)))
        d = dispatch([lengths[i] for i in members], strategies[k].pipelines, time_limit_s=left, refine=refine,
                     seed=seed)
        pipes = tuple(tuple(tuple(members[i] for i in mb) for mb in pipe) for pipe in d.pipelines)
        phases.append(Phase(k, tuple(members), pipes, d.time_s, strategies[k].switch_s))
    return StepLayout(tuple(phases), time.perf_counter() - t0)
