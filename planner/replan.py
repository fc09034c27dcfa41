"""Re-planning for a changed device set, warm-started from the running plan (pure, no torch).

``replan(cluster, devices, current)``:

1. **Sub-cluster.** The cluster restricted to ``devices``: each node keeps only its listed GPUs,
   renumbered ``0..k-1`` in local-index order (per-device overrides follow them), nodes without a
   listed GPU are dropped with their groups' and pair links' mentions. The planner plans on it;
   its plan's device ids are mapped back to the real ones.
2. **Warm start.** The running plan's structure on the new devices seeds the search
   (:meth:`planner.search.planner.Search.run`): every stage keeps its staying devices (a CP stage
   whose devices all stay as the same ``cp x tp`` mesh; else as one TP group when that degree is
   allowed, else one unit per device), and the joining devices form
   one more pipeline of single-device units. The search scores it first and keeps it in its pool,
   so the new plan is never worse than that structure under the search's surrogate, and local
   search starts from whichever is best. The search runs with ``time_limit_s`` (default a few
   seconds) — re-planning happens while the job keeps training.
3. **Roles kept.** Interchangeable GPUs (same node, memory and slowdown) of ``devices`` are
   relabelled so that, slot by slot in rank order, each slot of the new plan goes to the device
   that already holds the most of the weights that slot needs (a device the plan leaves idle
   counts as interchangeable too): a staying device reuses its local copy instead of
   receiving it (:mod:`planner.state_move_plan` moves fewer bytes).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

from planner.chunks import intersect
from planner.cluster import ClusterSpec, DeviceOverride, Node
from planner.errors import SpecError
from planner.plan import Pipeline, Plan, Stage
from planner.search.config import PlannerConfig, elastic_config
from planner.search.graph import Unit, _unit
from planner.search.planner import search
from planner.search.stages import tp_choices
from planner.state_layout import rank_states

REPLAN_TIME_LIMIT_S = 10.0


@dataclass(frozen=True)
class SubCluster:
    """``cluster`` restricted to some devices; ``real[sub_id]`` is the device's id in the cluster."""

    cluster: ClusterSpec
    real: dict[str, str]

    @property
    def sub(self) -> dict[str, str]:
        return {r: s for s, r in self.real.items()}


@dataclass
class Replan:
    plan: Plan
    seconds: float
    log: list[str] = field(default_factory=list)


def sub_cluster(cluster: ClusterSpec, devices: Sequence[str]) -> SubCluster:
    """Step 1 of the module docstring (unknown or repeated devices are a ``SpecError``)."""
    for i, dev_id in enumerate(devices):
        cluster.device(dev_id, f"devices[{i}]")
    if len(set(devices)) != len(devices):
        raise SpecError("devices", "a device is listed twice", "list each device once")
    wanted = set(devices)
    nodes, real, overrides = [], {}, []
    over = dict(cluster.overrides)
    for node in cluster.nodes:
        mine = sorted((d for d in cluster.devices if d.node == node.name and d.id in wanted),
                      key=lambda d: d.local_index)
        if not mine:
            continue
        nodes.append(Node(node.name, node.gpu, len(mine), node.intra_link, node.calibration))
        for k, d in enumerate(mine):
            real[f"{node.name}:{k}"] = d.id
            if d.id in over:
                overrides.append((f"{node.name}:{k}", over[d.id]))
    names = {n.name for n in nodes}
    groups = tuple(replace(g, nodes=tuple(n for n in g.nodes if n in names)) for g in cluster.groups
                   if len([n for n in g.nodes if n in names]) >= 2)
    pairs = tuple(p for p in cluster.pair_links if p[0] in names and p[1] in names)
    sub = ClusterSpec(cluster.name, tuple(nodes), cluster.inter_node, groups, pairs,
                      tuple((d, DeviceOverride(o.memory_gib, o.slowdown)) for d, o in overrides), cluster.catalog)
    return SubCluster(sub, real)


