"""``hexiscale train`` says what it does before step 1 (start-up took ~20 s of silence on a small
job): rank 0's progress lines go to stderr, in order, after pre-flight; stdout keeps the step lines.
The same for a plan, a strategy pool and an elastic job (one rank each, a few seconds)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from planner.model import PRESETS
from planner.plan import Pipeline, Plan, PlanOptions, Stage, save_plan

ROOT = Path(__file__).resolve().parents[2]
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("hexiscale-jobs")]  # one trainer process each, ~4 s
STEPS = ("pre-flight passed", "building the model", "loading data", "step 1 starting")


def _one_rank_plan(tmp_path: Path) -> Path:
    model = PRESETS["tiny"]
    plan = tmp_path / "one.json"
    save_plan(Plan(model, 2, (Pipeline(2, 1, (Stage(("local:0",), 1, (0, model.num_layers)),)),),
                   PlanOptions(dtype="fp32")), plan)
    return plan


def _one_rank_pool(tmp_path: Path) -> Path:
    """The test pool's DP 4 strategy cut to one pipeline, at a 256-token context."""
    pool = json.loads((ROOT / "tests" / "data" / "pool-tiny-h100x4.json").read_text())
    plan = pool["strategies"][0]["plan"]
    plan.update(pipelines=plan["pipelines"][:1], global_batch_size=1)
    plan["model"]["seq_len"] = pool["context"] = 256
    plan["options"]["dtype"] = "fp32"
    pool.update(strategies=[{"name": "one", "plan": plan}], home=0)
    path = tmp_path / "pool.json"
    path.write_text(json.dumps(pool))
    return path


def _notes(*argv: str, cwd: Path) -> tuple[list[str], subprocess.CompletedProcess[str]]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("HEXISCALE_")
           and k not in ("WORLD_SIZE", "RANK", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")}
    env.update(OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT))
    run = subprocess.run([sys.executable, "-m", "hexiscale", *argv], env=env, cwd=cwd, capture_output=True,
                         text=True, timeout=240)
    assert run.returncode == 0, run.stdout + run.stderr
    prefix = "hexiscale train: "
    return [ln.removeprefix(prefix) for ln in (run.stdout + run.stderr).splitlines() if ln.startswith(prefix)], run


def _assert_in_order(notes: list[str]) -> None:
    firsts = [next((i for i, n in enumerate(notes) if n.startswith(w)), -1) for w in STEPS]
    assert -1 not in firsts and firsts == sorted(firsts), notes


def test_progress_lines_before_the_first_step(tmp_path: Path) -> None:
    notes, run = _notes("train", "--plan", str(_one_rank_plan(tmp_path)), "--steps", "1", "--device", "cpu",
                        cwd=tmp_path)
    _assert_in_order(notes)
    assert "building the model" not in run.stdout and "step 1/1" in run.stdout


def test_progress_lines_of_a_strategy_pool(tmp_path: Path) -> None:
    notes, run = _notes("train", "--plan", str(_one_rank_pool(tmp_path)), "--steps", "1", "--device", "cpu",
                        "--cluster", str(ROOT / "examples" / "clusters" / "h100x4.yaml"), "--step-tokens", "512",
                        "--lengths", "synthetic:commoncrawl", cwd=tmp_path)
    _assert_in_order(notes)
    assert "building the model" not in run.stdout and "step 1/1" in run.stdout


def test_progress_lines_of_an_elastic_job(tmp_path: Path) -> None:
    """The launcher merges its ranks' stderr into its stdout: the order is checked there."""
    notes, run = _notes("launch", str(_one_rank_plan(tmp_path)), "--local", "--elastic", "--device", "cpu", "--",
                        "--steps", "1", cwd=tmp_path)
    _assert_in_order(notes)
    assert "step 1/1" in run.stdout
