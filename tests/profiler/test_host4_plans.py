"""The 4-GPU fidelity benchmark's plans (benchmarks/fidelity/host4.py): at least 16, valid on the
4-GPU cluster they are predicted on, covering what issue 19 asks — PP with different TP per stage,
asymmetric pipelines, MPS-throttled GPUs, the 1.3B and a 7B — and each predicted by the cost model."""

from __future__ import annotations

import math

from benchmarks.fidelity.host4 import cluster_for, launches
from planner.cost import estimate
from planner.validate import validate


def test_host4_plans_cover_the_issue_and_fit() -> None:
    plans = [(sm, name, p) for _, sm, ps in launches(cpu=False) for name, p in ps]
    assert len(plans) >= 16
    tp_change = [n for _, n, p in plans if any(len({s.tp for s in pipe.stages}) > 1 for pipe in p.pipelines)]
    asymmetric = [n for _, n, p in plans if len({(tuple((s.tp, s.layers) for s in pipe.stages), pipe.batch_size,
                                                  pipe.micro_batches) for pipe in p.pipelines}) > 1]
    throttled = [n for sm, n, _ in plans if min(sm) < 100]
    assert len(tp_change) >= 3 and len(asymmetric) >= 4 and len(throttled) >= 4
    assert {p.model.name for _, _, p in plans} == {"llama-1.3b", "llama2-7b"}
    for sm, name, plan in plans:
        cluster = cluster_for(sm, "h100-sxm-measured", cpu=False)
        validate(plan, cluster)
        est = estimate(plan, cluster)
        assert not est.oom, name
        assert math.isfinite(est.step_time_s) and est.step_time_s > 0


def test_a_plan_that_leaves_memory_allocated_is_named() -> None:
    from benchmarks.fidelity.host4 import leaks

    launch = {"plans": [{"name": "dp4", "ranks": [{"device": "g0:0", "left_allocated_gib": 10.7},
                                                  {"device": "g1:0", "left_allocated_gib": 0.0}]},
                        {"name": "pp4", "ranks": [{"device": "g0:0", "left_allocated_gib": 0.05}]}]}
    assert leaks(launch) == ["warning: dp4 left 10.70 GiB allocated on g0:0 after release"]


def test_the_2gpu_set_is_valid_and_fits_either_card() -> None:
    plans = [(sm, name, p) for _, sm, ps in launches(cpu=False, gpus=2) for name, p in ps]
    assert len(plans) == len({n for _, n, _ in plans}) == 11
    assert {p.model.name for _, _, p in plans} == {"llama-1.3b", "llama2-7b"}
    assert {p.options.recompute for _, _, p in plans} == {"none", "selective", "full"}
    for key in ("h100-sxm-measured", "h200-measured"):
        for sm, name, plan in plans:
            cluster = cluster_for(sm, key, cpu=False)
            assert len(cluster.devices) == 2
            validate(plan, cluster)
            assert not estimate(plan, cluster).oom, (key, name)
