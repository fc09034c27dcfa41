"""Re-planning a strategy pool for a changed device set (planner.varlen.replan_pool): pure, no torch."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from planner.cluster import load_cluster
from planner.errors import SpecError
from planner.plan import Pipeline, Stage, plan_to_dict
from planner.search.config import PlannerConfig
from planner.varlen import replan_pool as module
from planner.varlen.layout_doc import home_plan, layout_from_dict, layout_to_dict
from planner.varlen.pool import load_pool
from planner.varlen.replan_pool import replan_pool

ROOT = Path(__file__).resolve().parents[2]
CLUSTER = load_cluster(ROOT / "examples" / "clusters" / "h100x4.yaml")
POOL = load_pool(ROOT / "tests" / "data" / "pool-tiny-h100x4.json")  # dp4 (home), tp4
FAST = PlannerConfig(time_limit_s=1.0, dtype="bf16")


def test_each_strategy_is_replanned_onto_the_new_devices_names_and_home_kept() -> None:
    devices = ["h100:0", "h100:1", "h100:2"]
    new = replan_pool(CLUSTER, devices, POOL, config=FAST)
    assert [s.name for s in new.strategies] == ["dp4", "tp4"] and new.home == POOL.home
    assert new.context == POOL.context and new.estimate is None
    used = sorted(new.home_plan.devices)
    assert set(used) <= set(devices) and "h100:3" not in used
    assert all(sorted(s.plan.devices) == used for s in new.strategies)  # one device set (StrategyPool checks it)
    assert all(s.plan.model == POOL.model for s in new.strategies)
    # a pool is published as JSON by its format, a plan as a plan
    assert layout_from_dict(layout_to_dict(new)) == new
    assert layout_from_dict(layout_to_dict(new.home_plan)) == home_plan(new)


def test_a_strategy_the_planner_puts_on_other_devices_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    real = module.replan

    def fewer(cluster, devices, current, *, config=None, context_parallel=True):  # type: ignore[no-untyped-def]
        out = real(cluster, devices, current, config=config, context_parallel=context_parallel)
        if current is not POOL.home_plan:  # the planner leaves all but one device of the other strategy idle
            gbs = current.global_batch_size
            one = Pipeline(gbs, 1, (Stage((devices[0],), 1, (0, current.model.num_layers)),))
            out = replace(out, plan=replace(current, pipelines=(one,)))
        return out

    monkeypatch.setattr(module, "replan", fewer)
    with pytest.raises(SpecError, match=r"^strategies\[1\]: 'tp4' re-planned onto") as err:
        replan_pool(CLUSTER, ["h100:0", "h100:1", "h100:2", "h100:3"], POOL, config=FAST)
    assert "\n" not in str(err.value)


def test_a_trace_of_a_pool_job_takes_pools_and_refuses_a_plan(tmp_path: Path) -> None:
    from planner.elastic_trace import parse_trace

    POOL.save(tmp_path / "pool.json")
    (tmp_path / "plan.json").write_text(json.dumps(plan_to_dict(POOL.home_plan)))
    three = ["h100:0", "h100:1", "h100:2"]
    t = parse_trace({"phases": [{"steps": 1}, {"steps": 1, "devices": three},
                                {"steps": 1, "devices": "all", "plan": "pool.json"}]},
                    cluster=CLUSTER, plan=POOL, base=tmp_path)
    assert t.phases[0].plan == POOL and t.phases[1].plan is None and t.phases[2].plan == POOL
    assert t.phases[2].devices == tuple(POOL.home_plan.devices)
    with pytest.raises(SpecError, match=r"phases\[1\]\.plan: a plan, but the job trains a strategy pool"):
        parse_trace({"phases": [{"steps": 1}, {"steps": 1, "plan": "plan.json"}]}, cluster=CLUSTER, plan=POOL,
                    base=tmp_path)
