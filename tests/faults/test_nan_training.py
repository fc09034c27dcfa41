"""NaN end to end: ``--lr 1e30`` makes the second step's gradient norm non-finite. The job stops there with
exit code 3 and a line naming the step, before the update and before any save: ``latest`` still
points at the last finite checkpoint. With ``--on-nonfinite skip`` the steps are skipped and,
ten in a row, the job stops the same way (a run that only skips trains nothing)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from executor.state.checkpoint_verify import verify_files, verify_meta
from planner.model import PRESETS

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("hexiscale-jobs")]
ROOT = Path(__file__).resolve().parents[2]
CLUSTER = ROOT / "examples" / "clusters" / "demo-cpu-6.yaml"
SEED_FLAGS = ("--cluster", str(CLUSTER), "--model", "tiny", "--hetero_configs", "[[1]]", "--layer_partitions",
              "[[4]]", "--global_bsz_size", "4", "--chunks", "2", "--dtype", "fp32", "--device", "cpu")


def train(*argv: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HEXISCALE_", "TORCHELASTIC_"))}
    env.update(OMP_NUM_THREADS="1", WORLD_SIZE="1")
    return subprocess.run([sys.executable, "-m", "hexiscale", "train", *SEED_FLAGS, "--lr", "1e30", "--warmup", "0",
                           *argv], env=env, capture_output=True, text=True, timeout=240, cwd=ROOT)


def test_nan_stops_before_anything_is_saved(tmp_path: Path) -> None:
    ck, log = tmp_path / "ck", tmp_path / "m.jsonl"
    run = train("--steps", "6", "--checkpoint-dir", str(ck), "--save-every", "1", "--log-jsonl", str(log))
    assert run.returncode == 3, run.stdout + run.stderr
    assert "failed at step 2: not finite (loss" in run.stderr and "nothing of it was applied or saved" in run.stderr
    assert (ck / "latest").read_text().strip() == "step-000001"
    assert sorted(p.name for p in ck.glob("step-*")) == ["step-000001"]
    verify_files(ck / "step-000001", verify_meta(ck / "step-000001", PRESETS["tiny"]))  # intact and finite
    assert [json.loads(x)["step"] for x in log.read_text().splitlines()] == [1]


def test_skip_policy_skips_then_gives_up(tmp_path: Path) -> None:
    log = tmp_path / "m.jsonl"
    run = train("--steps", "20", "--on-nonfinite", "skip", "--log-jsonl", str(log))
    assert run.returncode == 3, run.stdout + run.stderr
    assert run.stdout.count("SKIPPED: not finite, weights unchanged") == 9
    assert "10 steps in a row were not finite" in run.stderr
    records = [json.loads(x) for x in log.read_text().splitlines()]
    assert [r["skipped"] for r in records] == [False] + [True] * 9 and records[1]["grad_norm"] is None
