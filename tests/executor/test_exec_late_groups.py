"""An engine built before its process groups exist (``Engine(..., groups=None, rank=r)``, then
:meth:`~executor.train.engine.Engine.attach`), as the elastic switch builds the next plan's engine
before that plan's world: it refuses to train until attached, and once attached trains exactly like
one built with its groups — TP and CP groups in the module, sync groups in the gradient buckets,
ZeRO-1's and the replicated gradients' broadcasts, the stage boundaries' p2p."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from exec_jobs import ORACLE_OPTIM, TINY, global_batches, make_plan, train_plans
from torch.testing import assert_close

from executor.train.engine import Engine
from planner.layout import build_topology
from planner.plan import Plan
from tests.support.dist_testing import DistPool


def _zero(plan: Plan) -> Plan:
    return replace(plan, options=replace(plan.options, zero=1))


PLANS = {  # stages are (tp, layers[, cp])
    "tp2-tp1-beside-tp1": make_plan(TINY, [(4, 2, "1f1b", [(2, 2), (1, 2)]), (4, 2, "gpipe", [(1, 4)])]),
    "tp2-vs-tp1x2-zero1": _zero(make_plan(TINY, [(5, 1, "1f1b", [(2, 4)]), (3, 3, "1f1b", [(1, 2), (1, 2)])])),
    "cp2xtp2-beside-tp1-zero1": _zero(make_plan(TINY, [(2, 1, "1f1b", [(2, 4, 2)]), (2, 2, "zb-h1", [(1, 4)])])),
}
STEPS = 2


def test_an_engine_without_groups_refuses_to_train_until_attached() -> None:
    plan = make_plan(TINY, [(2, 1, "1f1b", [(1, 4)])])
    topo = build_topology(plan)
    with pytest.raises(ValueError, match="needs its rank"):
        Engine(plan, topo, None, device=torch.device("cpu"))
    with pytest.raises(ValueError, match="not part of the plan"):
        Engine(plan, topo, None, rank=1, device=torch.device("cpu"))
    eng = Engine(plan, topo, None, rank=0, device=torch.device("cpu"), optim=ORACLE_OPTIM)
    with pytest.raises(RuntimeError, match="no process groups yet"):
        eng.train_step(global_batches(TINY, 2, 1)[0])
    with pytest.raises(RuntimeError, match="no process groups yet"):
        eng.groups  # noqa: B018


@pytest.mark.slow
@pytest.mark.xdist_group("executor-pool")
def test_late_groups_train_exactly_like_early_ones(dist_pool: DistPool) -> None:
    plans = list(PLANS.values())
    batches = [global_batches(TINY, p.global_batch_size, STEPS) for p in plans]
    early = dist_pool.run(train_plans, plans, batches)
    late = dist_pool.run(train_plans, plans, batches, late_groups=True)
    for i, name in enumerate(PLANS):
        for rank, (a, b) in enumerate(zip(early, late)):
            if a[i] is None:
                assert b[i] is None
                continue
            assert (b[i]["losses"], b[i]["norms"]) == (a[i]["losses"], a[i]["norms"]), f"{name} rank {rank}"
            for n, t in a[i]["shards"].items():
                assert_close(b[i]["shards"][n], t, rtol=0, atol=0,
                             msg=lambda m, n=n, r=rank, p=name: f"{p} {r} {n}: {m}")
