"""One candidate structure (pipelines of ordered stage units + a setting), refined and priced.

:func:`evaluate` runs the refinement (:mod:`.layer_split`, :mod:`.batch_split`) on a structure:

1. Pipelines with the same stage signatures (units and the links between consecutive stages)
   form one *type*; each type is split once.
2. Start from ``m = ceil(B / (k·μ))`` micro-batches; split every type's layers exactly for its
   ``m``; solve the batch ILP; repeat with the ILP's micro-batch counts until they stop changing
   (at most ``MAX_ROUNDS`` rounds; the best round is kept). The memory of a split uses the
   schedule's in-flight count for that ``m``, so the final split is checked at the final ``m``.
3. The surrogate step time is the slowest pipeline or the end of the gradient sync between
   pipelines, whichever is later, plus the optimizer step (:func:`_step_s`).

:func:`to_plan` turns the result into a :class:`planner.plan.Plan`.
"""

from __future__ import annotations

import bisect
import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass, field

from planner.cluster import Link
from planner.cost.memory import GIB
from planner.cost.partial_params import partial_params_by_shape
from planner.cost.schedule import in_flight, split_backward_held
from planner.interleave import interleaved
from planner.layout import embed_param, finest_slices, head_params, layer_numel
from planner.plan import Pipeline, Plan, PlanOptions, Stage
from planner.schedules import schedule_named
from planner.search.batch_split import BatchSplit, PipeType, allocate_batch
from planner.search.graph import Unit
from planner.search.layer_split import LayerSplit, StageCost, split_layers
from planner.search.oracle import Oracle, Setting

MAX_ROUNDS = 4


@dataclass
class Layout:
    """A refined pipeline: ordered stage units, layers per stage, samples and micro-batches."""

    units: tuple[Unit, ...]
    counts: tuple[int, ...]
    batch: int
    micro_batches: int


@dataclass
class Candidate:
    pipelines: list[list[Unit]]
    setting: Setting
    step_s: float = math.inf
    layouts: list[Layout] = field(default_factory=list)
    problem: str = ""  # why it does not fit, when step_s is inf
    origin: tuple[str, dict[str, int], int] = ("", {}, 1)  # partitioner, TP template and CP degree
    # one schedule per layout where a twin mixes them (:mod:`.interleaved_variant`); empty: the setting's
    schedules: tuple[str, ...] = ()

    @property
    def feasible(self) -> bool:
        return math.isfinite(self.step_s)


def _links(oracle: Oracle, units: Sequence[Unit]) -> tuple[Link, ...]:
    return oracle.chain_links(tuple(u.node for u in units))


def stage_costs(oracle: Oracle, units: Sequence[Unit], m: int, s: Setting, shards: int) -> list[StageCost]:
    S = len(units)
    return [oracle.stage_cost(u, i == 0, i == S - 1, in_flight(s.schedule, S, i, m),
                              units[i - 1] if i > 0 else None, units[i + 1] if i < S - 1 else None, s, shards,
                              held=split_backward_held(s.schedule, S, i, m))
            for i, u in enumerate(units)]


def explain_split(oracle: Oracle, units: Sequence[Unit], costs: Sequence[StageCost], num_layers: int) -> str:
    """Which stage of a pipeline cannot fit what (for infeasible splits)."""
    gib = float(1 << 30)
    parts = []
    for i, (u, c) in enumerate(zip(units, costs)):
        fits = c.max_layers()
        parts.append(f"stage {i} ({u.devices[0]}.., {u.gpu} x{u.tp}, {u.memory_gib:g} GiB) fits {fits} layers "
                     f"({c.per_layer_bytes / gib:.2f} GiB per layer + {c.fixed_bytes / gib:.2f} GiB fixed)")
    total = sum(min(c.max_layers(), num_layers) for c in costs)
    head = (f"{len(units)} stages hold at most {total} of {num_layers} layers" if total < num_layers
            else "a stage cannot hold even one layer" if min(c.max_layers() for c in costs) < 1
            else f"{len(units)} stages for {num_layers} layers")
    return head + ": " + "; ".join(parts)


