"""Real multi-process jobs on CPU/gloo: ``hexiscale launch --local`` end to end, resume under a
different plan, pre-flight errors, a rank killed mid-step, and seed-style flags."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from executor.data.token_file import write_token_file
from planner.model import PRESETS

ROOT = Path(__file__).resolve().parents[2]
PLAN4 = ROOT / "examples" / "plans" / "demo-cpu-4-tiny.json"
CLUSTER = ROOT / "examples" / "clusters" / "demo-cpu-6.yaml"
JOB_TIMEOUT = 240  # a job that runs past this is hung: the test fails instead of waiting forever

# the group mark is inert: CI runs --dist worksteal (Makefile), and xdist 3.8's loadgroup ignores groups
# under pytest 9.2; these jobs run beside each other on CI's two workers, started first (tests/conftest.py)
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("hexiscale-jobs")]


def hexiscale(*argv: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    full = {k: v for k, v in os.environ.items() if not k.startswith("HEXISCALE_")}
    full.update({"OMP_NUM_THREADS": "1", **(env or {})})
    return subprocess.run([sys.executable, "-m", "hexiscale.cli.main", *argv], env=full, capture_output=True,
                          text=True, timeout=JOB_TIMEOUT, cwd=ROOT)


def losses(jsonl: Path) -> list[float]:
    return [json.loads(line)["loss"] for line in jsonl.read_text().splitlines()]


def two_rank_plan(tmp_path: Path) -> Path:
    """Another layout of the same model and global batch: one pipeline, TP 2."""
    data = json.loads(PLAN4.read_text())
    data["pipelines"] = [{"batch_size": 8, "micro_batches": 2, "schedule": "1f1b",
                          "stages": [{"devices": ["r4090:0", "r4090:1"], "tp": 2, "layers": [0, 4]}]}]
    path = tmp_path / "plan2.json"
    path.write_text(json.dumps(data))
    return path


def cp_plan(tmp_path: Path) -> Path:
    """Another layout of the same model and global batch: one pipeline, a cp 2 x tp 1 stage (layers
    0-2) then a tp 2 stage (format hexiscale.plan/2)."""
    data = json.loads(PLAN4.read_text())
    data["format"] = "hexiscale.plan/2"
    data["pipelines"] = [{"batch_size": 8, "micro_batches": 2, "schedule": "1f1b", "stages": [
        {"devices": ["r4090:0", "r4090:1"], "tp": 1, "cp": 2, "layers": [0, 2]},
        {"devices": ["r4090:2", "r4090:3"], "tp": 2, "layers": [2, 4]}]}]
    path = tmp_path / "cp.json"
    path.write_text(json.dumps(data))
    return path


def test_local_job_then_resume_under_another_plan(tmp_path: Path) -> None:
    """Checkpoints written in the background (--async-save) at steps 2 and 4; step 2's resumed under
    a context-parallel layout (:func:`cp_plan`) gives the same steps 3 and 4, logged once a step."""
    ck, full = tmp_path / "ck", tmp_path / "full.jsonl"
    run = hexiscale("launch", str(PLAN4), "--local", "--", "--steps", "4", "--checkpoint-dir", str(ck),
                    "--save-every", "2", "--async-save", "--log-jsonl", str(full), "--lr", "3e-3", "--warmup", "1")
    assert run.returncode == 0, run.stdout + run.stderr
    assert "step 4/4 pipeline 0 rank 0" in run.stdout and "step 4/4 pipeline 1 rank 1" in run.stdout
    assert "summary: 4 steps" in run.stdout and "MFU n/a" in run.stdout
    ref = losses(full)
    assert len(ref) == 4 and ref[-1] < ref[0]
    assert (ck / "latest").read_text().strip() == "step-000004"
    # resume the step-2 checkpoint under a CP layout: steps 3 and 4 match
    part = tmp_path / "part.jsonl"
    run = hexiscale("launch", str(cp_plan(tmp_path)), "--local", "--", "--steps", "4", "--resume",
                    str(ck / "step-000002"), "--log-jsonl", str(part), "--lr", "3e-3", "--warmup", "1")
    assert run.returncode == 0, run.stdout + run.stderr
    assert "resumed from" in run.stdout
    steps = [ln.split(" | ")[0] for ln in run.stdout.splitlines() if ln.startswith("step ")]
    assert steps == ["step 3/4 pipeline 0 rank 0", "step 4/4 pipeline 0 rank 0"]  # not one per CP slot
    got = losses(part)
    assert len(got) == 2
    assert got == pytest.approx(ref[2:], rel=1e-5)


def test_kill_during_save_keeps_the_last_checkpoint(tmp_path: Path) -> None:
    """Rank 1 dies while the step-4 checkpoint is being written (its shards on disk, the checkpoint
    not complete): the job stops, ``latest`` still names step 2, the partial save is no checkpoint,
    and resuming the folder under another layout repeats steps 3 and 4 exactly."""
    ck, logged = tmp_path / "ck", tmp_path / "killed.jsonl"
    run = hexiscale("launch", str(PLAN4), "--local", "--grace", "60", "--", "--steps", "4", "--checkpoint-dir",
                    str(ck), "--save-every", "2", "--log-jsonl", str(logged), "--lr", "3e-3", "--warmup", "1",
                    "--dead-after", "8", "--heartbeat", "0.5", env={"HEXISCALE_FAULT": "1:3:kill-in-save"})
    assert run.returncode == 3, run.stdout + run.stderr
    assert "injecting 'kill-in-save' at step 3" in run.stdout
    assert (ck / "latest").read_text().strip() == "step-000002"
    assert not (ck / "step-000004").exists() and (ck / "step-000004.tmp").is_dir()
    ref = losses(logged)  # step 4 finished (and was logged) before its save
    assert len(ref) == 4
    part = tmp_path / "part.jsonl"
    run = hexiscale("launch", str(two_rank_plan(tmp_path)), "--local", "--", "--steps", "4", "--resume", str(ck),
                    "--log-jsonl", str(part), "--lr", "3e-3", "--warmup", "1")
    assert run.returncode == 0, run.stdout + run.stderr
    assert f"resumed from {ck / 'step-000002'}" in run.stdout
    assert losses(part) == pytest.approx(ref[2:], rel=1e-5)


@pytest.mark.parametrize("kind", ["kill", "hang", "oom"])
def test_failed_rank_stops_the_job(kind: str) -> None:
    """Rank 2 dies (SIGKILL), hangs or runs out of memory as step 3 starts, while the others enter
    its collectives."""
    run = hexiscale("launch", str(PLAN4), "--local", "--grace", "120", "--", "--steps", "6", "--dead-after", "8",
                    "--hang-after", "15", "--heartbeat", "0.5", env={"HEXISCALE_FAULT": f"2:2:{kind}"})
    out = run.stdout + run.stderr
    assert run.returncode == (4 if kind == "oom" else 3), out
    # every rank stopped by itself (the supervisor never had to) and named the culprit and step
    assert "stopping them" not in out
    survivors = (0, 1, 3) if kind == "kill" else (0, 1, 2, 3)  # ranks alive to report
    for r in survivors:
        assert f"[rank {r} (host" in out
    assert out.count("stopping: rank 2 (host ") == len(survivors) and "failed at step 3" in out
    if kind == "kill":
        assert "rank 2 (local, pid" in out and "killed by SIGKILL" in out and "no heartbeat" in out
    elif kind == "hang":
        assert "stuck in maybe_inject@faults.py" in out
    else:
        assert "failed at step 3: out of memory: injected out-of-memory on rank 2" in out


def test_preflight_errors_reach_every_rank(tmp_path: Path) -> None:
    missing = tmp_path / "nope"
    run = hexiscale("launch", str(PLAN4), "--local", "--", "--steps", "2", "--data", str(missing))
    out = run.stdout + run.stderr
    assert run.returncode == 1, out
    assert out.count("error: pre-flight: rank 0 (host") == 4 and "nope.idx" in out
    assert "step 1/" not in out  # nothing trained


def test_world_size_mismatch_is_a_user_error() -> None:
    run = hexiscale("train", "--plan", str(PLAN4), "--steps", "1", env={"WORLD_SIZE": "2", "RANK": "0"})
    assert run.returncode == 1
    assert "WORLD_SIZE: 2 processes were started, the plan has 4 ranks" in run.stderr


SEED_FLAGS = ("--cluster", str(CLUSTER), "--model", "tiny", "--hetero_configs", "[[1]]", "--layer_partitions",
              "[[4]]", "--global_bsz_size", "4", "--chunks", "2", "--dtype", "fp32", "--device", "cpu")


def test_train_with_seed_style_flags_on_a_token_file(tmp_path: Path) -> None:
    jsonl = tmp_path / "m.jsonl"
    write_token_file(tmp_path / "corpus", [list(range(i, i + 100)) for i in range(0, 150, 10)])
    run = hexiscale("train", *SEED_FLAGS, "--steps", "2", "--data", str(tmp_path / "corpus"),
                    "--log-jsonl", str(jsonl), env={"WORLD_SIZE": "1"})
    assert run.returncode == 0, run.stdout + run.stderr
    assert "step 2/2 pipeline 0 rank 0" in run.stdout and f"data {tmp_path / 'corpus'}" in run.stdout
    rec = [json.loads(x) for x in jsonl.read_text().splitlines()]
    assert [r["step"] for r in rec] == [1, 2] and rec[0]["tokens"] == 4 * 32 and rec[0]["mfu"] is None


def test_resume_from_a_checkpoint_of_another_model(tmp_path: Path) -> None:
    ck = tmp_path / "ck" / "step-000003"
    ck.mkdir(parents=True)
    other = {**PRESETS["tiny"].to_dict(), "num_layers": 8}
    ck.joinpath("meta.json").write_text(json.dumps({"format": "hexiscale.ckpt/2", "model": other, "step": 3,
                                                    "extra": {}}))
    run = hexiscale("train", *SEED_FLAGS, "--steps", "4", "--resume", str(tmp_path / "ck"), env={"WORLD_SIZE": "1"})
    assert run.returncode == 1
    assert "differ in num_layers" in run.stderr and "nothing was trained" in run.stderr