def warm_start(current: Plan, sub: SubCluster, context_parallel: bool = True) -> list[list[Unit]]:
    """Step 2 of the module docstring, in the sub-cluster's device ids (``context_parallel``: a stage
    of ``cp > 1`` that keeps all its devices stays that CP mesh; else it is a TP group or units)."""
    cluster, to_sub = sub.cluster, sub.sub
    pipes: list[list[Unit]] = []
    index = 0

    def unit(devs: list[str], cp: int = 1) -> Unit:
        nonlocal index
        index += 1
        return _unit(cluster, index - 1, cluster.device(devs[0]).node, tuple(devs), current.options.dtype, cp)

    for pipe in current.pipelines:
        units: list[Unit] = []
        for st in pipe.stages:
            stay = [to_sub[d] for d in st.devices if d in to_sub]
            nodes = {cluster.device(d).node for d in stay}
            if context_parallel and st.cp > 1 and len(stay) == len(st.devices) and len(nodes) == 1:
                units.append(unit(stay, st.cp))
            elif len(stay) > 1 and len(nodes) == 1 and len(stay) in tp_choices(current.model, len(stay)):
                units.append(unit(stay))
            else:
                units += [unit([d]) for d in stay]
        if units:
            pipes.append(units)
    used = {d for p in pipes for u in p for d in u.devices}
    joining = [unit([d]) for d in sub.real if d not in used]
    if joining:
        pipes.append(joining)
    return [p for p in pipes if len(p) <= current.model.num_layers]


def replan(cluster: ClusterSpec, devices: Sequence[str], current: Plan, *,
           config: PlannerConfig | None = None, context_parallel: bool = True) -> Replan:
    """The plan for ``devices`` (module docstring); same model, global batch and dtype as ``current``.
    ``context_parallel=False`` keeps every stage at cp 1 (a strategy pool's strategies: hot switching
    has no CP layouts); an elastic switch moves the state into a CP layout as into any other."""
    t0 = time.perf_counter()
    sub = sub_cluster(cluster, devices)
    cfg = config or PlannerConfig(time_limit_s=REPLAN_TIME_LIMIT_S, dtype=current.options.dtype,
                                  compile=current.options.compile, residual_dtype=current.options.residual_dtype)
    cfg = replace(cfg, context_parallel=cfg.context_parallel and context_parallel)
    cfg = elastic_config(cfg)  # the plan replaces a running layout: one layer range per stage
    result = search(sub.cluster, current.model, current.global_batch_size, config=cfg,
                    start=warm_start(current, sub, cfg.context_parallel))
    plan = _rename(result.plan, sub.real)
    plan = keep_roles(current, replace(plan, cluster=cluster.name), cluster, devices)
    return Replan(plan, time.perf_counter() - t0, result.log)


def _rename(plan: Plan, real: dict[str, str]) -> Plan:
    pipes = tuple(Pipeline(p.batch_size, p.micro_batches,
                           tuple(Stage(tuple(real[d] for d in s.devices), s.tp, s.layers, s.cp, s.chunks)
                                 for s in p.stages),
                           p.schedule) for p in plan.pipelines)
    return replace(plan, pipelines=pipes)


def keep_roles(old: Plan, new: Plan, cluster: ClusterSpec, devices: Sequence[str] = ()) -> Plan:
    """Step 3 of the module docstring: ``new`` with interchangeable devices relabelled; a slot may go
    to any device of ``devices`` (the job's device set, which may hold devices ``new`` leaves idle)."""
    held: dict[str, dict[str, list]] = {}
    for s in rank_states(old):
        held[s.device] = {}
        for h in s.holdings:
            if h.tensor.startswith("model/"):
                held[s.device].setdefault(h.tensor, []).append(h.chunk)

    def kind(d: str) -> tuple[str, float, float]:
        dev = cluster.device(d)
        return dev.node, dev.memory_gib, dev.slowdown

    free: dict[tuple[str, float, float], list[str]] = {}
    for d in dict.fromkeys([*new.devices, *devices]):
        free.setdefault(kind(d), []).append(d)
    rename: dict[str, str] = {}
    for s in rank_states(new):
        needs = [h for h in s.holdings if h.tensor.startswith("model/")]
        pool = free[kind(s.device)]

        def reuse(d: str, needs: list = needs) -> int:
            mine = held.get(d, {})
            return sum(c.numel for h in needs for o in mine.get(h.tensor, ()) if (c := intersect(o, h.chunk)))

        best = max(pool, key=lambda d: (reuse(d), d == s.device))
        pool.remove(best)
        rename[s.device] = best
    return _rename(new, rename)
