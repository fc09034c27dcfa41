"""A strategy pool with a context-parallel strategy (hot switching) is refused in one line before any
rank starts (a CP plan's end-to-end job is test_train_jobs.test_local_job_then_resume_under_another_plan;
an elastic job in and out of CP plans, test_elastic_cp.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from test_train_jobs import CLUSTER, cp_plan

from hexiscale.cli.main import main


def test_pool_with_a_cp_strategy_is_refused_before_any_rank(tmp_path: Path, capsys: pytest.CaptureFixture[str]
                                                             ) -> None:
    plan = json.loads(cp_plan(tmp_path).read_text())
    flat = json.loads(json.dumps(plan))  # the same devices, tp 2 instead of cp 2
    flat["format"] = "hexiscale.plan/1"
    del flat["pipelines"][0]["stages"][0]["cp"]
    flat["pipelines"][0]["stages"][0]["tp"] = 2
    pool = tmp_path / "pool.json"
    pool.write_text(json.dumps({"format": "hexiscale.pool/1", "context": plan["model"]["seq_len"], "home": 0,
                                "strategies": [{"name": "a", "plan": flat}, {"name": "b", "plan": plan}]}))
    assert main(["launch", str(pool), "--cluster", str(CLUSTER), "--local", "--dry-run"]) == 1
    err = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert len(err) == 1 and "strategies[1].plan.pipelines[0].stages[0].cp" in err[0], err

