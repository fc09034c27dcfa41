"""The simulated step as a timeline (``estimate(..., timeline=True)``): it adds up to the estimate."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from planner.cluster import load_cluster
from planner.cost import estimate
from planner.cost.sim_timeline import merged
from planner.interleave import interleaved
from planner.plan import load_plan
from planner.schedules import schedule_named
from planner.timeline_ops import op_times, seconds_by_kind

ROOT = Path(__file__).resolve().parents[2]
CASES = [("seed-32gpu-4types-llama2-7b", "seed-32gpu-4types"), ("demo-cpu-6-tiny", "demo-cpu-6"),
         ("h20-h800-llama2-13b", "h20-h800")]


@pytest.mark.parametrize("plan_name, cluster_name", CASES)
def test_timeline_adds_up_to_the_estimate(plan_name: str, cluster_name: str) -> None:
    plan = load_plan(ROOT / "examples" / "plans" / f"{plan_name}.json")
    cluster = load_cluster(ROOT / "examples" / "clusters" / f"{cluster_name}.yaml")
    est = estimate(plan, cluster, timeline=True)
    assert estimate(plan, cluster).timeline is None and est.timeline is not None
    tl = est.timeline
    assert tl.makespan == pytest.approx(est.step_time_s, rel=1e-9)
    assert [(ln.pipeline, ln.stage) for ln in tl.lanes] == [(p, s) for p, pipe in enumerate(plan.pipelines)
                                                           for s in range(len(pipe.stages))]
    for lane in tl.lanes:
        pipe, se = plan.pipelines[lane.pipeline], est.pipelines[lane.pipeline].stages[lane.stage]
        spans = sorted(lane.spans, key=lambda s: s.start)
        assert all(a.end <= b.start + 1e-12 for a, b in zip(spans, spans[1:]))  # one thing at a time
        for kind in ("forward", "backward"):
            assert sorted(s.micro_batch for s in spans if s.kind == kind) == list(range(pipe.micro_batches))
        # compute (TP all-reduces included) and p2p are the stage's totals of the estimate
        assert lane.busy("forward") + lane.busy("backward") == pytest.approx(se.compute_s + se.tp_comm_s, rel=1e-9)
        assert lane.busy("p2p") == pytest.approx(se.pp_comm_s, rel=1e-9, abs=1e-15)
        assert [s.kind for s in spans if s.kind == "optimizer"] == ["optimizer"]
        # the schedule's end is where the estimate says the stage ends its last backward
        assert max(s.end for s in spans if s.kind in ("forward", "backward", "p2p")) == \
            pytest.approx(se.last_backward_end_s, rel=1e-9)
    if len(plan.pipelines) > 1:
        assert any(lane.busy("grad_sync") > 0 for lane in tl.lanes)


def test_merged_intervals() -> None:
    assert merged([(3, 4), (0, 1), (1, 2), (0.5, 1.5), (5, 6)]) == [(0, 2), (3, 4), (5, 6)]
    assert merged([]) == []


@pytest.mark.parametrize(("schedule", "ops_per_mb"), [("zb-h1", 2), ("interleaved-1f1b", 2)])
def test_split_backward_and_chunked_timelines_add_up(schedule: str, ops_per_mb: int) -> None:
    """ZB-H1 (B and W ops), interleaved 1F1B (two chunks): compute and p2p still add up to the
    stage's totals; W sends nothing."""
    plan = load_plan(ROOT / "examples" / "plans" / "seed-32gpu-4types-llama2-7b.json")
    plan = replace(plan, pipelines=tuple(interleaved(p) if schedule == "interleaved-1f1b" else
                                         replace(p, schedule=schedule) for p in plan.pipelines))
    est = estimate(plan, load_cluster(ROOT / "examples" / "clusters" / "seed-32gpu-4types.yaml"), timeline=True)
    assert est.timeline is not None
    for lane in est.timeline.lanes:
        pipe, se = plan.pipelines[lane.pipeline], est.pipelines[lane.pipeline].stages[lane.stage]
        assert sorted(s.micro_batch for s in lane.spans if s.kind == "backward") == \
            sorted(ops_per_mb * list(range(pipe.micro_batches)))  # B and W, or two chunks, of every micro-batch
        assert lane.busy("forward") + lane.busy("backward") == pytest.approx(se.compute_s + se.tp_comm_s, rel=1e-9)
        assert lane.busy("p2p") == pytest.approx(se.pp_comm_s, rel=1e-9, abs=1e-15)


def test_zb_h1_never_prices_a_b_op_below_zero() -> None:
    """W (the weight-gradient GEMMs) is at most half the backward's compute, whose other half holds
    the input-gradient GEMMs of the same FLOPs: on a profile whose backward is shorter than twice its
    forward (the tiny model on demo-cpu-6: launch-bound, backward < forward), pricing W at the
    forward's compute left every B op a negative duration."""
    plan = load_plan(ROOT / "examples" / "plans" / "demo-cpu-4-tiny.json")
    plan = replace(plan, pipelines=tuple(replace(p, schedule="zb-h1") for p in plan.pipelines))
    est = estimate(plan, load_cluster(ROOT / "examples" / "clusters" / "demo-cpu-6.yaml"), timeline=True)
    assert est.timeline is not None
    for lane in est.timeline.lanes:
        assert all(s.end >= s.start for s in lane.spans), lane.spans
        pipe = plan.pipelines[lane.pipeline]
        times = op_times(lane, schedule_named("zb-h1").ops(len(pipe.stages), lane.stage, pipe.micro_batches))
        assert all(t.seconds > 0 for t in times), [(t.op, t.seconds) for t in times]
        kinds = seconds_by_kind(times)
        assert 0 < kinds["W"] <= kinds["B"] + 1e-12  # B: the input-gradient GEMMs and the rest of the backward
