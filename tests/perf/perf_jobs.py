"""Jobs of the performance-path tests (importable by the gloo ranks of tests.support.dist_testing)."""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

from executor.engine import Engine
from executor.grad_sync import GradSync
from executor.groups import ProcessGroups
from executor.optim import OptimConfig
from planner.layout import build_topology
from planner.plan import Plan

OPTIM = OptimConfig(lr=1e-3, min_lr=1e-4, warmup_steps=1, total_steps=4, grad_clip=0.5, eps=1e-6)


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
        sync = GradSync(groups, eng.params, bucket_numel=bucket_numel)  # small buckets: many of them
        early: list[int] = []
        inner = sync.sync

        def traced_sync(sync: GradSync = sync, inner: Any = inner, early: list[int] = early) -> None:
            early.append(len(sync._launched))
            inner()

        sync.sync = traced_sync  # type: ignore[method-assign]
        if not armed:
            sync.arm = lambda expected: None  # type: ignore[method-assign]
        eng.grad_sync = sync
        off = sum(p.batch_size for p in plan.pipelines[:eng.stage.pipeline])
        rows = [t[off:off + plan.pipelines[eng.stage.pipeline].batch_size] for t in batches]
        losses = [eng.train_step(r).loss for r in rows]
        out.append({"losses": losses, "early": early, "buckets": len(sync.order),
                    "shards": {n: p.detach().clone() for n, p in eng.params.items()}})
    return out
