"""The search chooses context parallelism where it pays (sequences no dense layout holds), not at 4K; CP plans
(format /2) go through ``hexiscale plan --json`` and ``hexiscale estimate``."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from hexiscale.cli.main import main
from planner.cluster import load_cluster
from planner.errors import PlanInfeasible, SpecError
from planner.model import PRESETS, ModelSpec
from planner.plan import PLAN_FORMAT_CP, Pipeline, Plan, Stage, plan_from_dict, uses_cp
from planner.search import PlannerConfig, search
from planner.search.context import cp_choices, cp_wanted
from planner.seed_flags import plan_to_flags

ROOT = Path(__file__).resolve().parents[2]
CLUSTERS = ROOT / "examples" / "clusters"
FAST = PlannerConfig(local_search=False, polish=False)


def _model(seq_len: int) -> ModelSpec:
    return dataclasses.replace(PRESETS["llama-1.3b"], seq_len=seq_len)


def test_128k_on_the_mixed_cluster_needs_cp() -> None:
    """3080 Ti / 3090 / 4090 (12-24 GiB): no TP-only plan holds a 128K sequence; a CP plan does."""
    cluster = load_cluster(CLUSTERS / "seed-40gpu-3types.yaml")
    result = search(cluster, _model(131072), 16, config=FAST)
    assert uses_cp(result.plan) and result.estimate.fits
    for st in (s for p in result.plan.pipelines for s in p.stages if s.cp > 1):
        assert 131072 % (2 * st.cp) == 0 and st.tp * st.cp == len(st.devices)
    with pytest.raises(PlanInfeasible):
        search(cluster, _model(131072), 16, config=dataclasses.replace(FAST, context_parallel=False))


def test_on_4_h100_cp_where_it_pays() -> None:
    """At 64K the search may keep DP with full recompute (4x H100 measured it faster than CP4, 5.35 s
    against 8.99 s: benchmarks/results/long_context_cuda_20261127T042301Z.json), never slower than the
    best TP-only plan; at 256K no TP-only plan fits and CP does."""
    cluster = load_cluster(CLUSTERS / "h100x4.yaml")
    with_cp = search(cluster, _model(65536), 8, config=FAST)
    tp_only = search(cluster, _model(65536), 8, config=dataclasses.replace(FAST, context_parallel=False))
    assert not uses_cp(tp_only.plan)
    assert with_cp.estimate.step_time_s <= tp_only.estimate.step_time_s
    long = search(cluster, _model(262144), 8, config=FAST)
    assert uses_cp(long.plan) and long.estimate.fits
    with pytest.raises(PlanInfeasible):
        search(cluster, _model(262144), 8, config=dataclasses.replace(FAST, context_parallel=False))


def test_4k_plans_no_cp() -> None:
    result = search(load_cluster(CLUSTERS / "h100x4.yaml"), _model(4096), 8, config=FAST)
    assert not uses_cp(result.plan)


def test_cp_plan_through_plan_json_and_estimate(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cluster = str(CLUSTERS / "h100x4.yaml")
    # 256K: where no dense layout fits. At 64K the packaged H100 terms prefer DP with full recompute, as
    # 4x H100 measured (5.35 s against CP4's 8.99 s: benchmarks/results/long_context_cuda_20261127T042301Z.json)
    assert main(["plan", cluster, "--model", "llama-1.3b", "--seq-len", "262144", "--global-batch-size", "8",
                 "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["format"] == PLAN_FORMAT_CP
    plan = plan_from_dict(data)
    assert uses_cp(plan)
    path = tmp_path / "cp.json"
    path.write_text(json.dumps(data))
    assert main(["estimate", str(path), "--cluster", cluster, "--json"]) == 0
    est = json.loads(capsys.readouterr().out)
    assert sum(est["breakdown"].values()) == pytest.approx(est["step_time_s"], rel=1e-5)
    assert any(s.get("cp_comm_s", 0) > 0 for p in est["pipelines"] for s in p["stages"])
    assert main(["estimate", str(path), "--cluster", cluster]) == 0
    out = capsys.readouterr().out
    assert "cp comm" in out and "step time" in out


def test_seed_flags_refuse_a_cp_plan_by_field() -> None:
    devs = tuple(f"h100:{i}" for i in range(4))
    plan = Plan(_model(65536), 4, (Pipeline(4, 2, (Stage(devs, 2, (0, 24), 2),)),))
    with pytest.raises(SpecError, match=r"pipelines\[0\]\.stages\[0\]\.cp.*seed systems' flags"):
        plan_to_flags(plan, load_cluster(CLUSTERS / "h100x4.yaml"))


def test_cp_degrees_and_when_cp_is_tried() -> None:
    assert cp_choices(_model(131072), 2, 8) == [2, 4]  # tp x cp within the largest node
    assert cp_choices(dataclasses.replace(_model(4096), seq_len=4098), 1, 8) == []  # 2 x cp must divide 4098
    assert not cp_wanted(_model(8192), True, found=True) and cp_wanted(_model(8192), True, found=False)
    assert cp_wanted(_model(16384), True, found=True) and not cp_wanted(_model(16384), False, found=False)
