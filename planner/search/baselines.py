"""Baseline planners, scored by the same cost model (:func:`planner.cost.estimate`).

* :func:`seed_style` — the seed planner's method, re-implemented: for each of ``trials`` random
  draws, a *random* pipeline count ``k``, a METIS k-way split of the device graph (balanced
  compute and memory), a *random* stage count per pipeline (stages are consecutive devices of the
  pipeline, TP = devices per stage), layers split in proportion to each stage's *memory*, and the
  *same* batch for every pipeline (``B / k``, the remainder to the first ones) in micro-batches
  of one sample. Among the draws that fit in memory, the fastest by the cost model wins (the
  seed searched randomly and kept the best by its own model). Each draw takes the lightest
  recompute that fits (ZeRO-1 on), which only helps the baseline.
* :func:`megatron_homogeneous` — one TP, PP and DP degree for every device (``tp·pp·dp = N``),
  Megatron rank order (TP fastest, then DP, then PP), even layer split, equal batch; the best
  (tp, pp) and options.
* :func:`proportional` — the same grids, with layers split in proportion to each stage's compute
  and the batch in proportion to each pipeline's compute (the naive heterogeneity-aware split).

All return ``BaselineResult`` (plan with embedded estimate, or None when nothing fits).
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from dataclasses import dataclass

import networkx as nx

from planner.cluster import ClusterSpec
from planner.cost import Estimate, ProfileSet, estimate
from planner.errors import SpecError
from planner.model import ModelSpec
from planner.plan import Pipeline, Plan, PlanOptions, Stage
from planner.search.graph import device_compute, device_graph
from planner.search.partition import metis_pipelines
from planner.search.stages import tp_choices

OPTION_LADDER = (PlanOptions("none", 1), PlanOptions("selective", 1), PlanOptions("full", 1))


@dataclass
class BaselineResult:
    name: str
    plan: Plan | None
    estimate: Estimate | None
    tried: int

    @property
    def tokens_per_s(self) -> float:
        return self.estimate.tokens_per_s if self.estimate is not None else 0.0


def split_proportional(total: int, weights: Sequence[float], minimum: int = 1) -> list[int] | None:
    """Integers >= ``minimum`` summing to ``total`` in proportion to ``weights`` (largest remainder)."""
    n = len(weights)
    if n * minimum > total or n == 0:
        return None
    rest = total - n * minimum
    w = sum(weights)
    raw = [rest * x / w for x in weights] if w > 0 else [rest / n] * n
    out = [minimum + math.floor(r) for r in raw]
    left = total - sum(out)
    for i in sorted(range(n), key=lambda i: -(raw[i] - math.floor(raw[i])))[:left]:
        out[i] += 1
    return out


def _fit(plan_of: object, cluster: ClusterSpec, profiles: ProfileSet) -> tuple[Plan, Estimate] | None:
    """The plan under the lightest option that fits (``plan_of(options) -> Plan | None``)."""
    for opts in OPTION_LADDER:
        try:
            plan = plan_of(opts)  # type: ignore[operator]
        except SpecError:
            return None
        if plan is None:
            return None
        est = estimate(plan, cluster, profiles)
        if est.fits:
            return plan, est
    return None


def _stage_sizes(n: int, stages: int, model: ModelSpec) -> list[int] | None:
    """Devices per stage: ``n`` split into ``stages`` valid TP degrees (as equal as possible)."""
    valid = tp_choices(model, n)
    sizes = []
    left = n
    for i in range(stages):
        share = left // (stages - i)
        t = max((v for v in valid if v <= share), default=0)
        if t == 0:
            return None
        sizes.append(t)
        left -= t
    if left:
        return None
    return sizes


def seed_style(cluster: ClusterSpec, model: ModelSpec, global_batch: int, *, trials: int = 40, seed: int = 0,
               profiles: ProfileSet | None = None) -> BaselineResult:
    """The seed planner's randomised method (module docstring)."""
    profiles = profiles or ProfileSet(cluster.catalog)
    rng = random.Random(seed)
    graph = device_graph(cluster)
    ids = [d.id for d in cluster.devices]
    g = nx.relabel_nodes(graph, {d: i for i, d in enumerate(ids)})
    best: tuple[float, Plan, Estimate] | None = None
    n = len(ids)
    for _ in range(trials):
        k = rng.randint(1, max(1, min(n, global_batch, n // 2 or 1)))
        parts = metis_pipelines(g, k, seed=seed)
        k = len(parts)
        batches = [global_batch // k + (1 if i < global_batch % k else 0) for i in range(k)]
        stage_counts = [rng.randint(1, min(len(p), model.num_layers)) for p in parts]

        def build(opts: PlanOptions, parts: list[list[int]] = parts, batches: list[int] = batches,
                  stage_counts: list[int] = stage_counts) -> Plan | None:
            pipes = []
            for p, b, s in zip(parts, batches, stage_counts):
                if b < 1:
                    return None
                devs = [ids[i] for i in sorted(p)]
                sizes = _stage_sizes(len(devs), s, model)
                if sizes is None:
                    return None
                groups, start = [], 0
                for t in sizes:
                    groups.append(tuple(devs[start:start + t]))
                    start += t
                mem = [sum(cluster.device(d).memory_gib for d in grp) for grp in groups]
                layers = split_proportional(model.num_layers, mem)
                if layers is None:
                    return None
                stages, lo = [], 0
                for grp, nl in zip(groups, layers):
                    stages.append(Stage(grp, len(grp), (lo, lo + nl)))
                    lo += nl
                pipes.append(Pipeline(b, b, tuple(stages)))
            return Plan(model, global_batch, tuple(pipes), opts, cluster.name)

        fit = _fit(build, cluster, profiles)
        if fit is not None and (best is None or fit[1].step_time_s < best[0]):
            best = (fit[1].step_time_s, fit[0], fit[1])
    if best is None:
        return BaselineResult("seed-style", None, None, trials)
    return BaselineResult("seed-style", best[1].with_estimate(best[2].to_dict()), best[2], trials)


def _grid_plan(cluster: ClusterSpec, model: ModelSpec, global_batch: int, tp: int, pp: int, opts: PlanOptions,
               proportional_split: bool) -> Plan | None:
    ids = [d.id for d in cluster.devices]
    n = len(ids)
    dp = n // (tp * pp)
    if dp < 1 or tp * pp * dp != n or pp > model.num_layers or dp > global_batch:
        return None
    # Megatron order: rank = t + tp * (d + dp * s)
    grid = [[tuple(ids[(s * dp + d) * tp:(s * dp + d) * tp + tp]) for s in range(pp)] for d in range(dp)]
    speed = {d: device_compute(cluster, d, opts.dtype) for d in ids}
    pipes = []
    pipe_compute = [sum(min(speed[x] for x in grp) * len(grp) for grp in stages_) for stages_ in grid]
    if proportional_split:
        batches = split_proportional(global_batch, pipe_compute)
    else:
        batches = [global_batch // dp + (1 if i < global_batch % dp else 0) for i in range(dp)]
    if batches is None:
        return None
    for stages_, b in zip(grid, batches):
        weights = [min(speed[x] for x in grp) for grp in stages_] if proportional_split else [1.0] * pp
        layers = split_proportional(model.num_layers, weights)
        if layers is None:
            return None
        stages, lo = [], 0
        for grp, nl in zip(stages_, layers):
            stages.append(Stage(grp, tp, (lo, lo + nl)))
            lo += nl
        pipes.append(Pipeline(b, b, tuple(stages)))
    return Plan(model, global_batch, tuple(pipes), opts, cluster.name)


def _grid(cluster: ClusterSpec, model: ModelSpec, global_batch: int, proportional_split: bool, name: str,
          profiles: ProfileSet | None) -> BaselineResult:
    profiles = profiles or ProfileSet(cluster.catalog)
    n = cluster.num_devices
    smallest_node = min(node.gpus for node in cluster.nodes)
    best: tuple[float, Plan, Estimate] | None = None
    tried = 0
    for tp in tp_choices(model, smallest_node):
        for pp in range(1, model.num_layers + 1):
            if n % (tp * pp):
                continue
            tried += 1
            fit = _fit(lambda o, tp=tp, pp=pp: _grid_plan(cluster, model, global_batch, tp, pp, o,
                                                           proportional_split), cluster, profiles)
            if fit is not None and (best is None or fit[1].step_time_s < best[0]):
                best = (fit[1].step_time_s, fit[0], fit[1])
    if best is None:
        return BaselineResult(name, None, None, tried)
    return BaselineResult(name, best[1].with_estimate(best[2].to_dict()), best[2], tried)


def megatron_homogeneous(cluster: ClusterSpec, model: ModelSpec, global_batch: int,
                         profiles: ProfileSet | None = None) -> BaselineResult:
    """The best homogeneous Megatron-style plan (module docstring)."""
    return _grid(cluster, model, global_batch, False, "megatron-homogeneous", profiles)


def proportional(cluster: ClusterSpec, model: ModelSpec, global_batch: int,
                 profiles: ProfileSet | None = None) -> BaselineResult:
    """Megatron grids with compute-proportional layer and batch splits (module docstring)."""
    return _grid(cluster, model, global_batch, True, "compute-proportional", profiles)
