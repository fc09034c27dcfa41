"""The oracle on NCCL (skipped without 2 CUDA devices; run on a GPU machine, never in CPU CI).

Same plans and reference as the CPU oracle, but each rank on its own GPU with NCCL: TP 2 inside a
stage, a 2-stage 1F1B pipeline, two pipelines with different batch sizes and schedules, a
checkpoint moved between plans, and a bf16 run. GPU kernels (cuBLAS, SDPA) sum in other orders
than the CPU reference, so fp32 tolerances are 1e-4 relative instead of the CPU oracle's 1e-5.
"""

from __future__ import annotations

import pytest
import torch
from exec_jobs import (
    ORACLE_OPTIM,
    TINY,
    TINY8,
    assemble_pipeline,
    checkpoint_job,
    global_batches,
    make_plan,
    train_plans,
)
from torch.testing import assert_close

from tests.support.dist_testing import DistPool
from tests.support.reference import reference_train

pytestmark = [pytest.mark.gpu, pytest.mark.slow,
              pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.device_count() < 2,
                                 reason="needs 2 CUDA devices")]

PLANS = {
    "tp2": make_plan(TINY8, [(6, 3, "1f1b", [(2, 8)])]),
    "two-stage-1f1b": make_plan(TINY8, [(6, 3, "1f1b", [(1, 3), (1, 5)])]),
    "two-pipelines": make_plan(TINY8, [(2, 1, "gpipe", [(1, 8)]), (4, 3, "1f1b", [(1, 8)])]),
}
RTOL, ATOL = 1e-4, 1e-5


@pytest.fixture(scope="module")
def nccl_pool():
    pool = DistPool(2, timeout=300, backend="nccl", preload=("executor.train.engine", "exec_jobs"))
    yield pool
    pool.close()


def test_nccl_oracle(nccl_pool) -> None:
    batches = global_batches(TINY8, 6, 3)
    ref = reference_train(TINY8, batches, optim=ORACLE_OPTIM)
    plans = list(PLANS.values())
    res = nccl_pool.run(train_plans, plans, [batches] * len(plans), accelerator=True)
    for i, (name, plan) in enumerate(PLANS.items()):
        results = [r[i] for r in res]
        for r in results:
            assert_close(r["losses"], ref.losses, rtol=RTOL, atol=0, msg=f"{name} losses")
            assert_close(r["norms"], ref.grad_norms, rtol=RTOL, atol=0, msg=f"{name} norms")
        for p in range(len(plan.pipelines)):
            rebuilt = assemble_pipeline(plan, results, p)
            for n, want in ref.state.items():
                assert_close(rebuilt[n], want, rtol=RTOL, atol=ATOL, msg=lambda m, n=n, k=name: f"{k} {n}: {m}")
        for n, want in ref.state.items():
            assert_close(results[0]["state"][n], want, rtol=RTOL, atol=ATOL)


def test_nccl_checkpoint_between_plans(nccl_pool, tmp_path) -> None:
    batches = global_batches(TINY, 8, 4, seed=5)
    ref = reference_train(TINY, batches, optim=ORACLE_OPTIM)
    x = make_plan(TINY, [(8, 2, "1f1b", [(1, 1), (1, 3)])])
    y = make_plan(TINY, [(8, 4, "gpipe", [(2, 4)])])
    other = make_plan(TINY8, [(8, 1, "1f1b", [(1, 8)])])
    res = nccl_pool.run(checkpoint_job, x, y, other, batches, 2, str(tmp_path / "ck"), accelerator=True)
    for r in res:
        assert_close(r["losses_x"] + r["losses_y"], ref.losses, rtol=RTOL, atol=0)
    assert "differs in" in res[0]["other_model_error"]  # that plan has one rank


def test_nccl_bf16_tracks_fp32(nccl_pool) -> None:
    from dataclasses import replace

    fp32 = PLANS["two-stage-1f1b"]
    bf16 = replace(fp32, options=replace(fp32.options, dtype="bf16"))
    low = replace(fp32, options=replace(fp32.options, dtype="bf16", residual_dtype="bf16"))  # a bf16 residual
    batches = global_batches(TINY8, 6, 6)
    res = nccl_pool.run(train_plans, [fp32, bf16, low], [batches] * 3, accelerator=True)
    l32, l16, lr16 = res[0][0]["losses"], res[0][1]["losses"], res[0][2]["losses"]
    assert all(torch.isfinite(torch.tensor(l16 + lr16)))
    assert_close(l16, l32, rtol=2e-2, atol=0)
    assert_close(lr16, l32, rtol=2e-2, atol=0)
    assert lr16 != l16  # the residual option is in effect across the pipeline boundary
