"""``hexiscale plan --elastic``: a plan an elastic job can start from. On an MPS cluster the search's
best plan can be interleaved 1F1B, which ``launch --elastic`` refuses (switching layouts moves state
between stages of one layer range); the elastic benchmark ran into that refusal on 4x H100
(2026-11-27). With ``--elastic`` the plan is searched as the job's re-plans are: switchable
schedules (context parallelism stays: an elastic switch moves state into CP layouts).

The case is shown on the H200 MPS cluster: on the H100 one the search finds DP 4 at
llama-1.3b, batch 16 (0.396 s, which the estimate already put under the interleaved plan's 0.398 s)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hexiscale.cli.main import main
from planner.cluster import load_cluster
from planner.errors import SpecError
from planner.hf_config import resolve_model
from planner.plan import load_plan
from planner.schedules.trained import check_no_chunks
from planner.search.config import SWITCHABLE, PlannerConfig, elastic_config
from planner.search.planner import search

ROOT = Path(__file__).resolve().parents[2]
CLUSTER = ROOT / "examples" / "clusters" / "h100x4-mps-100-100-50-50.yaml"
INTERLEAVED_BEST = ROOT / "examples" / "clusters" / "h200x4-mps-100-100-50-50.yaml"  # module docstring


def test_elastic_config_searches_what_an_elastic_job_trains() -> None:
    cluster, model = load_cluster(INTERLEAVED_BEST), resolve_model("llama-1.3b", 2048)
    free = search(cluster, model, 16, config=PlannerConfig(time_limit_s=15.0)).plan
    with pytest.raises(SpecError, match="plan --elastic"):  # the case: unconstrained, an elastic job refuses it
        check_no_chunks(free, "", "an elastic job")
    cfg = elastic_config(PlannerConfig(time_limit_s=15.0))
    assert set(cfg.schedules) <= set(SWITCHABLE) and cfg.context_parallel
    plan = search(cluster, model, 16, config=cfg).plan
    check_no_chunks(plan, "", "an elastic job")
    assert all(p.schedule in SWITCHABLE for p in plan.pipelines)


def test_plan_cli_elastic_writes_a_plan_launch_elastic_accepts(tmp_path: Path, capsys) -> None:
    out = tmp_path / "plan.json"
    assert main(["plan", str(CLUSTER), "--model", "llama-1.3b", "--seq-len", "2048", "--global-batch-size", "16",
                 "--elastic", "-o", str(out)]) == 0
    plan = load_plan(out)
    check_no_chunks(plan, "", "an elastic job")
    assert json.loads(out.read_text())["pipelines"][0]["schedule"] in SWITCHABLE
