"""The plans :mod:`benchmarks.executor.long_context` measures, and which of them it runs.

Four one-GPU nodes ``g0..g3`` (the fidelity worker's device names). Besides the planner's own plan,
fixed layouts of every sequence whole on one micro-batch of one sequence:

* without context parallelism (``cp = 1``, "TP-only" in the issue's words): ``tp4``, ``tp2xdp2``,
  ``tp2xpp2``, ``pp4`` and ``dp4`` (the strongest such layout when full recompute makes it fit);
* with it: ``cp4`` (tp 1) and ``cp2xtp2`` (``Stage(..., cp=...)``, TP innermost).

Each layout takes the least recompute that the cost model says fits the card with ``HEADROOM`` to
spare (``none``, then ``selective``, then ``full``); a layout that needs recompute also gets a row
without it, reported "predicted OOM, not run" (or "predicted within 5 % of memory, not run"). Such a
plan is never started: on NCCL, an OOM on some ranks of a plan (a pipeline's first stage) leaves
the others waiting in a collective until the worker's 300 s timeout, which one 5-minute call cannot
afford; the headroom is the memory model's tolerance (never under by more than 5 %, benchmarks/
README.md). An OOM the estimate did not see is still caught and recorded as "OOM (measured)". The
planner's own plan runs as the planner made it.

Then the GPU-time budget (:func:`within_budget`): plans in priority order — the planner's, the CP
layouts, the no-CP layouts fastest predicted first — each costing ``(warmup + steps) x predicted
step + PLAN_OVERHEAD_S``; those past the budget are "skipped: over --budget-s". The slowest
predicted no-CP plans go first: they cannot be the best no-CP plan the summary compares against.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from planner.model import RECOMPUTE_MODES, ModelSpec
from planner.plan import Pipeline, Plan, PlanOptions, Stage

N = 4
DEVS = tuple(f"g{k}:0" for k in range(N))
# per plan, besides its steps: process groups, the engine's build (weights on the GPU), 64K-token rows
PLAN_OVERHEAD_S = 10.0
HEADROOM = 0.05  # of the card's memory a hand-written plan must leave free to be run
PREDICTED_OOM = "predicted OOM, not run"
PREDICTED_TIGHT = f"predicted within {HEADROOM:.0%} of memory, not run"


@dataclass(frozen=True)
class Layout:
    """``dp`` pipelines of ``pp`` stages, each stage a ``cp x tp`` mesh of devices in order."""

    name: str
    dp: int = 1
    pp: int = 1
    tp: int = 1
    cp: int = 1

    @property
    def devices(self) -> int:
        return self.dp * self.pp * self.tp * self.cp


CP_LAYOUTS = (Layout("cp4", cp=4), Layout("cp2xtp2", tp=2, cp=2))
TP_LAYOUTS = (Layout("tp4", tp=4), Layout("tp2xdp2", dp=2, tp=2), Layout("tp2xpp2", pp=2, tp=2),
              Layout("pp4", pp=4), Layout("dp4", dp=4))


def layout_plan(model: ModelSpec, layout: Layout, global_batch: int, recompute: str) -> Plan:
    """``layout`` on ``g0..g3``: layers split evenly (the first stages take the remainder), each
    pipeline's ``global_batch / dp`` sequences in micro-batches of one, ZeRO-1 as the planner's plans."""
    it = iter(DEVS)
    n = model.num_layers
    pipes = []
    for _ in range(layout.dp):
        stages, lo = [], 0
        for s in range(layout.pp):
            k = n // layout.pp + (1 if s < n % layout.pp else 0)
            devs = tuple(next(it) for _ in range(layout.tp * layout.cp))
            stages.append(Stage(devs, layout.tp, (lo, lo + k), layout.cp))
            lo += k
        batch = global_batch // layout.dp
        pipes.append(Pipeline(batch, batch, tuple(stages)))
    return Plan(model, global_batch, tuple(pipes), PlanOptions(recompute=recompute, zero=1))


def describe(plan: Plan) -> dict[str, Any]:
    """The table's layout columns: cp / tp per stage (``2,1``), pipelines, stages, recompute."""
    stages = [s for p in plan.pipelines for s in p.stages]
    return {"cp": ",".join(str(s.cp) for s in plan.pipelines[0].stages),
            "tp": ",".join(str(s.tp) for s in plan.pipelines[0].stages), "dp": len(plan.pipelines),
            "pp": len(plan.pipelines[0].stages), "uses_cp": any(s.cp > 1 for s in stages),
            "recompute": plan.options.recompute}


