"""``make_plan``: the hierarchical planner (graph partitioning + exact refinement + local search).

Algorithm (every step deterministic for a fixed ``seed``):

1. **Units.** For a TP template (one TP degree per node kind, :mod:`.stages`), every node is cut
   into TP groups; each group is a candidate stage (:mod:`.graph`).
2. **Phase 1 — pipelines** (:mod:`.partition`). For each pipeline count ``k`` of a coarse grid
   (powers of two from ``units / L`` up to the unit count or the global batch; then a finer
   grid, ±15..50 %, around the best) these partitions:
   METIS k-way on the unit graph (balanced compute and memory, and compute alone; cut on slow
   links; clusters up to ``METIS_MAX_UNITS`` units), *striped* (the units of every class dealt round-robin, so every
   pipeline gets the same mix of GPU types and the owners of a layer sit on the same nodes), and
   *by class* (each class of identical nodes cut into its own pipelines, ``k`` shared out in
   proportion to the classes' compute) — the hierarchical partition that keeps 8,192-GPU
   clusters cheap: identical pipelines are refined once.
3. **Phase 2 — stages** (:mod:`.stages`): stage order inside each pipeline.
   For sequences longer than :data:`.context.CP_MIN_SEQ` (or when nothing fits), phase A' cuts
   the nodes into context-parallel meshes (``cp`` TP groups a unit) for every uniform template and
   CP degree (:mod:`.context`); the phases after it keep the best structure's CP degree.
4. **Refinement** (:mod:`.layer_split` and :mod:`.batch_split` via :mod:`.candidate`): exact
   layer split per pipeline type and batch / micro-batch split (bisection in the search loop,
   the ILP for the finalists). Structures are first scored at micro-batch size 1, ZeRO-1 if
   allowed and the lightest recompute that fits; the best ``TOP_STRUCTURES`` (one above 64
   devices) are then re-scored under every allowed setting (micro-batch size, recompute
   none/selective/full, ZeRO-0/1, 1F1B/GPipe — GPipe on the best only: its closed-form time and
   its memory are never below 1F1B's).
5. **TP templates**: uniform templates first, then, around the best one, one node kind's TP
   degree changed at a time, at the best pipeline count (above 64 devices with the best
   partitioner only). On small clusters (``ARC_UNITS``) the
   units of the best template, in class order read as a ring, are also cut into every pair (and
   triple) of arcs: unequal pipelines, which balanced partitions and single moves do not reach.
6. **Local search** (:mod:`.local_search`) on the best candidate: move/swap units between
   pipelines, merge/split pipelines, split/merge a stage's TP group, reverse a stage order,
   while the surrogate improves, within the evaluation budget and the time limit.
7. **Finalists**: the best few distinct candidates get the ILP batch split and the full
   :func:`planner.cost.estimate` (on clusters above ``FULL_ESTIMATE_DEVICES`` devices only the
   best one that fits, the estimate's simulator being the slow part there); the fastest one
   that fits in memory is the plan. On small clusters single layers are then moved across stage
   boundaries while the full estimate improves (:func:`.local_search.polish_layers`).
   Each finalist with a multi-stage pipeline also gets a ZB-H1 twin
   (:mod:`.schedule_variant`) and an interleaved-1F1B twin, its pipelines cut into layer chunks
   where they can run them (:mod:`.interleaved_variant`): the surrogate cannot tell either from
   1F1B and the estimate can.

The search spends a deterministic budget of evaluations; ``time_limit_s`` only stops it early
(then the result can depend on the machine's speed; the log says so). The limit is wall time for
the whole search, the finish included: past it, no new structure is scored once one fits, the
finalists skip the ILP, only the first finalist that fits gets the full estimate, and the layer
polish stops; the best plan so far is returned with ``cut_short`` set and a note in the log. The
clock is injectable (``clock``), so the cut is tested without timing anything.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field

from planner.cluster import ClusterSpec
from planner.cost import Estimate, ProfileSet, estimate
from planner.errors import PlanInfeasible, SpecError
from planner.model import ModelSpec
from planner.plan import Plan, PlanOptions
from planner.search.budget import BudgetSpent
from planner.search.candidate import Candidate, evaluate, to_plan
from planner.search.config import PlannerConfig
from planner.search.context import cp_choices, cp_wanted
from planner.search.explain import infeasible
from planner.search.graph import Unit, fast_cluster, make_units, unit_graph
from planner.search.idle import idle_note
from planner.search.interleaved_variant import INTERLEAVED, interleaved_twin, schedules_label
from planner.search.leave_out import leave_out_subsets
from planner.search.local_search import Climb, improve, polish_layers
from planner.search.oracle import Oracle, Setting
from planner.search.partition import MetisGraph, chunk, unit_classes
from planner.search.schedule_variant import ZB_H1, with_zb_h1_twin
from planner.search.stages import node_kinds, order_stages, order_units, seed_numbering, tp_choices, tp_templates
from planner.search.stats import SearchStats

METIS_MAX_UNITS = 512
TOP_STRUCTURES = 2
FINE_K = (0.6, 0.75, 0.85, 1.15, 1.3, 1.5)
ARC_UNITS = 24  # ring splits into 2 pipelines up to this many units
ARC3_UNITS = 12  # and into 3 up to this many
PROGRESS_EVERY_S = 5.0  # a search shorter than this reports nothing
FULL_ESTIMATE_DEVICES = 256  # above this only the best finalist that fits gets the full estimate
SMALL_DEVICES = 64  # up to this many devices the leave-out sweeps try the coarse pipeline-count grid


@dataclass
class SearchResult:
    plan: Plan
    estimate: Estimate
    candidate: Candidate
    log: list[str] = field(default_factory=list)
    evaluations: int = 0
    elapsed_s: float = 0.0
    cut_short: bool = False
    stats: SearchStats = field(default_factory=SearchStats)
    idle: str | None = None  # which devices the plan leaves out and why (:func:`.idle.idle_note`)


@dataclass(frozen=True)
class SearchProgress:
    """What a long search reports every ``PROGRESS_EVERY_S`` seconds (``best_s``: inf while nothing fits)."""

    elapsed_s: float
    evaluations: int
    best_s: float


class Search:
    """One planning run (holds the oracle, the budget and the cache of evaluated structures)."""

    def __init__(self, cluster: ClusterSpec, model: ModelSpec, global_batch: int, config: PlannerConfig,
                 profiles: ProfileSet | None = None, progress: Callable[[SearchProgress], None] | None = None, *,
                 clock: Callable[[], float] = time.perf_counter, started: float | None = None,
                 must_find: bool = True):
        """``progress``: called every ``PROGRESS_EVERY_S`` seconds of a long search; ``clock``: seconds
        (the time limit's clock); ``started``: when the limit began on that clock (default now; the CLI
        passes its own start); ``must_find``: past the limit, keep scoring until one structure fits (a
        plan is always returned when one fits; the relaxed searches of :mod:`.explain` pass False)."""
        config.check()
        if global_batch < 1:
            raise SpecError("--global-batch-size", f"must be >= 1, got {global_batch}", "give the samples per step")
        self.cluster = cluster
        self.model = model
        self.B = global_batch
        self.config = config
        # costed with the residual dtype the plans will carry (planner.search.candidate.to_plan)
        self.profiles = (profiles or ProfileSet(cluster.catalog)).for_options(
            PlanOptions(dtype=config.dtype, residual_dtype=config.residual_dtype, compile=config.compile))
        self.oracle = Oracle(cluster, model, self.profiles)
        self.fast = fast_cluster(cluster)  # same links, faster group queries (for the full estimate)
        self.clock = clock
        self.start = clock() if started is None else started
        self.deadline = self.start + config.time_limit_s
        self.must_find = must_find
        self.found = False  # a feasible candidate exists
        self.best_all = math.inf  # the best surrogate step time of a structure using every device
        self.capped = False  # the batch cap (usable) left units out
        self.evaluations = 0
        self.cut_short = False
        self.cache: dict[tuple[object, ...], Candidate] = {}
        self.log: list[str] = []
        self.problems: list[str] = []
        self.progress = progress
        self.best_s = math.inf  # the fastest feasible candidate's surrogate step time so far
        self.next_note = self.start + PROGRESS_EVERY_S

    # ------------------------------------------------------------------ evaluation
    def check_budget(self) -> None:
        if self.evaluations >= self.config.max_evaluations:
            raise BudgetSpent
        if (self.found or not self.must_find) and self.past_deadline():
            raise BudgetSpent

    def past_deadline(self) -> bool:
        """The time limit is spent (and the search is then cut short)."""
        if self.clock() > self.deadline:
            self.cut_short = True
        return self.cut_short

    def evaluate(self, pipelines: Sequence[Sequence[Unit]], s: Setting) -> Candidate:
        key = (tuple(tuple((u.devices, u.cp) for u in p) for p in pipelines), s)
        hit = self.cache.get(key)
        if hit is not None:
            return hit
        self.check_budget()
        self.evaluations += 1
        self.oracle.stats.candidates += 1
        cand = evaluate(self.oracle, pipelines, s, self.B, explain=len(self.problems) < 5)
        self.cache[key] = cand
        self.found = self.found or cand.feasible
        if cand.feasible and cand.step_s < self.best_all and _devices(cand) == self.cluster.num_devices:
            self.best_all = cand.step_s
        if cand.feasible:
            self.best_s = min(self.best_s, cand.step_s)
        if self.progress is not None and (now := self.clock()) >= self.next_note:
            self.next_note = now + PROGRESS_EVERY_S
            self.progress(SearchProgress(now - self.start, self.evaluations, self.best_s))
        if not cand.feasible and len(self.problems) < 5 and cand.problem:
            self.problems.append(cand.problem)
        return cand

    def light_settings(self) -> list[Setting]:
        """Micro-batch 1, ZeRO-1 when allowed, recompute from lightest to heaviest."""
        zero = 1 if 1 in self.config.zero else 0
        mbs = min(self.config.micro_batch_sizes)
        order = [r for r in ("none", "selective", "full") if r in self.config.recompute]
        sched = "1f1b" if "1f1b" in self.config.schedules else self.config.schedules[0]
        return [Setting(mbs, r, zero, sched, self.config.dtype, self.config.compile) for r in order]

    def all_settings(self) -> list[Setting]:
        c = self.config
        # ZB-H1 and interleaved 1F1B tie 1F1B in the surrogate: the finish prices their twins of each
        # finalist (.schedule_variant, .interleaved_variant)
        return [Setting(mb, r, z, sc, c.dtype, c.compile) for sc in c.schedules
                if sc != INTERLEAVED and (sc != ZB_H1 or "1f1b" not in c.schedules) for z in c.zero
                for r in c.recompute for mb in sorted(c.micro_batch_sizes)]

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
    def k_grid(self, n_units: int) -> list[int]:
        """Coarse pipeline counts: powers of two from the fewest that can hold every unit (a pipeline
        has at most ``L`` stages) to the most (one unit each, or one sample each)."""
        lo = max(1, math.ceil(n_units / self.model.num_layers))
        top = min(n_units, self.B)
        if lo > top:
            return []
        ks, k = [lo], lo
        while k * 2 <= top:
            k *= 2
            ks.append(k)
        if ks[-1] != top:
            ks.append(top)
        return ks

    def structures(self, units: list[Unit], ks: Sequence[int],
                   only: str | None = None) -> Iterator[tuple[str, list[list[Unit]]]]:
        classes = unit_classes(self.cluster, units)
        flat = [u for members in classes for u in members]
        graph = None
        if len(units) <= METIS_MAX_UNITS and only in (None, "metis", "metis-compute"):
            graph = MetisGraph(unit_graph(self.cluster, units))
        compute = [sum(units[u].compute for u in members) for members in classes]
        total = sum(compute)
        for k in ks:
            if only in (None, "striped"):
                yield "striped", self._ordered([flat[i::k] for i in range(k)], units)
            if graph is not None and 1 < k < len(units):
                parts = graph.part(k, seed=self.config.seed)
                if only in (None, "metis"):
                    yield "metis", self._ordered(parts, units)
                if only in (None, "metis-compute"):
                    parts_c = graph.part(k, seed=self.config.seed, memory=False)
                    if parts_c != parts or only == "metis-compute":
                        yield "metis-compute", self._ordered(parts_c, units)
            if len(classes) > 1 and k >= len(classes) and only in (None, "class"):
                parts = []
                for members, c in zip(classes, compute):
                    kj = max(1, min(len(members), round(k * c / total)))
                    parts.extend(chunk(members, math.ceil(len(members) / kj)))
                yield "class", self._ordered(parts, units)

    def arcs(self, template: dict[str, int], pool: list[Candidate], cp: int = 1) -> None:
        """Pipelines as arcs of the units in class order, read as a ring: every choice of 2 cut
        points (3 when there are at most ``ARC3_UNITS`` units); clusters up to ``ARC_UNITS`` units."""
        units = self.usable(make_units(self.cluster, template, self.config.dtype, cp))
        n = len(units)
        if n > ARC_UNITS or n < 2:
            return
        flat = [units[u] for members in unit_classes(self.cluster, units) for u in members]
        for k in (2, 3) if n <= ARC3_UNITS else (2,):
            for cuts in itertools.combinations(range(n), k):
                parts = [flat[a:b] for a, b in zip(cuts, cuts[1:])] + [flat[cuts[-1]:] + flat[:cuts[0]]]
                pipes = [order_units(self.cluster, p) for p in parts]
                if any(len(p) > self.model.num_layers for p in pipes):
                    continue
                cand = self.score_structure(pipes)
                cand.origin = ("arc", template, cp)
                if cand.feasible:
                    pool.append(cand)
        best = min(pool, key=_rank)
        self.log.append(f"after ring splits: {len(best.pipelines)} pipelines, {best.step_s:.4f} s")

    def leave_out(self, pool: list[Candidate]) -> None:
        """Sweep the best template on the cluster without each node kind (GPU type and count) and
        without each node group, every partitioner; the coarse pipeline-count grid up to
        ``SMALL_DEVICES`` devices, else the best count scaled to the devices kept, halved and
        doubled. :meth:`idle_note` explains the devices a plan leaves out."""
        subsets = leave_out_subsets(self.cluster)
        if not subsets:
            return
        best = min(pool, key=_rank)
        _, template, cp = best.origin
        k_best = len(best.pipelines)
        for label, nodes in subsets:
            kept = self.cluster.num_devices - sum(self.cluster.node(n).gpus for n in nodes)
            ks = None
            if self.cluster.num_devices > SMALL_DEVICES:
                k = max(1, round(k_best * kept / self.cluster.num_devices))
                ks = sorted({max(1, k // 2), k, k * 2})
            self.sweep(template, ks, pool, f"without {label}", leave_out=nodes, cp=cp)

    def usable(self, units: list[Unit]) -> list[Unit]:
        """All units, unless the batch cannot use them all: at most ``B`` pipelines of at most ``L``
        stages each; then the ``B·L`` units with the most compute (re-indexed, node order kept)."""
        cap = self.B * self.model.num_layers
        if len(units) <= cap:
            return units
        keep = sorted(sorted(units, key=lambda u: (-u.compute, u.index))[:cap], key=lambda u: u.index)
        self.capped = True
        if not any("leaves devices idle" in line for line in self.log):
            self.log.append(f"global batch {self.B} x {self.model.num_layers} layers leaves devices idle: "
                            f"planning on the {cap} fastest stage groups")
        return [dataclasses.replace(u, index=j) for j, u in enumerate(keep)]

    def _ordered(self, parts: Sequence[Sequence[int]], units: list[Unit]) -> list[list[Unit]]:
        return [[units[i] for i in order_stages(self.cluster, units, p)] for p in parts if p]

    def sweep(self, template: dict[str, int], ks: Sequence[int] | None, pool: list[Candidate], label: str,
              only: str | None = None, leave_out: frozenset[str] = frozenset(), cp: int = 1) -> None:
        """Score the structures of ``template`` (``leave_out``: nodes whose units are not used; ``cp``:
        the nodes cut into CP meshes of ``cp`` TP groups, :func:`.graph.make_units`)."""
        units = make_units(self.cluster, template, self.config.dtype, cp)
        if leave_out:
            units = [dataclasses.replace(u, index=j) for j, u in enumerate(u for u in units if u.node not in leave_out)]
        units = self.usable(units)
        for name, pipes in self.structures(units, ks if ks is not None else self.k_grid(len(units)), only):
            cand = self.score_structure(pipes)
            cand.origin = (name, template, cp)
            if cand.feasible:
                pool.append(cand)
                self.log.append(f"{label} {name} k={len(pipes)}: {cand.step_s:.4f} s ({cand.setting.label()})")

    # ------------------------------------------------------------------ the run
    def run(self, start: Sequence[Sequence[Unit]] | None = None) -> SearchResult:
        """The search; ``start`` (pipelines of units, e.g. the running plan's structure on a changed
        device set) is scored first and stays in the pool, so the result is never worse than it
        under the search's surrogate (a warm start, :mod:`planner.replan`)."""
        pool: list[Candidate] = []
        if start:
            cand = self.score_structure([order_units(self.cluster, p) for p in start])
            cand.origin = ("warm", _template_of(cand), 1)
            if cand.feasible:
                pool.append(cand)
                self.log.append(f"warm start {len(start)} pipelines: {cand.step_s:.4f} s ({cand.setting.label()})")
        try:
            # A: every uniform TP template, every partitioner, a coarse grid of pipeline counts
            for template in tp_templates(self.cluster, self.model, uniform_only=True):
                self.sweep(template, None, pool, f"tp={_template_label(self.cluster, template)}")
            # A': long sequences (or nothing fits): the uniform templates as CP meshes (.context)
            if cp_wanted(self.model, self.config.context_parallel, bool(pool)):
                self.context_parallel(pool)
            if pool:
                # B: finer pipeline counts around the best, with its template and partitioner
                best = min(pool, key=_rank)
                name, template, cp = best.origin
                k_best = len(best.pipelines)
                fine = sorted({max(1, round(k_best * f)) for f in FINE_K} - {k_best})
                self.sweep(template, fine, pool, f"{_label(self.cluster, template, cp)} (finer k)", name, cp=cp)
                # B': small clusters: every split of the unit ring into 2 (or 3) arcs, which gives
                # unequal pipelines (a big one and a small one) that single moves cannot reach
                best = min(pool, key=_rank)
                name, template, cp = best.origin
                self.arcs(template, pool, cp)
                # C: one node kind's TP degree changed at a time, at the best pipeline count
                best = min(pool, key=_rank)
                name, template, cp = best.origin
                k_best = len(best.pipelines)
                only = name if self.cluster.num_devices > 64 else None  # large: the best partitioner only
                for variant in _variations(self.cluster, self.model, template):
                    self.sweep(variant, [k_best], pool, _label(self.cluster, variant, cp), only, cp=cp)
                # L: leave out one node kind or node group at a time (a slow link or slow GPUs can
                # slow the whole job down), with the best template
                self.leave_out(pool)
        except BudgetSpent:
            self.log.append("structure search stopped by the budget")
        if not pool:
            raise self.infeasible()
        # D: every setting for the best structures; with CP searched, the best TP-only ones too: a CP
        # structure's lead at the light settings can vanish under heavier ones (recompute, larger
        # micro-batches), which TP-only structures need to fit long sequences
        n_top = TOP_STRUCTURES if self.cluster.num_devices <= 64 else 1
        top = _distinct(sorted(pool, key=_rank), n_top)
        if any(_uses_cp(c) for c in top):
            top += _distinct(sorted((c for c in pool if not _uses_cp(c)), key=_rank), n_top)
        try:
            for i, cand in enumerate(top):
                for st in self.all_settings():
                    if i > 0 and st.schedule != "1f1b":
                        continue  # GPipe never beats 1F1B in time or memory under the closed forms
                    c = self.evaluate(cand.pipelines, st)
                    if c.feasible:
                        pool.append(c)
        except BudgetSpent:
            self.log.append("setting sweep stopped by the budget")
        best = min(pool, key=_rank)
        self.log.append(f"best before local search: {len(best.pipelines)} pipelines, {best.setting.label()}, "
                        f"{best.step_s:.4f} s")
        # E: local search
        if self.config.local_search:
            climb = Climb(self.cluster, self.model, self.config.seed, self.evaluate, lambda: self.evaluations,
                          self.log)
            best = improve(climb, best)
            pool.append(best)
        return self.finish(pool)

    def context_parallel(self, pool: list[Candidate]) -> None:
        """Phase A': every uniform TP template with every CP degree whose ``cp x tp`` mesh fits the
        largest node (:func:`.context.cp_choices`), the coarse pipeline-count grid, every partitioner."""
        top = max(n.gpus for n in self.cluster.nodes)
        for template in tp_templates(self.cluster, self.model, uniform_only=True):
            for cp in cp_choices(self.model, max(template.values()), top):
                self.sweep(template, None, pool, _label(self.cluster, template, cp), cp=cp)

    def infeasible(self) -> PlanInfeasible:
        """Nothing fits: the error naming the smallest change that would (:mod:`.explain`)."""
        def step_time_with(config: PlannerConfig) -> float:
            return Search(self.cluster, self.model, self.B, config, self.profiles, clock=self.clock,
                          started=self.start, must_find=False).run().estimate.step_time_s

        return infeasible(cluster=self.cluster, model=self.model, global_batch=self.B, config=self.config,
                          oracle=self.oracle, problems=self.problems, solve=step_time_with)

    def finish(self, pool: list[Candidate]) -> SearchResult:
        """ILP batch split for the finalists, then the full estimate, best surrogate first, until
        one fits (all of them on small clusters); the fastest estimate that fits wins."""
        finalists = _distinct(sorted(pool, key=_rank), self.config.finalists)
        if all(_uses_cp(c) for c in finalists):  # the surrogate may misrank CP against TP: the best TP-only too
            finalists += _distinct(sorted((c for c in pool if not _uses_cp(c)), key=_rank), 1)
        refined = []
        for cand in finalists:
            if self.past_deadline():  # the bisection's batch split stands
                refined.append(cand)
                continue
            r = evaluate(self.oracle, cand.pipelines, cand.setting, self.B, use_ilp=True)
            refined.append(r if r.feasible and r.step_s <= cand.step_s else cand)
        refined.sort(key=_rank)
        small = self.cluster.num_devices <= FULL_ESTIMATE_DEVICES
        best: tuple[float, Plan, Estimate, Candidate] | None = None
        for r in refined:
            if not r.feasible:
                continue
            twins = [*with_zb_h1_twin(self.oracle, r, self.config.schedules, self.B, both=small)]
            il = interleaved_twin(self.oracle, r, self.config.schedules)
            for c in twins + ([il] if il is not None else []):  # interleaved last: the surrogate ties it
                plan = seed_numbering(to_plan(c, self.oracle, self.B, self.cluster.name), self.cluster)
                est = estimate(plan, self.fast, self.profiles)
                self.oracle.stats.estimates += 1
                self.log.append(f"finalist {len(c.pipelines)} pipelines {schedules_label(c)}: surrogate "
                                f"{c.step_s:.4f} s, estimate {est.step_time_s:.4f} s{'' if est.fits else ' (OOM)'}")
                if est.fits and (best is None or est.step_time_s < best[0] - 1e-12):
                    best = (est.step_time_s, plan, est, c)
                if best is not None and (not small or self.past_deadline()):
                    break
            if best is not None and (not small or self.past_deadline()):
                break
        if best is None:
            raise self.infeasible()
        _, plan, est, cand = best
        if self.config.polish:
            plan, est = polish_layers(plan, est, cluster=self.fast, profiles=self.profiles, log=self.log,
                                      stats=self.oracle.stats, stop=self.past_deadline)
        note = idle_note(self.cluster, plan, structure={d for p in cand.pipelines for u in p for d in u.devices},
                         capped=self.capped, best_all_s=self.best_all, chosen_s=cand.step_s, global_batch=self.B)
        if note:
            self.log.append(note)
        elapsed = self.clock() - self.start
        if self.cut_short:
            self.log.append(f"time limit {self.config.time_limit_s:g} s reached: the search was cut short and "
                            "this is the best plan found so far (it may depend on the machine's speed)")
        return SearchResult(plan.with_estimate(est.to_dict()), est, cand, self.log, self.evaluations, elapsed,
                            self.cut_short, self.oracle.stats, note)


