"""Jobs that run on every rank of a :class:`executor.dist_testing.DistPool` (importable by the
spawned workers), and plan helpers shared by the executor tests."""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

from executor.engine import Engine
from executor.groups import ProcessGroups
from executor.optim import OptimConfig
from executor.topology import build_topology
from planner.model import PRESETS, ModelSpec
from planner.plan import Pipeline, Plan, PlanOptions, Stage

TINY = PRESETS["tiny"]
TINY8 = PRESETS["tiny-8l"]
ORACLE_OPTIM = OptimConfig(lr=1e-3, min_lr=1e-4, warmup_steps=2, total_steps=6, grad_clip=0.5,
                           weight_decay=0.1)


def make_plan(model: ModelSpec, pipes: list[tuple[int, int, str, list[tuple[int, int]]]],
              dtype: str = "fp32") -> Plan:
    """A plan from ``[(batch_size, micro_batches, schedule, [(tp, n_layers), ...]), ...]`` with
    synthetic device ids ``d:0, d:1, ...`` (the executor needs no cluster)."""
    dev = 0
    pipelines = []
    for bs, mb, sched, stages in pipes:
        out, start = [], 0
        for tp, n in stages:
            out.append(Stage(tuple(f"d:{dev + i}" for i in range(tp)), tp, (start, start + n)))
            dev += tp
            start += n
        pipelines.append(Pipeline(bs, mb, tuple(out), sched))
    return Plan(model, sum(p[0] for p in pipes), tuple(pipelines), PlanOptions(dtype=dtype))


def global_batches(model: ModelSpec, batch: int, steps: int, seed: int = 1234, seq: int | None = None
                   ) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    s = (seq or model.seq_len) + 1
    return [torch.randint(0, model.vocab_size, (batch, s), generator=gen) for _ in range(steps)]


def pipeline_rows(plan: Plan, pipeline: int, tokens: torch.Tensor) -> torch.Tensor:
    off = sum(p.batch_size for p in plan.pipelines[:pipeline])
    return tokens[off:off + plan.pipelines[pipeline].batch_size]


def train_plans(plans: list[Plan], batches: list[list[torch.Tensor]], optim: OptimConfig = ORACLE_OPTIM,
                seed: int = 0) -> list[dict[str, Any] | None]:
    """On every rank: train each plan on its batches; per plan, the losses/norms seen by this rank
    and (on rank 0) the gathered logical weights. Ranks beyond a plan's size idle."""
    rank = dist.get_rank()
    out: list[dict[str, Any] | None] = []
    for plan, steps in zip(plans, batches):
        topo = build_topology(plan)
        groups = ProcessGroups.create(topo)
        if rank >= topo.world_size:
            out.append(None)
            continue
        eng = Engine(plan, topo, groups, device=torch.device("cpu"), optim=optim, seed=seed)
        stats = [eng.train_step(pipeline_rows(plan, eng.stage.pipeline, t)) for t in steps]
        state = eng.logical_state_dict(to_all=False)
        out.append({"losses": [s.loss for s in stats], "norms": [s.grad_norm for s in stats],
                    "lrs": [s.lr for s in stats], "state": state if rank == 0 else None})
    return out