def evaluate(oracle: Oracle, pipelines: Sequence[Sequence[Unit]], s: Setting, global_batch: int,
             use_ilp: bool = False, explain: bool = True) -> Candidate:
    """Refine and price one structure (module docstring). The rounds split the batch by bisection
    (:func:`.batch_split.waterfill`); ``use_ilp`` then solves the best round's batch split as the ILP
    (the same min-max; kept when it is not worse)."""
    oracle.stats.refinements += 1
    cand = Candidate([list(p) for p in pipelines], s)
    L = oracle.model.num_layers
    k = len(pipelines)
    if k == 0:
        cand.problem = "no pipelines"
        return cand
    types: dict[tuple[object, ...], list[int]] = {}
    links_of: list[tuple[Link, ...]] = []
    for pi, units in enumerate(pipelines):
        links = _links(oracle, units)
        links_of.append(links)
        types.setdefault((tuple(u.signature for u in units), links), []).append(pi)
    keys = list(types)
    mu = s.micro_batch
    m_of = {key: max(1, math.ceil(global_batch / (k * mu))) for key in keys}
    best: tuple[float, dict, object, dict] | None = None
    best_round: tuple[list[PipeType], list, dict, dict] | None = None
    problems: list[str] = []
    for _ in range(MAX_ROUNDS):
        splits: dict[tuple[object, ...], LayerSplit] = {}
        cost_of: dict[tuple[object, ...], list[StageCost]] = {}
        ptypes: list[PipeType] = []
        live: list[tuple[object, ...]] = []
        problems = []
        for key in keys:
            rep = pipelines[types[key][0]]
            costs, split, opt, cap = _refine_type(oracle, key, rep, m_of[key], s, k, global_batch)
            if split is None:
                if explain:
                    problems.append(explain_split(oracle, rep, costs, L))
                continue
            splits[key] = split
            cost_of[key] = costs
            live.append(key)
            ptypes.append(PipeType(len(types[key]), split.bottleneck_s, split.sum_s, opt, cap))
        if not live:
            break
        alloc = allocate_batch(ptypes, global_batch, mu, use_ilp=False)
        if alloc is None:
            problems.append(f"the pipelines cannot take {global_batch} samples at micro-batch size {mu}")
            break
        step = _step_s(oracle, pipelines, types, live, splits, cost_of, ptypes, alloc, s)
        new_m = dict(m_of)
        for j, key in enumerate(live):
            if alloc.base[j] + alloc.extra[j] > 0:
                new_m[key] = max(1, alloc.micro_batches[j])
        if best is None or step < best[0]:
            best = (step, dict(zip(live, zip(alloc.base, alloc.extra, alloc.micro_batches))), None, dict(splits))
            best_round = (ptypes, live, splits, cost_of)
        if new_m == m_of:
            break
        m_of = new_m  # re-split for the micro-batch counts the allocation chose
    if use_ilp and best is not None and best_round is not None:
        ptypes, live, splits, cost_of = best_round
        alloc = allocate_batch(ptypes, global_batch, mu, use_ilp=True)
        if alloc is not None:
            step = _step_s(oracle, pipelines, types, live, splits, cost_of, ptypes, alloc, s)
            if step <= best[0] * (1 + 1e-9):
                best = (step, dict(zip(live, zip(alloc.base, alloc.extra, alloc.micro_batches))), None,
                        dict(splits))
    if best is None:
        cand.problem = problems[0] if problems else "no feasible split"
        return cand
    step, per_type, _, splits = best
    layouts: list[Layout] = []
    rank_in_type = {pi: idx for members in types.values() for idx, pi in enumerate(members)}
    type_of = {pi: key for key, members in types.items() for pi in members}
    for pi in range(k):
        key = type_of[pi]
        if key not in per_type:
            continue
        q, r, m = per_type[key]
        b = q + 1 if rank_in_type[pi] < r else q
        if b > 0:
            layouts.append(Layout(tuple(pipelines[pi]), splits[key].counts, b, max(1, min(m, b))))
    if len(layouts) < k:
        # pipelines without samples are dropped; the rest must be refined again because the
        # ZeRO-1 shards (and the gradient sync) count the pipelines that remain
        kept = [list(lay.units) for lay in layouts]
        again = evaluate(oracle, kept, s, global_batch, use_ilp, explain)
        again.pipelines = [list(p) for p in pipelines]  # the structure the search proposed
        return again
    cand.layouts = layouts
    if k > 1:  # shards cut by the other pipelines' TP degrees: known once every split is
        for pi, (lay, needs) in enumerate(zip(layouts, stage_bytes(oracle, cand))):
            for si, (u, need) in enumerate(zip(lay.units, needs)):
                if need > u.memory_gib * GIB:
                    cand.layouts = []
                    cand.problem = (f"pipeline {pi} stage {si} ({u.devices[0]}.., {u.gpu} x{u.tp}) needs "
                                    f"{need / GIB:.2f} of {u.memory_gib:g} GiB with the copies of its shards that "
                                    "other pipelines' TP degrees cut into several sync slices")
                    return cand
    cand.step_s = step
    return cand


