"""Infeasibility: which stage cannot fit what, and the smallest change that would fit.

When no candidate fits, the planner builds the roomiest plan it can: every device, TP 1 (no
replicated activations), one pipeline per ``L`` units (a pipeline cannot have more stages than
layers), full recompute, ZeRO-1, micro-batch 1, 1F1B. If *that* fits, an option the caller
excluded is what is missing, and the message names it. If it does not, the message quotes the
stage-by-stage shortfall and counts how many more devices of the cluster's roomiest GPU type
would hold the missing layers.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from planner.errors import PlanInfeasible
from planner.search.candidate import evaluate, explain_split, stage_costs
from planner.search.graph import make_units
from planner.search.oracle import Setting
from planner.search.stages import order_stages

if TYPE_CHECKING:
    from planner.search.planner import Search

GIB = float(1 << 30)


def infeasible(search: Search) -> PlanInfeasible:
    cluster, model, cfg = search.cluster, search.model, search.config
    L = model.num_layers
    units = make_units(cluster, {n.name: 1 for n in cluster.nodes}, cfg.dtype)
    k = max(1, math.ceil(len(units) / L))
    pipes = [[units[i] for i in order_stages(cluster, units, list(range(len(units)))[p::k])] for p in range(k)]
    roomy = Setting(1, "full", 1, "1f1b", cfg.dtype)
    tried = (f"recompute {'/'.join(cfg.recompute)}, ZeRO {'/'.join(map(str, cfg.zero))}, "
             f"micro-batch sizes {'/'.join(map(str, cfg.micro_batch_sizes))}")
    where = f"{model.name} (global batch {search.B}) on {cluster.name} ({cluster.num_devices} devices)"
    cand = evaluate(search.oracle, pipes, roomy, search.B)
    if cand.feasible:
        missing = []
        if "full" not in cfg.recompute:
            missing.append("recompute full")
        if 1 not in cfg.zero:
            missing.append("ZeRO-1")
        if 1 not in cfg.micro_batch_sizes:
            missing.append("micro-batch size 1")
        first = search.problems[0] if search.problems else "no candidate fits"
        return PlanInfeasible("options", f"no plan for {where} fits with {tried}: {first}",
                              f"allow {', '.join(missing) or 'more pipelines or stages'}; with recompute full, "
                              f"ZeRO-1 and micro-batch 1 it fits")
    costs = stage_costs(search.oracle, pipes[0], 1, roomy, k)
    detail = explain_split(search.oracle, pipes[0], costs, L)
    held = sum(min(c.max_layers(), L) for c in costs)
    short = max(1, L - held)
    roomiest = max(cluster.devices, key=lambda d: d.memory_gib)
    per_layer = max(c.per_layer_bytes for c in costs)
    middle_fixed = min(c.fixed_bytes for c in costs)
    per_device = max(0, math.floor((roomiest.memory_gib * GIB - middle_fixed) / per_layer)) if per_layer > 0 else 0
    if per_device >= 1:
        more = math.ceil(short / per_device) * k
        hint = (f"add at least {more} more {roomiest.gpu} ({roomiest.memory_gib:g} GiB) devices, "
                f"or use a shorter sequence or a smaller model")
    else:
        hint = (f"no {roomiest.gpu} can hold one layer at this sequence length: shorten the sequence or use "
                "a smaller model")
    return PlanInfeasible("cluster", f"{where} does not fit even with every device, TP 1, recompute full, ZeRO-1 "
                          f"and micro-batch 1: {detail}", hint)