@dataclass(frozen=True)
class Candidate:
    """One row before the run: a plan, its estimate, and whether it is run (``status`` empty) or why not."""

    name: str
    plan: Plan
    source: str  # planner | cp | no-cp
    predicted_s: float
    predicted_peak_gib: float
    capacity_gib: float
    status: str = ""  # "": to run; else why it is not run


def predictor(cluster: Any, profiles: Any) -> Any:
    """``predict(plan)`` for :func:`ladder`: the cost model's step time, peak and capacity (GiB) and
    whether it says some device runs out of memory, as ``hexiscale estimate`` prices the plan."""
    from planner.cost import estimate

    def predict(plan: Plan) -> tuple[float, float, float, bool]:
        est = estimate(plan, cluster, profiles)
        return est.step_time_s, max(est.memory_gib.values()), min(est.capacity_gib.values()), bool(est.oom)
    return predict


def ladder(model: ModelSpec, layout: Layout, global_batch: int, predict: Any) -> list[Candidate]:
    """The layout with the least recompute that fits with ``HEADROOM`` (module docstring), and its
    no-recompute row, not run, when that does not; every row not run when none fits.
    ``predict(plan) -> (step s, peak GiB, capacity GiB, over: the estimate's OOM)``."""
    source = "cp" if layout.cp > 1 else "no-cp"
    out: list[Candidate] = []
    for mode in RECOMPUTE_MODES:
        plan = layout_plan(model, layout, global_batch, mode)
        step, peak, cap, over = predict(plan)
        name = layout.name if mode == "none" else f"{layout.name}-{mode}"
        status = PREDICTED_OOM if over else PREDICTED_TIGHT if peak > (1 - HEADROOM) * cap else ""
        row = Candidate(name, plan, source, step, peak, cap, status)
        if not status:
            return out + [row]
        if mode in ("none", RECOMPUTE_MODES[-1]):  # a middle rung that does not fit says nothing more
            out.append(row)
    return out


def within_budget(rows: list[Candidate], runs_per_plan: int, budget_s: float) -> list[Candidate]:
    """Mark the rows to run past ``budget_s`` of predicted GPU time "skipped: over --budget-s"
    (module docstring; the first row to run always runs). Rows keep their order."""
    rank = {"planner": 0, "cp": 1, "no-cp": 2}
    todo = sorted((r for r in rows if not r.status), key=lambda r: (rank[r.source], r.predicted_s))
    spent, keep = 0.0, set[str]()
    for r in todo:
        cost = runs_per_plan * r.predicted_s + PLAN_OVERHEAD_S
        if keep and spent + cost > budget_s:
            continue
        spent += cost
        keep.add(r.name)
    return [r if r.status or r.name in keep else replace(r, status=f"skipped: over --budget-s {budget_s:g}")
            for r in rows]


def same_layout(a: Plan, b: Plan) -> bool:
    """Two plans that train alike (the planner's may equal a fixed layout: it is then run once)."""
    return a.pipelines == b.pipelines and a.options == b.options and a.global_batch_size == b.global_batch_size


def cp_refusal() -> str | None:
    """None when the executor can lay out a cp plan's ranks, else why not, in one line. The executor
    builds its groups from :func:`planner.layout.build_topology`; until it knows ``cp`` the topology
    holds one TP group per stage and leaves the other cp slots' ranks out (those ranks would fail
    while the rest wait in a collective), so a cp plan is not started. A refusal by the executor
    itself, once past this check, is recorded as the plan's error."""
    from planner.layout import build_topology

    model = smoke_model(64)
    probe = Plan(model, 2, (Pipeline(2, 2, (Stage(("a:0", "a:1"), 1, (0, model.num_layers), 2),)),))
    try:
        topo = build_topology(probe)
    except Exception as exc:  # noqa: BLE001 - any refusal means: not yet
        return f"the executor's layout refuses cp: {str(exc).strip().splitlines()[0][:160]}"
    ranks = {r for pipe in topo.pipelines for st in pipe for r in st.ranks}
    if topo.world_size != probe.world_size or len(ranks) != probe.world_size:
        return (f"the executor's layout (planner.layout.build_topology) places {len(ranks)} of a cp=2 stage's "
                f"{probe.world_size} ranks: it does not train cp yet")
    return None


def smoke_model(seq_len: int) -> ModelSpec:
    from planner.model import PRESETS

    return replace(PRESETS["tiny-8l"], seq_len=seq_len)
