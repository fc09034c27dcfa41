"""``make_plan``: the hierarchical planner (graph partitioning + exact refinement + local search).

Algorithm (every step deterministic for a fixed ``seed``):

1. **Units.** For a TP template (one TP degree per node kind, :mod:`.stages`), every node is cut
   into TP groups; each group is a candidate stage (:mod:`.graph`).
2. **Phase 1 — pipelines** (:mod:`.partition`). For each pipeline count ``k`` of a range
   (1..8, then steps of ~25 % up to the unit count and the global batch) these partitions:
   METIS k-way on the unit graph (balanced compute and memory, and compute alone; cut on slow
   links; clusters up to ``METIS_MAX_UNITS`` units), *striped* (the units of every class dealt round-robin, so every
   pipeline gets the same mix of GPU types and the owners of a layer sit on the same nodes), and
   *by class* (each class of identical nodes cut into its own pipelines, ``k`` shared out in
   proportion to the classes' compute) — the hierarchical partition that keeps 8,192-GPU
   clusters cheap: identical pipelines are refined once.
3. **Phase 2 — stages** (:mod:`.stages`): stage order inside each pipeline.
4. **Refinement** (:mod:`.refine` via :mod:`.candidate`): exact layer split per pipeline type
   and batch / micro-batch split (bisection in the search loop, the ILP for the finalists).
   Structures are first scored at micro-batch size 1, ZeRO-1 if allowed and the lightest
   recompute that fits; the best ``TOP_STRUCTURES`` are then re-scored under every allowed
   setting (micro-batch size, recompute none/selective/full, ZeRO-0/1, 1F1B/GPipe).
5. **TP templates**: uniform templates first, then, around the best one, one node kind's TP
   degree changed at a time (coordinate descent) over the nearby pipeline counts.
6. **Local search** (:mod:`.local_search`) on the best candidate: move/swap units between
   pipelines, merge/split pipelines, split/merge a stage's TP group, reverse a stage order,
   while the surrogate improves, within the evaluation budget and the time limit.
7. **Finalists**: the best few distinct candidates get the ILP batch split and the full
   :func:`planner.cost.estimate`; the fastest one that fits in memory is the plan.

The search spends a deterministic budget of evaluations; ``time_limit_s`` only stops it early
(then the result can depend on the machine's speed; the log says so).
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

from planner.cluster import ClusterSpec
from planner.cost import Estimate, ProfileSet, estimate
from planner.errors import PlanInfeasible, SpecError
from planner.model import RECOMPUTE_MODES, ModelSpec
from planner.plan import SCHEDULES, Plan
from planner.search.candidate import Candidate, evaluate, to_plan
from planner.search.graph import Unit, make_units, unit_graph
from planner.search.oracle import Oracle, Setting
from planner.search.partition import MetisGraph, chunk, unit_classes
from planner.search.stages import node_kinds, order_stages, seed_numbering, tp_choices, tp_templates

METIS_MAX_UNITS = 2048
TOP_STRUCTURES = 3


@dataclass(frozen=True)
class PlannerConfig:
    """Knobs of the search (the CLI exposes time limit, seed and objective)."""

    time_limit_s: float = 30.0
    seed: int = 0
    objective: str = "throughput"
    micro_batch_sizes: tuple[int, ...] = (1, 2, 4)
    recompute: tuple[str, ...] = RECOMPUTE_MODES
    zero: tuple[int, ...] = (0, 1)
    schedules: tuple[str, ...] = SCHEDULES
    dtype: str = "bf16"
    local_search: bool = True
    max_evaluations: int = 3000
    finalists: int = 3

    def check(self) -> None:
        if self.objective != "throughput":
            raise SpecError("--objective", f"{self.objective!r} is not supported", "use throughput")
        if self.time_limit_s <= 0:
            raise SpecError("--time-limit", f"must be > 0, got {self.time_limit_s}", "give seconds, e.g. 10")
        for r in self.recompute:
            if r not in RECOMPUTE_MODES:
                raise SpecError("recompute", f"{r!r} is not one of {list(RECOMPUTE_MODES)}", "none, selective, full")
        if not self.micro_batch_sizes or min(self.micro_batch_sizes) < 1:
            raise SpecError("micro_batch_sizes", "need positive micro-batch sizes", "e.g. (1, 2, 4)")


@dataclass
class SearchResult:
    plan: Plan
    estimate: Estimate
    candidate: Candidate
    log: list[str] = field(default_factory=list)
    evaluations: int = 0
    elapsed_s: float = 0.0
    cut_short: bool = False


class _Budget(Exception):
    """Raised inside the search when the evaluation budget or the time limit is spent."""


class Search:
    """One planning run (holds the oracle, the budget and the cache of evaluated structures)."""

    def __init__(self, cluster: ClusterSpec, model: ModelSpec, global_batch: int, config: PlannerConfig,
                 profiles: ProfileSet | None = None):
        config.check()
        if global_batch < 1:
            raise SpecError("--global-batch", f"must be >= 1, got {global_batch}", "give the samples per step")
        self.cluster = cluster
        self.model = model
        self.B = global_batch
        self.config = config
        self.profiles = profiles or ProfileSet(cluster.catalog)
        self.oracle = Oracle(cluster, model, self.profiles)
        self.start = time.perf_counter()
        self.deadline = self.start + config.time_limit_s
        self.evaluations = 0
        self.cut_short = False
        self.cache: dict[tuple[object, ...], Candidate] = {}
        self.log: list[str] = []
        self.problems: list[str] = []

    # ------------------------------------------------------------------ evaluation
    def check_budget(self) -> None:
        if self.evaluations >= self.config.max_evaluations:
            raise _Budget
        if time.perf_counter() > self.deadline:
            self.cut_short = True
            raise _Budget

    def evaluate(self, pipelines: Sequence[Sequence[Unit]], s: Setting) -> Candidate:
        key = (tuple(tuple(u.devices for u in p) for p in pipelines), s)
        hit = self.cache.get(key)
        if hit is not None:
            return hit
        self.check_budget()
        self.evaluations += 1
        cand = evaluate(self.oracle, pipelines, s, self.B, explain=len(self.problems) < 5)
        self.cache[key] = cand
        if not cand.feasible and len(self.problems) < 5 and cand.problem:
            self.problems.append(cand.problem)
        return cand

    def light_settings(self) -> list[Setting]:
        """Micro-batch 1, ZeRO-1 when allowed, recompute from lightest to heaviest."""
        zero = 1 if 1 in self.config.zero else 0
        mbs = min(self.config.micro_batch_sizes)
        order = [r for r in ("none", "selective", "full") if r in self.config.recompute]
        sched = "1f1b" if "1f1b" in self.config.schedules else self.config.schedules[0]
        return [Setting(mbs, r, zero, sched, self.config.dtype) for r in order]

    def all_settings(self) -> list[Setting]:
        c = self.config
        return [Setting(mb, r, z, sc, c.dtype) for sc in c.schedules for z in c.zero for r in c.recompute
                for mb in sorted(c.micro_batch_sizes)]

    def score_structure(self, pipelines: Sequence[Sequence[Unit]]) -> Candidate:
        """The structure under the lightest setting that fits."""
        last: Candidate | None = None
        for s in self.light_settings():
            last = self.evaluate(pipelines, s)
            if last.feasible:
                return last
        assert last is not None
        return last

    # ------------------------------------------------------------------ structures
    def k_values(self, n_units: int) -> list[int]:
        top = min(n_units, self.B)
        ks = list(range(1, min(8, top) + 1))
        k = 8.0
        while True:
            k *= 1.25
            if round(k) > top:
                break
            if round(k) not in ks:
                ks.append(round(k))
        if top not in ks:
            ks.append(top)
        return ks

    def structures(self, units: list[Unit], ks: Sequence[int]) -> Iterator[tuple[str, list[list[Unit]]]]:
        classes = unit_classes(self.cluster, units)
        flat = [u for members in classes for u in members]
        graph = MetisGraph(unit_graph(self.cluster, units)) if len(units) <= METIS_MAX_UNITS else None
        compute = [sum(units[u].compute for u in members) for members in classes]
        total = sum(compute)
        for k in ks:
            yield f"striped k={k}", self._ordered([flat[i::k] for i in range(k)], units)
            if graph is not None and 1 < k < len(units):
                parts = graph.part(k, seed=self.config.seed)
                yield f"metis k={k}", self._ordered(parts, units)
                parts_c = graph.part(k, seed=self.config.seed, memory=False)
                if parts_c != parts:
                    yield f"metis-compute k={k}", self._ordered(parts_c, units)
            if len(classes) > 1 and k >= len(classes):
                parts = []
                for members, c in zip(classes, compute):
                    kj = max(1, min(len(members), round(k * c / total)))
                    parts.extend(chunk(members, math.ceil(len(members) / kj)))
                yield f"class k={k}", self._ordered(parts, units)

    def _ordered(self, parts: Sequence[Sequence[int]], units: list[Unit]) -> list[list[Unit]]:
        return [[units[i] for i in order_stages(self.cluster, units, p)] for p in parts if p]

    def sweep(self, template: dict[str, int], ks: Sequence[int] | None, pool: list[Candidate], label: str) -> None:
        units = make_units(self.cluster, template, self.config.dtype)
        for name, pipes in self.structures(units, ks if ks is not None else self.k_values(len(units))):
            cand = self.score_structure(pipes)
            if cand.feasible:
                pool.append(cand)
                self.log.append(f"{label} {name}: {cand.step_s:.4f} s ({cand.setting.label()})")

    # ------------------------------------------------------------------ the run
    def run(self) -> SearchResult:
        pool: list[Candidate] = []
        try:
            uniform = tp_templates(self.cluster, self.model, uniform_only=True)
            for template in uniform:
                self.sweep(template, None, pool, f"tp={_template_label(self.cluster, template)}")
            if pool:
                best = min(pool, key=_rank)
                base = _template_of(best)
                k_best = len(best.pipelines)
                near = sorted({max(1, k_best // 2), max(1, k_best - 1), k_best, k_best + 1, k_best * 2})
                for template in _variations(self.cluster, self.model, base):
                    self.sweep(template, near, pool, f"tp={_template_label(self.cluster, template)}")
        except _Budget:
            self.log.append("structure search stopped by the budget")
        if not pool:
            from planner.search.explain import infeasible

            raise infeasible(self)
        top = _distinct(sorted(pool, key=_rank), TOP_STRUCTURES)
        try:
            for cand in top:
                for s in self.all_settings():
                    c = self.evaluate(cand.pipelines, s)
                    if c.feasible:
                        pool.append(c)
        except _Budget:
            self.log.append("setting sweep stopped by the budget")
        best = min(pool, key=_rank)
        if self.config.local_search:
            from planner.search.local_search import improve

            best = improve(self, best)
            pool.append(best)
        return self.finish(pool)

    def finish(self, pool: list[Candidate]) -> SearchResult:
        """ILP batch split and the full estimate for the finalists; the fastest that fits wins."""
        finalists = _distinct(sorted(pool, key=_rank), self.config.finalists)
        best: tuple[float, Plan, Estimate, Candidate] | None = None
        for cand in finalists:
            refined = evaluate(self.oracle, cand.pipelines, cand.setting, self.B, use_ilp=True)
            for c in (refined, cand):
                if not c.feasible:
                    continue
                plan = seed_numbering(to_plan(c, self.oracle, self.B, self.cluster.name), self.cluster)
                est = estimate(plan, self.cluster, self.profiles)
                self.log.append(f"finalist {len(c.pipelines)} pipelines {c.setting.label()}: surrogate "
                                f"{c.step_s:.4f} s, estimate {est.step_time_s:.4f} s{'' if est.fits else ' (OOM)'}")
                if est.fits and (best is None or est.step_time_s < best[0] - 1e-12):
                    best = (est.step_time_s, plan, est, c)
        if best is None:
            from planner.search.explain import infeasible

            raise infeasible(self)
        _, plan, est, cand = best
        elapsed = time.perf_counter() - self.start
        if self.cut_short:
            self.log.append(f"time limit {self.config.time_limit_s:g} s reached: the result may depend on speed")
        return SearchResult(plan.with_estimate(est.to_dict()), est, cand, self.log, self.evaluations, elapsed,
                            self.cut_short)


def _rank(c: Candidate) -> tuple[float, int]:
    return (c.step_s, len(c.pipelines))


def _distinct(cands: Sequence[Candidate], n: int) -> list[Candidate]:
    out: list[Candidate] = []
    seen: set[tuple[object, ...]] = set()
    for c in cands:
        key = tuple(tuple(u.devices for u in p) for p in c.pipelines)
        if key in seen:
            continue
        seen.add(key)
        out.append(c)
        if len(out) == n:
            break
    return out


def _template_of(cand: Candidate) -> dict[str, int]:
    out: dict[str, int] = {}
    for p in cand.pipelines:
        for u in p:
            out[u.node] = max(out.get(u.node, 0), u.tp)
    return out


def _template_label(cluster: ClusterSpec, template: dict[str, int]) -> str:
    kinds = node_kinds(cluster)
    return ",".join(f"{gpu}:{template[names[0]]}" for (gpu, _), names in kinds.items())


def _variations(cluster: ClusterSpec, model: ModelSpec, base: dict[str, int]) -> list[dict[str, int]]:
    """``base`` with one node kind's TP degree changed (every allowed degree)."""
    out = []
    for (_gpu, gpus), names in node_kinds(cluster).items():
        current = base.get(names[0], 1)
        for t in tp_choices(model, gpus):
            if t != current:
                out.append({**base, **{n: t for n in names}})
    return out


def make_plan(cluster: ClusterSpec, model: ModelSpec, global_batch: int, *, config: PlannerConfig | None = None,
              profiles: ProfileSet | None = None) -> Plan:
    """The best plan found for training ``model`` on ``cluster`` with ``global_batch`` samples per
    step; its :func:`planner.cost.estimate` is embedded (``plan.estimate``). Raises
    :class:`planner.errors.PlanInfeasible` (with the smallest change that would fit) if nothing fits."""
    return search(cluster, model, global_batch, config=config, profiles=profiles).plan


def search(cluster: ClusterSpec, model: ModelSpec, global_batch: int, *, config: PlannerConfig | None = None,
           profiles: ProfileSet | None = None) -> SearchResult:
    """:func:`make_plan` with the search's log, candidate and counters."""
    return Search(cluster, model, global_batch, config or PlannerConfig(), profiles).run()


__all__ = ["PlanInfeasible", "PlannerConfig", "SearchResult", "make_plan", "search"]
