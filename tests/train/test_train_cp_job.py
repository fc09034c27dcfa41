"""A context-parallel plan end to end: ``hexiscale launch --local`` trains it on CPU/gloo (one step
line per pipeline, not one per CP slot), and a strategy pool with a CP strategy is refused in one
line before any rank starts."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from test_train_jobs import CLUSTER, PLAN4, hexiscale, losses

from hexiscale.cli.main import main

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("hexiscale-jobs")]


def _cp_plan(tmp_path: Path) -> Path:
    """One pipeline: a cp 2 x tp 1 stage (layers 0-2), then a tp 2 stage (layers 2-4)."""
    data = json.loads(PLAN4.read_text())
    data["format"] = "hexiscale.plan/2"
    data["pipelines"] = [{"batch_size": 8, "micro_batches": 2, "schedule": "1f1b", "stages": [
        {"devices": ["r4090:0", "r4090:1"], "tp": 1, "cp": 2, "layers": [0, 2]},
        {"devices": ["r4090:2", "r4090:3"], "tp": 2, "layers": [2, 4]}]}]
    path = tmp_path / "cp.json"
    path.write_text(json.dumps(data))
    return path


def test_local_cp_job_trains(tmp_path: Path) -> None:
    log = tmp_path / "m.jsonl"
    run = hexiscale("launch", str(_cp_plan(tmp_path)), "--local", "--", "--steps", "3", "--log-jsonl", str(log),
                    "--lr", "3e-3", "--warmup", "1")
    assert run.returncode == 0, run.stdout + run.stderr
    steps = [ln for ln in run.stdout.splitlines() if ln.startswith("step ")]
    assert [ln.split(" | ")[0] for ln in steps] == [f"step {i}/3 pipeline 0 rank 0" for i in (1, 2, 3)]
    got = losses(log)
    assert len(got) == 3 and got[-1] < got[0]


def test_pool_with_a_cp_strategy_is_refused_before_any_rank(tmp_path: Path, capsys: pytest.CaptureFixture[str]
                                                             ) -> None:
    plan = json.loads(_cp_plan(tmp_path).read_text())
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
