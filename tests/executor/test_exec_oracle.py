"""THE ORACLE: asymmetric plans on <= 8 gloo ranks train exactly like one dense process.

For every plan: 3 AdamW steps (LR warm-up and gradient clipping both active) on the same global
batches as the dense reference; the loss and gradient norm of every step (on every rank) and the
final weights of *every* pipeline (rebuilt from the ranks' shards) and the gathered
``logical_state_dict`` must match the reference (rtol 1e-5).
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

import pytest
import torch
from exec_jobs import ORACLE_OPTIM, TINY, TINY8, assemble_pipeline, global_batches, make_plan, train_plans
from torch.testing import assert_close

from planner.model import ModelSpec
from planner.plan import Plan, load_plan
from tests.support.dist_testing import DistPool
from tests.support.reference import ReferenceRun, reference_train

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("executor-pool")]

ROOT = Path(__file__).resolve().parents[2]
STEPS = 3
# Weights are O(0.02..1) and one AdamW step moves an element by ~lr = 1e-3. AdamW divides by
# sqrt(v) + eps: for elements whose gradient is ~1e-9 (cancellation) fp32 summation-order noise
# would be amplified, so the oracle uses eps = 1e-6 (ORACLE_OPTIM) and an absolute tolerance of
# 0.2% of one step (a real bug — a missing or doubled contribution — moves elements by a whole step).
W_ATOL = 2e-6


def _demo_plan() -> Plan:
    return load_plan(ROOT / "examples" / "plans" / "demo-cpu-6-tiny.json")


def _with(plan: Plan, **options: str) -> Plan:
    from dataclasses import replace
    return replace(plan, options=replace(plan.options, **options))


# (id, plan): TP 1/2/4 mixes inside a pipeline, different stage counts and layer splits, uneven batch
# sizes, different and uneven micro-batch counts, 1F1B and GPipe, fewer micro-batches than stages.
PLANS: dict[str, Plan] = {
    "single-rank": make_plan(TINY, [(4, 2, "1f1b", [(1, 4)])]),
    "demo-cpu-6-file": _demo_plan(),
    "tp4-2-1-pipeline-uneven-mb": make_plan(TINY8, [(6, 4, "1f1b", [(4, 3), (2, 3), (1, 2)])]),
    "tp1-4-gpipe": make_plan(TINY8, [(4, 4, "gpipe", [(1, 2), (4, 6)])]),
    "tp4-vs-tp2x2-gpipe": make_plan(TINY8, [(5, 1, "1f1b", [(4, 8)]), (3, 3, "gpipe", [(2, 5), (2, 3)])]),
    "three-pipelines-mixed": make_plan(TINY8, [(4, 2, "1f1b", [(2, 4), (1, 4)]), (1, 1, "1f1b", [(1, 8)]),
                                               (3, 3, "gpipe", [(1, 2), (1, 3), (1, 3)])]),
    "tp4-vs-tp1-uneven": make_plan(TINY8, [(2, 2, "1f1b", [(4, 8)]), (6, 4, "1f1b", [(1, 1), (1, 7)])]),
    "four-pipelines-batches-1-2-3-4": make_plan(TINY, [(1, 1, "1f1b", [(1, 4)]), (2, 2, "gpipe", [(1, 4)]),
                                                       (3, 3, "1f1b", [(1, 4)]), (4, 2, "1f1b", [(1, 4)])]),
    "deep-1f1b-many-mb": make_plan(TINY8, [(7, 7, "1f1b", [(1, 2), (1, 2), (1, 2), (1, 2)]),
                                           (1, 1, "1f1b", [(2, 6), (2, 2)])]),
    "tp4-1-2-1-fewer-mb-than-stages": make_plan(TINY8, [(3, 2, "1f1b", [(4, 1), (1, 3), (2, 2), (1, 2)])]),
    "bf16-on-cpu-runs-fp32": _with(make_plan(TINY, [(3, 2, "1f1b", [(2, 4)]), (2, 2, "gpipe", [(1, 1), (1, 3)])]),
                                   dtype="bf16"),
    "full-recompute": _with(make_plan(TINY, [(2, 2, "1f1b", [(1, 2), (2, 2)]), (3, 2, "1f1b", [(2, 4)])]),
                            recompute="full"),
    "selective-recompute-gpipe": _with(make_plan(TINY8, [(4, 3, "gpipe", [(2, 3), (4, 5)]),
                                                         (2, 2, "1f1b", [(1, 8)])]), recompute="selective"),
}


@functools.cache
def _reference(model: ModelSpec, batch: int) -> tuple[list[torch.Tensor], ReferenceRun]:
    batches = global_batches(model, batch, STEPS)
    return batches, reference_train(model, batches, optim=ORACLE_OPTIM)


def check_against_reference(plan: Plan, results: list, ref: ReferenceRun) -> None:
    n = plan.world_size
    assert all(r is not None for r in results[:n]) and all(r is None for r in results[n:])
    for rank, r in enumerate(results[:n]):
        assert_close(r["losses"], ref.losses, rtol=1e-5, atol=0, msg=f"losses on rank {rank}")
        assert_close(r["norms"], ref.grad_norms, rtol=1e-5, atol=0, msg=f"grad norms on rank {rank}")
        assert r["lrs"] == ref.lrs
    # warm-up and clipping were both active
    assert ref.lrs[0] < ref.lrs[1] and min(ref.grad_norms) > ORACLE_OPTIM.grad_clip
    gathered = results[0]["state"]
    assert set(gathered) == set(ref.state)
    for name, want in ref.state.items():
        assert_close(gathered[name], want, rtol=1e-5, atol=W_ATOL, msg=lambda m, n=name: f"gathered {n}: {m}")
    for p in range(len(plan.pipelines)):
        rebuilt = assemble_pipeline(plan, results[:n], p)
        for name, want in ref.state.items():
            assert_close(rebuilt[name], want, rtol=1e-5, atol=W_ATOL,
                         msg=lambda m, n=name, p=p: f"pipeline {p} {n}: {m}")


def run_oracle(dist_pool: DistPool, plan: Plan) -> list[Any]:
    """Train ``plan`` on the pool, check it against the dense reference; the ranks' results."""
    assert plan.world_size <= 8
    batches, ref = _reference(plan.model, plan.global_batch_size)
    [results] = zip(*dist_pool.run(train_plans, [plan], [batches]))
    check_against_reference(plan, list(results), ref)
    return list(results)