def stage_bytes(oracle: Oracle, cand: Candidate) -> list[list[float]]:
    """The surrogate's memory of every stage of a refined candidate: the linear cost at the stage's
    layer count, plus the copies of the shards that the other pipelines' TP degrees cut into several
    sync slices (:meth:`Oracle.copy_bytes`; the split does not see them, they depend on every
    pipeline's split). Priced once per pipeline type (units, links, split and micro-batches), the
    cut shards once per distinct pipeline shape (:func:`partial_params_by_shape`), no plan built."""
    k = len(cand.layouts)
    keys, shapes = [], []
    for lay in cand.layouts:
        keys.append((tuple(u.signature for u in lay.units), _links(oracle, lay.units), lay.counts,
                     lay.micro_batches))
        starts = list(itertools.accumulate(lay.counts, initial=0))
        shapes.append(tuple((u.tp, (lo, hi)) for u, lo, hi in zip(lay.units, starts, starts[1:])))
    partial = partial_params_by_shape(oracle.model, set(shapes)) if k > 1 else {}
    oracle.stats.partial_params += 1
    out = []
    seen: dict[tuple[object, ...], list[float]] = {}
    for lay, key, shape in zip(cand.layouts, keys, shapes):
        hit = seen.get(key)
        if hit is None:
            costs = stage_costs(oracle, lay.units, lay.micro_batches, cand.setting, k)
            cut = partial.get(shape) or [0.0] * len(lay.units)
            hit = seen[key] = [c.fixed_bytes + c.per_layer_bytes * n + oracle.copy_bytes(x, cand.setting, k, u.gpu)
                               for u, c, n, x in zip(lay.units, costs, lay.counts, cut)]
        out.append(hit)
    return out


def _refine_type(oracle: Oracle, key: tuple[object, ...], rep: Sequence[Unit], m: int, s: Setting, k: int,
                 global_batch: int) -> tuple[list[StageCost], LayerSplit | None, float, int]:
    """Stage costs, exact layer split, optimizer time and micro-batch cap of one pipeline type
    (cached on the oracle: the same type recurs across structures and search steps)."""
    ckey = (key, m, s, k, global_batch)
    hit = oracle.type_cache.get(ckey)
    if hit is None:
        costs = stage_costs(oracle, rep, m, s, k)
        split = split_layers(costs, oracle.model.num_layers, m)
        if split is None:
            hit = (costs, None, 0.0, 0)
        else:
            hit = (costs, split, _optimizer_s(oracle, rep, split.counts, s, k),
                   _micro_batch_cap(oracle, rep, split.counts, m, s, k, global_batch))
        oracle.type_cache[ckey] = hit
    return hit


