"""Re-planning for a changed device set (planner.replan) and elastic traces (planner.elastic_trace):
pure, no torch."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from planner.cluster import load_cluster
from planner.elastic_trace import parse_trace
from planner.errors import SpecError
from planner.plan import Pipeline, Stage, load_plan
from planner.replan import keep_roles, replan, sub_cluster
from planner.state_move_plan import reshard_plan

ROOT = Path(__file__).resolve().parents[2]
CLUSTER = load_cluster(ROOT / "examples" / "clusters" / "demo-cpu-6.yaml")
PLAN4 = load_plan(ROOT / "examples" / "plans" / "demo-cpu-4-tiny.json")


def test_sub_cluster_renumbers_kept_devices_and_keeps_overrides() -> None:
    sub = sub_cluster(CLUSTER, ["r4090:3", "a100:1", "r4090:1"])
    assert [(n.name, n.gpus) for n in sub.cluster.nodes] == [("a100", 1), ("r4090", 2)]
    assert sub.real == {"a100:0": "a100:1", "r4090:0": "r4090:1", "r4090:1": "r4090:3"}
    assert sub.cluster.device("r4090:1").memory_gib == 16  # r4090:3's override follows it
    with pytest.raises(SpecError, match=r"devices\[1\]"):
        sub_cluster(CLUSTER, ["a100:0", "nope:0"])


def test_replan_is_warm_started_and_uses_only_the_given_devices() -> None:
    devices = ["a100:0", "r4090:0", "r4090:1"]
    r = replan(CLUSTER, devices, PLAN4)
    assert set(r.plan.devices) <= set(devices)
    assert (r.plan.model, r.plan.global_batch_size, r.plan.cluster) == (PLAN4.model, 8, CLUSTER.name)
    assert any(line.startswith("warm start") for line in r.log), r.log


def test_keep_roles_gives_each_slot_the_interchangeable_device_that_holds_its_weights() -> None:
    """The same plan with its r4090 devices permuted is relabelled back: nothing moves."""
    swap = {"r4090:0": "r4090:2", "r4090:2": "r4090:0"}
    permuted = replace(PLAN4, pipelines=tuple(
        Pipeline(p.batch_size, p.micro_batches, tuple(Stage(tuple(swap.get(d, d) for d in s.devices), s.tp, s.layers)
                                                      for s in p.stages), p.schedule) for p in PLAN4.pipelines))
    assert reshard_plan(PLAN4, permuted, CLUSTER).moved_bytes > 0
    kept = keep_roles(PLAN4, permuted, CLUSTER)
    assert kept.devices == PLAN4.devices
    assert reshard_plan(PLAN4, kept, CLUSTER).moved_bytes == 0


def test_trace_phases_start_where_the_previous_ones_end() -> None:
    share = {"r4090": 50}
    t = parse_trace({"phases": [{"steps": 2}, {"steps": 3, "devices": ["a100:0", "r4090:3"], "sm_percent": share},
                                {"steps": 1, "devices": "all", "sm_percent": share}]}, cluster=CLUSTER, plan=PLAN4)
    assert [(p.start, p.steps) for p in t.phases] == [(0, 2), (2, 3), (5, 1)] and t.total_steps == 6
    assert t.phases[0].plan == PLAN4 and t.phases[1].plan is None
    assert t.phases[1].sm_percent == {"r4090:3": 50.0}  # r4090:0 runs at 100 % in phase 0, 50 % in phase 2
    assert len(t.phases[2].devices) == 6


@pytest.mark.parametrize(("data", "match"), [
    ({"phases": []}, r"phases: a trace needs at least one phase"),
    ({"phases": [{"steps": 0}]}, r"phases\[0\]\.steps"),
    ({"phases": [{"steps": 1, "when": 3}]}, r"phases\[0\].*when"),
    ({"phases": [{"steps": 1}, {"steps": 1, "devices": ["a100:0", "a100:0"]}]}, r"listed twice"),
    ({"phases": [{"steps": 1}, {"steps": 1, "devices": ["a100:0"], "sm_percent": {"a100": 0}}]},
     r"phases\[1\]\.sm_percent\.a100: expected a share in \(0, 100\]"),
    ({"phases": [{"steps": 1, "sm_percent": {"r4090": 50}}, {"steps": 1, "devices": ["r4090:0"]}]},
     r"device r4090:0 runs in phases 0 and 1 with SM shares 50 and 100"),
])
def test_bad_traces_are_one_clear_error(data: dict, match: str) -> None:
    with pytest.raises(SpecError, match=match):
        parse_trace(data, cluster=CLUSTER, plan=PLAN4)