def _devices(c: Candidate) -> int:
    return sum(len(u.devices) for lay in c.layouts for u in lay.units)


def _uses_cp(c: Candidate) -> bool:
    return any(u.cp > 1 for p in c.pipelines for u in p)


def _rank(c: Candidate) -> tuple[float, int]:
    return (c.step_s, len(c.pipelines))


def _distinct(cands: Sequence[Candidate], n: int) -> list[Candidate]:
    out: list[Candidate] = []
    seen: set[tuple[object, ...]] = set()
    for c in cands:
        key = tuple(tuple((u.devices, u.cp) for u in p) for p in c.pipelines)
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


def _label(cluster: ClusterSpec, template: dict[str, int], cp: int) -> str:
    return f"tp={_template_label(cluster, template)}" + (f" cp={cp}" if cp > 1 else "")


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
           profiles: ProfileSet | None = None, start: Sequence[Sequence[Unit]] | None = None,
           progress: Callable[[SearchProgress], None] | None = None,
           clock: Callable[[], float] = time.perf_counter, started: float | None = None) -> SearchResult:
    """:func:`make_plan` with the search's log, candidate and counters (``start``: see :meth:`Search.run`;
    ``progress`` is called every ``PROGRESS_EVERY_S`` seconds of a long search; ``clock`` and
    ``started``: the time limit's clock and start, see :class:`Search`)."""
    return Search(cluster, model, global_batch, config or PlannerConfig(), profiles, progress, clock=clock,
                  started=started).run(start)


__all__ = ["PlanInfeasible", "PlannerConfig", "Search", "SearchProgress", "SearchResult", "make_plan", "search"]
