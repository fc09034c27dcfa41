"""The fidelity benchmark's device-side worker on CPU ranks: every plan of one global batch trains to the
same loss, and the report side turns the runs into per-plan errors."""

from __future__ import annotations

import pytest

from benchmarks.fidelity.accuracy import device_memory, summary
from benchmarks.fidelity.plans import G0, G1, _dp2, _one, _pp2, plan_to_json
from benchmarks.fidelity.worker import run_launch
from planner.model import PRESETS

pytestmark = pytest.mark.slow


def test_launch_runs_plans_on_their_gpus_and_agrees_on_the_loss() -> None:
    m = PRESETS["tiny"]
    plans = [("one-on-g1", _one(m, G1, 4, 2)), ("pp2-g1-first", _pp2(m, G1, G0, 1, 4, 2)),
             ("dp2", _dp2(m, G0, G1, 3, 1, 3, 1))]
    res = run_launch([{"name": n, "plan": plan_to_json(p)} for n, p in plans], [100, 100], cpu=True,
                     warmup=1, steps=1)
    by = {p["name"]: p for p in res["plans"]}
    assert all("error" not in p for p in by.values()), [p.get("error") for p in by.values()]
    assert [r["device"] for r in by["one-on-g1"]["ranks"]] == [G1]  # a one-GPU plan on the second GPU
    assert [r["device"] for r in by["pp2-g1-first"]["ranks"]] == [G1, G0]  # plan rank 0 runs on GPU 1
    losses = [r["loss"] for p in by.values() for r in p["ranks"]]
    assert max(losses) - min(losses) < 1e-4 * abs(losses[0])  # same data, same model: same loss
    assert all(p["step_time_s"] > 0 for p in by.values())
    for p in by.values():  # where each plan's wall time went (benchmarks.fidelity.phases)
        assert {"groups", "build", "warmup", "steps", "teardown"} <= set(p["phases_s"]), p["phases_s"]
        assert p["phases_s"]["steps"] >= p["step_time_s"]


def test_memory_less_leftovers_and_summary() -> None:
    assert device_memory({"in_use_gib": 10.0, "in_use_before_gib": 1.5, "context_gib": 0.5}) == 9.0
    assert device_memory({"in_use_gib": 10.0, "in_use_before_gib": 0.4, "context_gib": 0.5}) == 10.0
    # per process: the allocator's peak reserve + communicators + one context, never the device-wide
    # figure (under MPS it holds the server and the other clients: 40 GiB here)
    rank = {"in_use_gib": 40.0, "in_use_before_gib": 30.0, "context_gib": 9.0, "max_reserved_gib": 6.0,
            "comm_gib": 1.5}
    assert device_memory(rank) == 6.0 + 1.5 + 9.0
    assert device_memory(rank, context_gib=0.5) == 6.0 + 1.5 + 0.5
    # what earlier plans of the process still held is not this plan's (the peak counts it)
    assert device_memory({**rank, "allocated_before_gib": 2.0}, context_gib=0.5) == 6.0 - 2.0 + 1.5 + 0.5
    rows = [{"plan": "a", "calibration": True, "time_err": 0.02, "memory": [{"err": -0.01}]},
            {"plan": "b", "calibration": False, "time_err": -0.08, "memory": [{"err": 0.04}, {"err": 0.0}]},
            {"plan": "c", "calibration": False, "error": "boom"}]
    s = summary(rows)
    assert s["all"]["plans"] == 2 and s["all"]["time_max_abs"] == pytest.approx(0.08)
    assert s["all"]["time_mean_abs"] == pytest.approx(0.05)
    assert s["held_out"]["plans"] == 1 and s["held_out"]["memory_max_abs"] == pytest.approx(0.04)
    assert s["failed"] == ["c"]
