"""Cast-once weights (executor.model.cast_once) under ZeRO-1 on 2 gloo ranks, with the GPU path's bf16
autocast forced on CPU: the copies are made after each layer's all-gather gate, so every block and
the head multiply with the current weights at every step, and training follows autocast's casts."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest
import torch
import torch.distributed as dist
from exec_jobs import TINY, global_batches, make_plan, pipeline_rows, pool_engine
from torch.testing import assert_close

from executor.parallel.tp_layers import ColumnParallelLinear, RowParallelLinear
from planner.plan import Plan

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("executor-pool")]

PLAN = make_plan(TINY, [(4, 2, "1f1b", [(1, 4)]), (4, 2, "gpipe", [(1, 4)])])
PLAN = replace(PLAN, options=replace(PLAN.options, zero=1))
STEPS = 3


def cast_once_zero_job(plan: Plan, batches: list[torch.Tensor]) -> dict[str, Any] | None:
    out: dict[str, Any] = {}
    for on in (True, False):
        eng = pool_engine(plan)  # collective over the pool: every rank takes both turns
        if eng is None:
            continue
        assert eng.zero is not None
        eng.autocast_dtype = torch.bfloat16  # the GPU path's numerics, on CPU
        eng.module.cast_once = on
        fresh: list[bool] = []

        def check(mod: torch.nn.Module, _args: Any, fresh: list[bool] = fresh) -> None:
            for lin in mod.modules():
                if isinstance(lin, (ColumnParallelLinear, RowParallelLinear)):
                    lp = lin.weight_lp
                    fresh.append(lp is not None and torch.equal(lp, lin.weight.detach().bfloat16()))

        if on:
            for block in eng.module.layers.values():
                block.register_forward_pre_hook(check)
            assert eng.module.lm_head is not None
            eng.module.lm_head.register_forward_pre_hook(check)
        losses = [eng.train_step(pipeline_rows(plan, eng.stage.pipeline, t)).loss for t in batches]
        eng.drain()
        out["on" if on else "off"] = {"losses": losses, "fresh": fresh,
                                      "copies": eng.module.weight_copies.copies_made}
        groups = eng.groups
        del eng
        groups.close()
    dist.barrier()
    return out or None


def test_copies_follow_the_gathered_weights(dist_pool) -> None:
    res = dist_pool.run(cast_once_zero_job, PLAN, global_batches(TINY, 8, STEPS, seed=11))
    for r in res[:2]:
        assert r is not None
        assert r["on"]["fresh"] and all(r["on"]["fresh"])
        assert r["on"]["copies"] == STEPS * (TINY.num_layers + 1)
        assert r["off"]["copies"] == 0
        assert_close(torch.tensor(r["on"]["losses"]), torch.tensor(r["off"]["losses"]), rtol=2e-2, atol=0)
