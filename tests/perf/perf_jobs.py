"""Jobs of the performance-path tests (importable by the gloo ranks of tests.support.dist_testing)."""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

from executor.parallel.grad_sync import GradSync
from executor.parallel.groups import ProcessGroups
from executor.train.engine import Engine
from executor.train.optim import OptimConfig
from planner.layout import build_topology
from planner.plan import Plan

OPTIM = OptimConfig(lr=1e-3, min_lr=1e-4, warmup_steps=1, total_steps=4, grad_clip=0.5, eps=1e-6)


def _count_early(sync: GradSync) -> list[int]:
    """Make ``sync.sync`` record how many buckets were launched before it ran (the list it fills)."""
    early: list[int] = []
    inner = sync.sync

    def traced_sync() -> None:
        early.append(len(sync._launched))
        inner()

    sync.sync = traced_sync  # type: ignore[method-assign]
    return early


def overlap_job(plan: Plan, batches: list[torch.Tensor], bucket_numel: int) -> list[dict[str, Any] | None]:
    """Train ``plan`` twice on the same batches: gradient reduction overlapped with backward
    (armed) and all at the end (arming disabled). Per run: losses, shards, and how many buckets
    were already launched when ``sync`` began, per step."""
    rank = dist.get_rank()
    out: list[dict[str, Any] | None] = []
    for armed in (True, False):
        topo = build_topology(plan)
        groups = ProcessGroups.create(topo)
        if rank >= topo.world_size:
            out.append(None)
            continue
        eng = Engine(plan, topo, groups, device=torch.device("cpu"), optim=OPTIM, seed=0)
        sync = GradSync(topo, groups.rank, eng.params, bucket_numel=bucket_numel)  # small buckets: many of them
        sync.attach(groups)
        early = _count_early(sync)
        if not armed:
            sync.arm = lambda expected: None  # type: ignore[method-assign]
        eng.grad_sync = sync
        off = sum(p.batch_size for p in plan.pipelines[:eng.stage.pipeline])
        rows = [t[off:off + plan.pipelines[eng.stage.pipeline].batch_size] for t in batches]
        losses = [eng.train_step(r).loss for r in rows]
        out.append({"losses": losses, "early": early, "buckets": len(sync.order),
                    "shards": {n: p.detach().clone() for n, p in eng.params.items()}})
    return out


def zero_overlap_job(plan: Plan, batches: list[torch.Tensor], bucket_numel: int) -> dict[str, Any] | None:
    """Train ``plan`` under ZeRO-1 with small flat buckets (reduce-scatters launched from the
    backward hooks, weight all-gathers left in flight into the next forward) and under ZeRO-0 (the
    all-reduce, same buckets). Per run: losses, shards; for ZeRO-1 also what overlapped."""
    from dataclasses import replace

    from planner.state_layout import rank_states

    rank = dist.get_rank()
    out: dict[str, Any] = {}
    for zero in (1, 0):
        p = replace(plan, options=replace(plan.options, zero=zero))
        topo = build_topology(p)
        groups = ProcessGroups.create(topo)
        if rank >= topo.world_size:
            return None
        eng = Engine(p, topo, groups, device=torch.device("cpu"), optim=OPTIM, seed=0, bucket_numel=bucket_numel)
        sync = eng.grad_sync
        early = _count_early(sync)
        in_flight: list[int] = []
        off = sum(q.batch_size for q in p.pipelines[:eng.stage.pipeline])
        losses = []
        for t in batches:
            losses.append(eng.train_step(t[off:off + p.pipelines[eng.stage.pipeline].batch_size]).loss)
            if eng.zero is not None:
                in_flight.append(len(eng.zero._gathering))
        run: dict[str, Any] = {"losses": losses, "early": early, "buckets": len(sync.order), "copies": sync.copies,
                               "in_flight": in_flight,
                               "shards": {n: q.detach().clone() for n, q in eng.params.items()}}
        if eng.zero is not None:
            run["parts"] = tuple(q.numel for q in eng.zero.parts)
            run["planned"] = rank_states(p, bucket_numel)[rank].part_sizes
            weights = {w.untyped_storage().data_ptr() for w in eng.zero.weights}
            run["bound"] = all(q.untyped_storage().data_ptr() in weights for q in eng.params.values())
            run["moments"] = eng.optimizer_moments()
        out[f"zero{zero}"] = run
    return out
