"""``hexiscale train`` says what it does before step 1 (start-up took ~20 s of silence on a small
job): rank 0's progress lines go to stderr, in order, after pre-flight; stdout keeps the step lines."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from planner.model import PRESETS
from planner.plan import Pipeline, Plan, PlanOptions, Stage, save_plan

ROOT = Path(__file__).resolve().parents[2]
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("hexiscale-jobs")]  # one trainer process, ~5 s


def test_progress_lines_before_the_first_step(tmp_path: Path) -> None:
    model = PRESETS["tiny"]
    plan = tmp_path / "one.json"
    save_plan(Plan(model, 2, (Pipeline(2, 1, (Stage(("local:0",), 1, (0, model.num_layers)),)),),
                   PlanOptions(dtype="fp32")), plan)
    env = {k: v for k, v in os.environ.items() if not k.startswith("HEXISCALE_")
           and k not in ("WORLD_SIZE", "RANK", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")}
    env.update(OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT))
    run = subprocess.run([sys.executable, "-m", "hexiscale", "train", "--plan", str(plan), "--steps", "1",
                          "--device", "cpu"], env=env, cwd=tmp_path, capture_output=True, text=True, timeout=240)
    assert run.returncode == 0, run.stdout + run.stderr
    prefix = "hexiscale train: "
    notes = [ln.removeprefix(prefix) for ln in run.stderr.splitlines() if ln.startswith(prefix)]
    firsts = [next(i for i, n in enumerate(notes) if n.startswith(w))
              for w in ("pre-flight passed", "building the model", "loading data", "step 1 starting")]
    assert firsts == sorted(firsts), notes
    assert "building the model" not in run.stdout and "step 1/1" in run.stdout
