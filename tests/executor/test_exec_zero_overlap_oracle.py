"""The oracle for overlapped ZeRO-1 (executor.parallel.zero, executor.parallel.grad_sync) with small
gradient buckets, so that dozens of reduce-scatters launch one by one from the backward hooks (from
ZB-H1's W ops too) and dozens of weight all-gathers are waited layer by layer in the next forward:
on 2 and 4 gloo ranks, with pipeline stages, TP, ZB-H1 and the chunked loss, every step equals one
dense process on the global batch."""

from __future__ import annotations

from dataclasses import replace

import pytest
from exec_jobs import TINY, make_plan, train_plans
from test_exec_oracle import _reference, check_against_reference

from planner.plan import Plan

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("executor-pool")]

SMALL_BUCKETS = 3000  # elements: ~15 buckets a layer of the tiny model


def _zero1(plan: Plan) -> Plan:
    return replace(plan, options=replace(plan.options, zero=1))


PLANS: dict[str, Plan] = {
    "dp2-zb-uneven": _zero1(make_plan(TINY, [(5, 5, "zb-h1", [(1, 4)]), (3, 1, "1f1b", [(1, 4)])])),
    "pp2-zb-vs-tp2-gpipe": _zero1(make_plan(TINY, [(4, 4, "zb-h1", [(1, 1), (1, 3)]), (4, 2, "gpipe", [(2, 4)])])),
}


@pytest.mark.parametrize("name", list(PLANS))
def test_overlapped_zero1_matches_dense_reference(dist_pool, name: str) -> None:
    plan = PLANS[name]
    batches, ref = _reference(plan.model, plan.global_batch_size)
    [results] = zip(*dist_pool.run(train_plans, [plan], [batches], chunked_loss=True, bucket_numel=SMALL_BUCKETS))
    check_against_reference(plan, list(results), ref)


def test_plans_have_the_ranks_and_asymmetries_claimed() -> None:
    assert sorted(p.world_size for p in PLANS.values()) == [2, 4]
    pipes = [pipe for p in PLANS.values() for pipe in p.pipelines]
    assert {s.tp for pipe in pipes for s in pipe.stages} == {1, 2} and any(len(pipe.stages) > 1 for pipe in pipes)
    assert {pipe.schedule for pipe in pipes} >= {"zb-h1", "1f1b", "gpipe"}
