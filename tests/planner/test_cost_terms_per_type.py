"""Cost-model terms per GPU type, not per cluster (issue 31): the packaged H100 calibration applies
to H100s only, so adding an H100 node that a plan does not use changes nothing about the plan's
estimate (it moved an A100 plan from 15.911 to 15.932 s and its overhead from 6.07 to 4.14 GiB),
and the plan's estimate records which terms priced each GPU type."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from planner.calibration.local import resolve_profiles
from planner.cluster import parse_cluster
from planner.cost import estimate
from planner.model import PRESETS
from planner.plan import Pipeline, Plan, Stage

A100 = {"name": "a", "gpu": "a100-sxm-80g", "gpus": 4, "intra_link": {"kind": "nvlink", "bandwidth_GBps": 300}}
H100 = {"name": "h", "gpu": "h100-sxm", "gpus": 4, "intra_link": {"kind": "nvlink", "bandwidth_GBps": 450}}
LINK = {"kind": "infiniband", "bandwidth_GBps": 25, "latency_us": 5}


def test_an_unused_node_does_not_change_an_estimate(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HEXISCALE_HOME", str(tmp_path))  # the packaged calibrations only
    alone = parse_cluster({"name": "a", "nodes": [A100], "inter_node": LINK})
    mixed = parse_cluster({"name": "ah", "nodes": [A100, H100], "inter_node": LINK})
    model = replace(PRESETS["llama-1.3b"], seq_len=1024)
    plan = Plan(model, 8, tuple(Pipeline(4, 4, (Stage((f"a:{2 * p}",), 1, (0, 12)),
                                                 Stage((f"a:{2 * p + 1}",), 1, (12, 24)))) for p in range(2)))
    before = estimate(plan, alone, resolve_profiles(alone).profiles)
    after = estimate(plan, mixed, resolve_profiles(mixed).profiles)
    assert after.step_time_s == before.step_time_s
    assert after.memory == before.memory
    assert after.calibration == before.calibration == {"a100-sxm-80g": "default terms"}
    h100 = Plan(model, 8, (Pipeline(8, 8, (Stage(("h:0",), 1, (0, 24)),)),))
    assert estimate(h100, mixed, resolve_profiles(mixed).profiles).calibration["h100-sxm"].startswith(
        "packaged calibration 'h100'")