@pytest.mark.parametrize("name", list(PLANS))
def test_oracle(dist_pool, name: str) -> None:
    plan = PLANS[name]
    results = run_oracle(dist_pool, plan)
    assert results[0]["tokens"] == [plan.global_batch_size * plan.model.seq_len] * STEPS


@pytest.mark.parametrize("name", ["tp4-2-1-pipeline-uneven-mb", "tp4-vs-tp2x2-gpipe"])
def test_oracle_chunked_loss(dist_pool, name: str) -> None:
    """The cross-entropy in row chunks (executor.model.chunked_loss, TP 4 and 2 last stages) trains like
    the dense reference too."""
    plan = PLANS[name]
    batches, ref = _reference(plan.model, plan.global_batch_size)
    [results] = zip(*dist_pool.run(train_plans, [plan], [batches], chunked_loss=True))
    check_against_reference(plan, list(results), ref)


def test_plans_cover_the_matrix() -> None:
    """The plan set really has the asymmetries the oracle claims to cover."""
    tps_in_pipe = [{s.tp for s in p.stages} for plan in PLANS.values() for p in plan.pipelines]
    assert {1, 2, 4} <= set().union(*tps_in_pipe) and any(len(t) >= 3 for t in tps_in_pipe)
    multi = [pl for pl in PLANS.values() if len(pl.pipelines) > 1]
    assert any(len({len(p.stages) for p in pl.pipelines}) > 1 for pl in multi)
    assert any(len({p.batch_size for p in pl.pipelines}) > 1 for pl in multi)
    assert any(len({p.micro_batches for p in pl.pipelines}) > 1 for pl in multi)
    assert any(len(set(p.micro_batch_sizes())) > 1 for pl in PLANS.values() for p in pl.pipelines)
    assert {p.schedule for pl in PLANS.values() for p in pl.pipelines} == {"1f1b", "gpipe"}
    assert any(p.micro_batches < len(p.stages) for pl in PLANS.values() for p in pl.pipelines)
    assert len(PLANS) >= 12


def test_oracle_tp_4_2_1_4_boundaries_on_11_ranks() -> None:
    """Stage boundaries TP 4 -> 2 -> 1 -> 4 in one pipeline (11 ranks, its own short-lived pool)
    next to a second pipeline with one tp-1 stage."""
    from tests.support.dist_testing import run_distributed

    plan = make_plan(TINY8, [(5, 3, "1f1b", [(4, 2), (2, 2), (1, 2), (4, 2)]), (2, 2, "gpipe", [(1, 8)])])
    assert [s.tp for s in plan.pipelines[0].stages] == [4, 2, 1, 4]
    batches, ref = _reference(plan.model, plan.global_batch_size)
    res = run_distributed(train_plans, plan.world_size, [plan], [batches], timeout=240,
                          preload=("executor.train.engine", "exec_jobs"))
    check_against_reference(plan, [r[0] for r in res], ref)
