"""Proposing a strategy pool for a length distribution with the planner's own search.

``propose_pool(cluster, model, histogram, step_tokens)``:

1. **Buckets.** Upper bounds ``context / 2^k`` (k = 3..0) above ``MIN_BUCKET`` tokens that hold
   sequences of the histogram.
2. **One plan per bucket.** :func:`planner.search.planner.search` for the whole cluster with the
   model's ``seq_len`` set to the bucket's bound and the global batch to the bucket's share of a
   step's tokens in sequences of that length — the best plan for sequences of that length: high
   TP or PP where long sequences need memory, data parallelism where they do not.
3. **Asymmetric plans** (HSPMD's shape): the devices are split in two — the first ``k`` (a
   quarter, a half) for long sequences, the rest for short ones — each part planned by the same
   search on its sub-cluster (the long part at the context, the short part at the bucket that
   holds most of the remaining tokens), and the two plans joined into one plan whose pipelines
   differ. The dispatcher sends each sequence to a pipeline that can hold it.
4. **Choice.** ``STEPS`` steps drawn from the histogram (``draw_step``) are planned
   (:func:`planner.varlen.step_layout.plan_step`) under: every single strategy alone (static
   training; the best one is the *static baseline*), the hand rule over the bucket plans (HotSPa's
   length buckets) and the whole pool with cost-based assignment (hot switching). Strategies no
   step uses are dropped; the home strategy is the one that trains the most tokens. The mean step
   times of the three are the pool's ``estimate``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from planner.cluster import ClusterSpec, DeviceOverride, Node
from planner.cost import ProfileSet
from planner.errors import PlanInfeasible, SpecError
from planner.model import ModelSpec
from planner.plan import Pipeline, Plan, PlanOptions, Stage
from planner.search.config import SWITCHABLE
from planner.search.planner import PlannerConfig, search
from planner.search.stages import seed_numbering
from planner.varlen.histogram import LengthHistogram, draw_step
from planner.varlen.pool import Strategy, StrategyPool, strategy_costs
from planner.varlen.step_layout import StepLayout, plan_step

MIN_BUCKET = 512
MIN_SHARE = 0.01  # a bucket with less of the tokens gets no plan of its own
STEPS = 4
RECOMPUTE_ORDER = ("none", "selective", "full")


@dataclass
class Proposal:
    pool: StrategyPool
    log: list[str]
    estimate: dict[str, Any]
    candidates: tuple[Strategy, ...] = ()  # every strategy proposed (the pool keeps the used ones)
    static: int = 0  # index into candidates: the best strategy alone (the static baseline)


def sub_cluster(cluster: ClusterSpec, devices: Sequence[str]) -> tuple[ClusterSpec, dict[str, str]]:
    """The cluster restricted to ``devices`` (nodes keep their names and links; devices are renumbered
    from 0 inside each node) and the map from the new device ids to the original ones."""
    keep: dict[str, list[str]] = {}
    for d in devices:
        keep.setdefault(cluster.device(d).node, []).append(d)
    nodes, back, overrides = [], {}, []
    over = dict(cluster.overrides)
    for node in cluster.nodes:
        ids = sorted(keep.get(node.name, []), key=lambda x: cluster.device(x).local_index)
        if not ids:
            continue
        nodes.append(Node(node.name, node.gpu, len(ids), node.intra_link, node.calibration))
        for i, d in enumerate(ids):
            back[f"{node.name}:{i}"] = d
            if d in over:
                overrides.append((f"{node.name}:{i}", over[d]))
    names = {n.name for n in nodes}
    groups = tuple(g for g in cluster.groups if set(g.nodes) <= names)
    pairs = tuple(p for p in cluster.pair_links if p[0] in names and p[1] in names)
    sub = ClusterSpec(cluster.name, tuple(nodes), cluster.inter_node, groups, pairs,
                      tuple((k, DeviceOverride(v.memory_gib, v.slowdown)) for k, v in overrides), cluster.catalog)
    return sub, back


def _rename(plan: Plan, back: dict[str, str]) -> Plan:
    pipes = tuple(Pipeline(p.batch_size, p.micro_batches,
                           tuple(Stage(tuple(back[d] for d in s.devices), s.tp, s.layers) for s in p.stages),
                           p.schedule) for p in plan.pipelines)
    return replace(plan, pipelines=pipes, estimate=None)


def _search(cluster: ClusterSpec, model: ModelSpec, batch: int, cfg: PlannerConfig,
            profiles: ProfileSet | None) -> Plan | None:
    """The planner's plan; if it leaves devices idle (pipelines given no samples), once more with a
    larger batch — a pool's strategies share every device, and under dispatch a plan's batch sizes
    do not matter (the dispatcher gives every pipeline its share)."""
    plan = None
    for b in (max(1, batch), max(2 * batch, 4 * cluster.num_devices)):
        try:
            plan = search(cluster, model, b, config=cfg, profiles=profiles).plan
        except PlanInfeasible:
            return None
        if len(plan.devices) == cluster.num_devices:
            break
    return plan


def _join(a: Plan, b: Plan, model: ModelSpec) -> Plan:
    """One plan with ``a``'s pipelines then ``b``'s (options: the heavier recompute, ZeRO if either)."""
    rec = max(a.options.recompute, b.options.recompute, key=RECOMPUTE_ORDER.index)
    opts = PlanOptions(recompute=rec, zero=max(a.options.zero, b.options.zero), dtype=a.options.dtype,
                       residual_dtype=a.options.residual_dtype)
    pipes = a.pipelines + b.pipelines
    return Plan(model, sum(p.batch_size for p in pipes), pipes, opts)


def _label(plan: Plan) -> str:
    """``tp4`` / ``tp2.pp2x2`` / ``tp4|tp1x2``: TP degree, stage count and repeats per pipeline shape."""
    shapes: list[tuple[str, int]] = []
    for p in plan.pipelines:
        tps = sorted({s.tp for s in p.stages})
        key = "tp" + "-".join(map(str, tps)) + (f".pp{len(p.stages)}" if len(p.stages) > 1 else "")
        if shapes and shapes[-1][0] == key:
            shapes[-1] = (key, shapes[-1][1] + 1)
        else:
            shapes.append((key, 1))
    return "|".join(k + (f"x{n}" if n > 1 else "") for k, n in shapes)


def _distinct(cands: Sequence[Strategy]) -> list[Strategy]:
    """Candidates without repeats (same stages, schedules and options); equal names get a suffix."""
    out: list[Strategy] = []
    seen: set[object] = set()
    names: set[str] = set()
    for c in cands:
        key = (tuple((tuple((s.devices, s.tp, s.layers) for s in p.stages), p.schedule) for p in c.plan.pipelines),
               c.plan.options)
        if key in seen:
            continue
        seen.add(key)
        name, i = c.name, 2
        while name in names:
            name, i = f"{c.name}#{i}", i + 1
        names.add(name)
        out.append(Strategy(name, c.plan))
    return out


def bucket_bounds(hist: LengthHistogram, context: int, min_bucket: int = MIN_BUCKET) -> list[int]:
    longest = hist.quantile(1.0)
    out = [context >> k for k in (3, 2, 1, 0) if (context >> k) >= min(min_bucket, context)]
    return [b for i, b in enumerate(out) if i == 0 or out[i - 1] < longest]


def _mean_time(layouts: Sequence[StepLayout]) -> float:
    return float(np.mean([lay.time_s for lay in layouts]))


def propose_pool(cluster: ClusterSpec, model: ModelSpec, hist: LengthHistogram, step_tokens: int, *,
                 time_limit_s: float = 30.0, seed: int = 0, profiles: ProfileSet | None = None,
                 dtype: str = "bf16", min_bucket: int = MIN_BUCKET) -> Proposal:
    """A pool for training ``model`` (``seq_len`` = the context) on sequences like ``hist`` with
    ``step_tokens`` tokens per step (see the module docstring)."""
    context = model.seq_len
    if step_tokens < context:
        raise SpecError("--step-tokens", f"{step_tokens} tokens per step are fewer than the context {context}",
                        "give a global batch of at least one full-length sequence")
    bounds = bucket_bounds(hist, context, min_bucket)
    log: list[str] = []
    per_search = time_limit_s / (len(bounds) + 4)
    # no context parallelism: a pool's strategies are priced per sequence (.seq_cost) without CP terms
    # and one layer range per stage: a pool switches layouts (planner.schedules.trained.check_no_chunks)
    cfg = PlannerConfig(time_limit_s=per_search, seed=seed, dtype=dtype, polish=False, context_parallel=False,
                        schedules=SWITCHABLE)
    shares = [hist.token_fraction_below(b + 1) - (hist.token_fraction_below(lo + 1) if lo else 0.0)
              for lo, b in zip([0, *bounds[:-1]], bounds)]
    cands: list[Strategy] = []
    for b, share in zip(bounds, shares):
        if share < MIN_SHARE and b != bounds[-1]:
            log.append(f"bucket <= {b}: {share:.1%} of tokens, no plan of its own")
            continue
        plan = _search(cluster, replace(model, seq_len=b), round(share * step_tokens / b), cfg, profiles)
        if plan is None:
            log.append(f"bucket <= {b}: no plan fits")
            continue
        plan = replace(plan, model=model, estimate=None)
        if len(plan.devices) < cluster.num_devices:
            log.append(f"bucket <= {b}: the best plan leaves devices idle ({len(plan.devices)} of "
                       f"{cluster.num_devices}); a pool's strategies share every device")
            continue
        cands.append(Strategy(f"<={b}:{_label(plan)}", plan))
        log.append(f"bucket <= {b} ({share:.0%} of tokens): {_label(plan)}")
    devs = [d.id for d in cluster.devices]
    n = len(devs)
    short = bounds[int(np.argmax(shares[:-1]))] if len(bounds) > 1 else None
    for k in sorted({n // 4, n // 2} - {0}):
        if short is None or k >= n:
            continue
        long_c, long_back = sub_cluster(cluster, devs[:k])
        short_c, short_back = sub_cluster(cluster, devs[k:])
        long_share = max(shares[-1], 1.0 / max(1, step_tokens // context))
        lp = _search(long_c, model, max(1, round(long_share * step_tokens / context)), cfg, profiles)
        sp = _search(short_c, replace(model, seq_len=short), round((1 - long_share) * step_tokens / short), cfg,
                     profiles)
        if lp is None or sp is None:
            log.append(f"asymmetric {k} + {n - k} devices: a part has no plan")
            continue
        plan = seed_numbering(_join(_rename(lp, long_back), _rename(sp, short_back), model), cluster)
        if len(plan.devices) < n:
            log.append(f"asymmetric {k} + {n - k} devices: a part leaves devices idle")
            continue
        cands.append(Strategy(f"asym:{_label(plan)}", plan))
        log.append(f"asymmetric: {_label(lp)} on {k} devices for <= {context}, {_label(sp)} on {n - k} for <= {short}")
    cands = _distinct(cands)
    if not cands:
        raise PlanInfeasible("--lengths", "no strategy fits the cluster", "use a smaller context or more devices")
    pool = StrategyPool(context, tuple(cands), 0)
    rng = np.random.Generator(np.random.PCG64(seed))
    steps = [draw_step(hist, step_tokens, rng, context) for _ in range(STEPS)]
    longest = max(max(s) for s in steps)
    static = {}
    for k, c in enumerate(strategy_costs(pool, cluster, profiles, home=None, alone=True)):
        if c.max_len >= longest:  # the strategy alone, as static training (it is its own home)
            static[k] = _mean_time([plan_step(s, [c], refine=False) for s in steps])
    if not static:
        raise PlanInfeasible("--lengths", f"no single strategy holds a {longest}-token sequence",
                             "add devices or lower the context")
    best_static = min(static, key=lambda k: static[k])
    # home = the strategy that trains the most tokens under hot switching (first guess: the best
    # static one); switch costs and the working layouts' memory are counted from it
    home = best_static
    for _ in range(2):
        costs = strategy_costs(pool, cluster, profiles, home=home)
        hot = [plan_step(s, costs, refine=False) for s in steps]
        tokens = np.zeros(len(costs))
        for s, lay in zip(steps, hot):
            for ph in lay.phases:
                tokens[ph.strategy] += sum(s[i] for i in ph.sequences)
        home = int(np.argmax(tokens))
    costs = strategy_costs(pool, cluster, profiles, home=home)
    hot = [plan_step(s, costs) for s in steps]
    if _mean_time(hot) > static[best_static]:  # switching does not pay here: the best static strategy alone
        log.append("hot switching is not estimated faster than the best static strategy: keeping that one")
        home = best_static
        alone = strategy_costs(pool, cluster, profiles, alone=True)
        hot = [plan_step(s, [alone[home]]) for s in steps]
        hot = [StepLayout(tuple(replace(ph, strategy=home) for ph in lay.phases), lay.solve_s) for lay in hot]
    used = sorted({ph.strategy for lay in hot for ph in lay.phases} | {home})
    buckets = [k for k, s in enumerate(cands) if s.name.startswith("<=")]
    hand = math.nan
    if buckets and max(c.max_len for c in strategy_costs(pool, cluster, profiles, alone=True)) >= longest:
        bcosts = strategy_costs(pool, cluster, profiles, home=buckets[0])
        if bcosts[buckets[-1]].max_len >= longest:
            hand = _mean_time([plan_step(s, [bcosts[k] for k in buckets], assign="threshold", refine=False)
                               for s in steps])
    estimate = {"steps": STEPS, "step_tokens": step_tokens, "static_s": static[best_static],
                "static": cands[best_static].name, "hand_buckets_s": hand, "hot_switching_s": _mean_time(hot),
                "switch_s": float(np.mean([lay.switch_s for lay in hot])),
                "solve_s": float(np.mean([lay.solve_s for lay in hot]))}
    kept = tuple(cands[k] for k in used)
    pool = StrategyPool(context, kept, used.index(home), estimate)
    log.append(f"kept {len(kept)} of {len(cands)} strategies; home {cands[home].name}")
    return Proposal(pool, log, estimate, tuple(cands), best_static)