def _fits(oracle: Oracle, units: Sequence[Unit], counts: Sequence[int], m: int, s: Setting, shards: int) -> bool:
    costs = stage_costs(oracle, units, m, s, shards)
    return all(n <= c.max_layers() for n, c in zip(counts, costs))


def _micro_batch_cap(oracle: Oracle, units: Sequence[Unit], counts: Sequence[int], m: int, s: Setting,
                     shards: int, global_batch: int) -> int:
    """The most micro-batches this split still fits with (1F1B: in-flight stops growing at S)."""
    limit = global_batch if s.schedule == "gpipe" else len(units)
    if m >= limit or _fits(oracle, units, counts, limit, s, shards):
        return global_batch
    lo, hi = m, limit  # fits at lo, not at hi
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if _fits(oracle, units, counts, mid, s, shards):
            lo = mid
        else:
            hi = mid
    return lo


def _optimizer_s(oracle: Oracle, units: Sequence[Unit], counts: Sequence[int], s: Setting, shards: int) -> float:
    S = len(units)
    return max(oracle.optimizer_seconds(u, n, i == 0, i == S - 1, shards, s)
               for i, (u, n) in enumerate(zip(units, counts)))


def _step_s(oracle: Oracle, pipelines: Sequence[Sequence[Unit]], types: dict, live: list, splits: dict,
            costs: dict, ptypes: Sequence[PipeType], alloc: BatchSplit, s: Setting) -> float:
    """Surrogate step time: ``max(slowest pipeline, end of the gradient sync) + optimizer (+ the
    ZeRO-1 all-gather)``, the sync replayed as :mod:`planner.cost.step` runs it, at the
    granularity of pipeline *types* (identical pipelines run in lockstep).

    The layers are cut into segments at every stage boundary of every pipeline; in a segment the
    owners (one stage per pipeline) hold each weight in ``T`` finest slices (``T`` = lcm of their
    TP degrees); each slice is one all-reduce among all ``k`` pipelines over the slowest link among
    the owners' nodes, plus one for the replicated norm weights, and the embedding / LM head
    likewise on the end stages. Groups run in layer order; a group starts when all its owners are
    free (a device runs its groups one after the other), so pipelines split differently chain
    their groups across the whole model, which the estimate charges too. A stage is free once its
    last backward is ``dp_overlap`` done: stage ``i`` ends about ``Σ_{j<i} b_j`` before stage 0
    (``b`` ≈ 2/3 of a stage's per-micro-batch time)."""
    act = [(j, key) for j, key in enumerate(live) if alloc.base[j] + alloc.extra[j] > 0]
    times = {j: ptypes[j].time(max(1, alloc.micro_batches[j])) - ptypes[j].fixed_s for j, _ in act}
    optimizer = max(ptypes[j].fixed_s for j, _ in act)
    k = sum(len(types[key]) if alloc.base[j] > 0 else alloc.extra[j] for j, key in act)
    t_max = max(times.values())
    if k <= 1:
        return t_max + optimizer
    model = oracle.model
    L = model.num_layers
    # stage starts per type, segment bounds, and per segment: owner stage per type, nodes, TP degrees
    starts_of: dict[int, list[int]] = {}
    cuts = {0, L}
    for j, key in act:
        starts = [0]
        for n in splits[key].counts[:-1]:
            starts.append(starts[-1] + n)
        starts_of[j] = starts
        cuts.update(starts)
    bounds = sorted(cuts)
    nseg = len(bounds) - 1
    owner = {j: [bisect.bisect_right(starts_of[j], lo) - 1 for lo in bounds[:-1]] for j, _ in act}
    seg_nodes: list[set[str]] = [set() for _ in range(nseg)]
    end_nodes: tuple[set[str], set[str]] = (set(), set())
    for j, key in act:
        n_active = len(types[key]) if alloc.base[j] > 0 else alloc.extra[j]
        for pi in types[key][:n_active]:
            units = pipelines[pi]
            for si in range(nseg):
                seg_nodes[si].add(units[owner[j][si]].node)
            end_nodes[0].add(units[0].node)
            end_nodes[1].add(units[-1].node)
    rep = {j: pipelines[types[key][0]] for j, key in act}
    free: dict[tuple[int, int, int], float] = {}
    for j, key in act:
        back, ahead = 0.0, 0.0
        for i, (c, n) in enumerate(zip(costs[key], splits[key].counts)):
            back = 2.0 / 3.0 * c.time(n)
            for r in range(rep[j][i].tp):
                free[j, i, r] = times[j] - ahead - oracle.params.dp_overlap * back
            ahead += back
    zero_ag = 0.0
    half = 0.5 if s.zero else 1.0

    def run(owners: list[tuple[int, int, int]], elements: float, link: Link | None) -> None:
        nonlocal zero_ag
        t = half * oracle.allreduce_s(elements * 4, k, link)
        if s.zero:
            zero_ag = max(zero_ag, t)
        end = max(free[o] for o in owners) + t
        for o in owners:
            free[o] = end

    def sliced(stage_of: dict[int, int], elements: float, link: Link | None) -> None:
        slices = finest_slices([rep[j][stage_of[j]].tp for j, _ in act])
        for tp_ranks in slices:
            run([(j, stage_of[j], r) for (j, _), r in zip(act, tp_ranks)], elements / len(slices), link)

    sharded, replicated = layer_numel(model)
    firsts = {j: 0 for j, _ in act}
    sliced(firsts, embed_param(model).numel, oracle.slowest_link(frozenset(end_nodes[0])))
    for si in range(nseg):
        stage_of = {j: owner[j][si] for j, _ in act}
        link = oracle.slowest_link(frozenset(seg_nodes[si]))
        length = bounds[si + 1] - bounds[si]
        sliced(stage_of, sharded * length, link)
        run([(j, stage_of[j], 0) for j, _ in act], replicated * length, link)
    lasts = {j: len(rep[j]) - 1 for j, _ in act}
    head_link = oracle.slowest_link(frozenset(end_nodes[1]))
    for info in sorted(head_params(model), key=lambda i: i.shard_dim is None):  # the LM head, then the norm
        if info.shard_dim is None:
            run([(j, lasts[j], 0) for j, _ in act], info.numel, head_link)
        else:
            sliced(lasts, info.numel, head_link)
    return max(t_max, max(free.values())) + optimizer + zero_ag


