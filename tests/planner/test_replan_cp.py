"""Re-planning searches context parallelism (an elastic switch moves state into CP layouts:
tests/executor/test_exec_switch.py's CP cases), warm-starts from a running CP plan's meshes, and
leaves CP out for a strategy pool (hot switching has none). Pure, no torch."""

from __future__ import annotations

from dataclasses import replace
from functools import cache
from pathlib import Path

import pytest

from planner.cluster import ClusterSpec, load_cluster
from planner.errors import PlanInfeasible
from planner.model import PRESETS, ModelSpec
from planner.plan import Plan, uses_cp
from planner.replan import replan, sub_cluster, warm_start
from planner.search import PlannerConfig, search
from planner.state_move_plan import reshard_plan
from planner.varlen.pool import Strategy, StrategyPool
from planner.varlen.replan_pool import replan_pool

CLUSTERS = Path(__file__).resolve().parents[2] / "examples" / "clusters"
FAST = PlannerConfig(local_search=False, polish=False)


def _model(seq_len: int) -> ModelSpec:
    return replace(PRESETS["llama-1.3b"], seq_len=seq_len)


@cache
def _running() -> tuple[ClusterSpec, Plan]:
    """128K on the mixed 3080 Ti / 3090 / 4090 cluster: no TP-only plan holds it, the search's plan
    is two pipelines of two cp 4 x tp 2 stages each (tests/planner/test_search_cp.py)."""
    cluster = load_cluster(CLUSTERS / "seed-40gpu-3types.yaml")
    plan = search(cluster, _model(131072), 16, config=FAST).plan
    assert uses_cp(plan)
    return cluster, plan


def test_a_device_leaves_a_cp_job_and_the_replan_is_a_cp_plan() -> None:
    cluster, running = _running()
    devices = list(running.devices)[:-1]
    new = replan(cluster, devices, running).plan  # the default re-plan, as the elastic launcher runs it
    assert uses_cp(new) and set(new.devices) <= set(devices)
    assert all(len(st.chunks) <= 1 for p in new.pipelines for st in p.stages)  # one layer range per stage
    assert reshard_plan(running, new).moved_bytes > 0  # the state move into it is planned
    with pytest.raises(PlanInfeasible):  # without CP nothing holds 128K on these devices
        replan(cluster, devices, running, context_parallel=False)


def test_warm_start_keeps_a_cp_stage_whose_devices_all_stay() -> None:
    cluster, running = _running()
    sub = sub_cluster(cluster, running.devices)
    assert [[(u.tp, u.cp) for u in p] for p in warm_start(running, sub)] == [[(2, 4)] * 2] * 2
    assert all(u.cp == 1 for p in warm_start(running, sub, context_parallel=False) for u in p)
    log = replan(cluster, list(running.devices), running).log
    assert any(line.startswith("warm start 2 pipelines") for line in log), log  # the meshes fit: scored first


def test_a_pools_replan_has_no_cp() -> None:
    """On 3 of the 4 H100s at 128K the plain re-plan picks CP; a pool's strategies stay cp 1."""
    cluster = load_cluster(CLUSTERS / "h100x4.yaml")
    tp_only = search(cluster, _model(131072), 8, config=replace(FAST, context_parallel=False)).plan
    devices = ["h100:0", "h100:1", "h100:2"]
    assert uses_cp(replan(cluster, devices, tp_only).plan)
    pool = StrategyPool(131072, (Strategy("only", tp_only),))
    assert not uses_cp(replan_pool(cluster, devices, pool).home_plan)
