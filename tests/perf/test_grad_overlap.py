"""Cross-pipeline gradient reduction overlapped with backward (GradSync.arm) on gloo ranks:
buckets launch from the backward hooks, before ``sync``, and the result equals reducing at the end.

ZeRO-1 over the same flat buckets (executor.parallel.zero): the reduce-scatters launch from the hooks,
gradients accumulate in place in the buckets (no copies), the weights live in the all-gather
buffers and their gathers are still in flight when a step returns; the result equals ZeRO-0's
all-reduce, and the parts are the sizes the state layout plans."""

from __future__ import annotations

import pytest
import torch
from perf_jobs import overlap_job, zero_overlap_job

from planner.model import PRESETS
from planner.plan import Pipeline, Plan, Stage
from tests.support.dist_testing import run_distributed

pytestmark = pytest.mark.slow


def _plan() -> Plan:
    m = PRESETS["tiny"]  # 4 layers
    p0 = Pipeline(2, 2, (Stage(("d:0",), 1, (0, 4)),))
    p1 = Pipeline(3, 3, (Stage(("d:1",), 1, (0, 1)), Stage(("d:2",), 1, (1, 4))))
    return Plan(m, 5, (p0, p1))


def test_overlapped_reduction_launches_early_and_matches() -> None:
    plan = _plan()
    gen = torch.Generator().manual_seed(5)
    batches = [torch.randint(0, plan.model.vocab_size, (5, plan.model.seq_len + 1), generator=gen) for _ in range(2)]
    results = run_distributed(overlap_job, 3, plan, batches, 3000, timeout=180, preload=("perf_jobs",))
    for rank, (armed, plain) in enumerate(results):
        assert armed["buckets"] > 1, "the test needs several buckets per rank"
        # every parameter is used by every micro-batch, so the hooks launch all buckets before sync
        assert armed["early"] == [armed["buckets"]] * 2, (rank, armed["early"])
        assert plain["early"] == [0, 0]
        assert armed["losses"] == pytest.approx(plain["losses"], rel=1e-6, abs=0)
        for name, t in armed["shards"].items():
            torch.testing.assert_close(t, plain["shards"][name], rtol=1e-6, atol=1e-7, msg=name)


def test_zero1_buckets_overlap_bind_and_match_zero0() -> None:
    plan = _plan()
    gen = torch.Generator().manual_seed(7)
    batches = [torch.randint(0, plan.model.vocab_size, (5, plan.model.seq_len + 1), generator=gen) for _ in range(3)]
    results = run_distributed(zero_overlap_job, 3, plan, batches, 3000, timeout=180, preload=("perf_jobs",))
    for rank, r in enumerate(results):
        z1, z0 = r["zero1"], r["zero0"]
        assert z1["buckets"] > 2, "the test needs several buckets per rank"
        assert z1["early"] == [z1["buckets"]] * 3, (rank, z1["early"])  # all launched during backward
        assert z0["early"] == [z0["buckets"]] * 3, (rank, z0["early"])
        assert z1["copies"] == 0 and z0["copies"] == 0, "every gradient accumulates in its bucket slot"
        assert z1["bound"], "every parameter lives in its all-gather buffer"
        assert z1["in_flight"] == [z1["buckets"]] * 3, "the weight all-gathers overlap the next forward"
        assert z1["parts"] == z1["planned"]
        assert z1["losses"] == pytest.approx(z0["losses"], rel=1e-5, abs=0)
        for name, t in z1["shards"].items():
            torch.testing.assert_close(t, z0["shards"][name], rtol=1e-5, atol=2e-6, msg=name)
