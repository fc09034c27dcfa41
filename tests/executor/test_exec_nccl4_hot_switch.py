"""Hot switching on 4 NCCL ranks (skipped without 4 CUDA devices; ``make test-gpu`` runs it): the
CPU oracle's pool (TP 2 | PP 2 home, TP 4 and DP 4 with ranks in other orders) and steps, on one
GPU per rank. fp32 with fp32 transfers equals the dense single-process update at the NCCL
tolerances of :mod:`test_exec_nccl4`; bf16 plans with working weights sent in bf16 (what the
benchmark runs) track it within bf16 tolerance."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace

import pytest
import torch
from exec_jobs import ORACLE_OPTIM, TINY8, global_docs, train_hot_switch
from test_exec_hot_switch import DP4, HOME, STRATEGIES, TP4
from torch.testing import assert_close

from planner.plan import Plan
from planner.varlen.step_layout import plan_step
from tests.support.dist_testing import DistPool
from tests.support.reference import reference_train

pytestmark = [pytest.mark.gpu, pytest.mark.slow,
              pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.device_count() < 4,
                                 reason="needs 4 CUDA devices")]

RTOL, ATOL = 1e-4, 1e-5


@pytest.fixture(scope="module")
def nccl4() -> Iterator[DistPool]:
    pool = DistPool(4, timeout=150, backend="nccl", pg_timeout=120, preload=("executor.switch.hot_switch", "exec_jobs"))
    yield pool
    pool.close()


def _steps() -> tuple[list[list[torch.Tensor]], list[object]]:
    steps = [global_docs(TINY8, 1, n, seed=200 + k)[0] for k, n in enumerate((14, 9, 12))]
    return steps, [plan_step([len(d) - 1 for d in docs], STRATEGIES, assign="threshold") for docs in steps]


def _bf16(plan: Plan) -> Plan:
    return replace(plan, options=replace(plan.options, dtype="bf16"))


def test_nccl4_hot_switching_equals_the_dense_update(nccl4: DistPool) -> None:
    steps, layouts = _steps()
    ref = reference_train(TINY8, steps, optim=ORACLE_OPTIM)
    res = nccl4.run(train_hot_switch, [HOME, TP4, DP4], 0, steps, layouts, accelerator=True)
    for rank, r in enumerate(res):
        assert_close(r["losses"], ref.losses, rtol=RTOL, atol=0, msg=f"losses on rank {rank}")
        assert_close(r["norms"], ref.grad_norms, rtol=RTOL, atol=0, msg=f"grad norms on rank {rank}")
        assert all(n > 0 for n in r["sent"]) and r["released"]
    for name, want in ref.state.items():
        assert_close(res[0]["state"][name].cpu(), want, rtol=RTOL, atol=ATOL, msg=lambda s, n=name: f"{n}: {s}")


def test_nccl4_hot_switching_bf16_wire_tracks_fp32(nccl4: DistPool) -> None:
    steps, layouts = _steps()
    ref = reference_train(TINY8, steps, optim=ORACLE_OPTIM)
    res = nccl4.run(train_hot_switch, [_bf16(p) for p in (HOME, TP4, DP4)], 0, steps, layouts, accelerator=True,
                    wire_bf16=True)
    losses = res[0]["losses"]
    assert all(torch.isfinite(torch.tensor(losses)))
    assert_close(losses, ref.losses, rtol=2e-2, atol=0)