def to_plan(cand: Candidate, oracle: Oracle, global_batch: int, cluster_name: str | None) -> Plan:
    """The plan of a feasible candidate (pipelines in the candidate's order)."""
    pipes = []
    for pi, lay in enumerate(cand.layouts):
        stages = []
        start = 0
        for u, n in zip(lay.units, lay.counts):
            stages.append(Stage(u.devices, u.tp, (start, start + n), u.cp))
            start += n
        # a single stage has no bubble for ZB-H1 to fill: it runs 1F1B (the same ops, W not deferred)
        sched = "1f1b" if cand.setting.schedule == "zb-h1" and len(stages) == 1 else cand.setting.schedule
        sched = cand.schedules[pi] if cand.schedules else sched
        chunks = schedule_named(sched).chunks
        pipe = Pipeline(lay.batch, lay.micro_batches, tuple(stages), sched if chunks == 1 else "1f1b")
        pipes.append(pipe if chunks == 1 else interleaved(pipe, chunks, sched))  # layers cut as planner.interleave
    s = cand.setting
    residual = s.dtype if oracle.params.residual_in_compute_dtype else "fp32"
    options = PlanOptions(s.recompute, s.zero, s.dtype, s.compile, residual)
    return Plan(oracle.model, global_batch, tuple(pipes), options, cluster_name)
