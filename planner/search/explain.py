"""Infeasibility: which stage cannot fit what, and the smallest change that would fit.

When no candidate fits and the caller restricted the options (recompute, ZeRO, micro-batch
sizes), short searches try the smallest changes first — a smaller micro-batch, ZeRO-1, selective
recompute, full recompute, one at a time, then all together — and the message names the first
that fits. Otherwise memory is short whatever the options: the message quotes,
stage by stage, what each device of a roomy layout (every device, TP 1, one pipeline per ``L``
units, full recompute, ZeRO-1, micro-batch 1, 1F1B) can hold, and counts how many more devices
of the cluster's roomiest GPU type would hold the missing layers.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import replace

from planner.cluster import ClusterSpec
from planner.errors import PlanInfeasible
from planner.model import RECOMPUTE_MODES, ModelSpec
from planner.search.candidate import explain_split, stage_costs
from planner.search.config import PlannerConfig
from planner.search.graph import make_units
from planner.search.oracle import Oracle, Setting
from planner.search.stages import order_units

GIB = float(1 << 30)
RELAXED_BUDGET = 150  # evaluations of each "would it fit with ...?" search


def _relaxations(cfg: PlannerConfig) -> list[tuple[str, PlannerConfig]]:
    """Smallest changes first: one option at a time (smaller micro-batch, ZeRO-1, selective, full
    recompute), then all of them together."""
    quick = replace(cfg, local_search=False, max_evaluations=RELAXED_BUDGET)
    out: list[tuple[str, PlannerConfig]] = []
    smaller = tuple(sorted(set(cfg.micro_batch_sizes) | {1, 2}))
    if smaller != tuple(sorted(cfg.micro_batch_sizes)):
        out.append(("a smaller micro-batch size (1 or 2)", replace(quick, micro_batch_sizes=smaller)))
    if 1 not in cfg.zero:
        out.append(("ZeRO-1", replace(quick, zero=(*cfg.zero, 1))))
    for mode in ("selective", "full"):
        if mode not in cfg.recompute:
            out.append((f"recompute {mode}", replace(quick, recompute=(*cfg.recompute, mode))))
    if len(out) > 1:
        out.append(("recompute full, ZeRO-1 and micro-batch size 1",
                    replace(quick, recompute=RECOMPUTE_MODES, zero=(0, 1), micro_batch_sizes=smaller)))
    return out


def infeasible(*, cluster: ClusterSpec, model: ModelSpec, global_batch: int, config: PlannerConfig, oracle: Oracle,
               problems: list[str], solve: Callable[[PlannerConfig], float]) -> PlanInfeasible:
    """The error to raise when a search found nothing that fits (module docstring). ``problems``: the
    search's first reasons; ``solve(config)``: the step time of the plan a search under ``config``
    finds (raises :class:`PlanInfeasible` when none fits)."""
    cfg = config
    where = f"{model.name} (global batch {global_batch}) on {cluster.name} ({cluster.num_devices} devices)"
    tried = (f"recompute {'/'.join(cfg.recompute)}, ZeRO {'/'.join(map(str, cfg.zero))}, "
             f"micro-batch sizes {'/'.join(map(str, cfg.micro_batch_sizes))}")
    for label, relaxed in _relaxations(cfg):
        try:
            step_s = solve(relaxed)
        except PlanInfeasible:
            continue
        first = problems[0] if problems else "no candidate fits in memory"
        return PlanInfeasible("options", f"no plan for {where} fits with {tried}: {first}",
                              f"allow {label}: then a plan fits ({step_s:.3f} s per step)")
    L = model.num_layers
    units = make_units(cluster, {n.name: 1 for n in cluster.nodes}, cfg.dtype)
    k = max(1, math.ceil(len(units) / L))
    pipes = [order_units(cluster, units[p::k]) for p in range(k)]
    roomy = Setting(1, "full", 1, "1f1b", cfg.dtype, cfg.compile)
    m = max(1, math.ceil(global_batch / k))
    costs = stage_costs(oracle, pipes[0], m, roomy, k)
    detail = explain_split(oracle, pipes[0], costs, L)
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
    return PlanInfeasible("cluster", f"{where} does not fit with any option ({tried} and the rest); with every "
                          f"device, TP 1, recompute full, ZeRO-1 and micro-batch 1: {detail}", hint)
