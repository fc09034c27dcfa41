"""``hexiscale launch --local`` on 4 GPUs (NCCL): an asymmetric plan (TP 2 -> 1 next to a one-GPU
pipeline) trains, and a failing rank stops the job naming the right rank — on NCCL a waiting rank
blocks in the device synchronisation, not in a Python communication call (:mod:`executor.host_sync`).
Skipped without 4 CUDA devices (CPU CI); ``make test-gpu`` runs it on the device machine."""

from __future__ import annotations

import pytest
import torch
from test_train_jobs import PLAN4, hexiscale, losses

pytestmark = [pytest.mark.gpu, pytest.mark.slow,
              pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.device_count() < 4,
                                 reason="needs 4 CUDA devices")]


def test_gpu_job_matches_the_cpu_job(tmp_path) -> None:
    gpu, cpu = tmp_path / "gpu.jsonl", tmp_path / "cpu.jsonl"
    for device, log in (("cuda", gpu), ("cpu", cpu)):
        run = hexiscale("launch", str(PLAN4), "--local", "--device", device, "--", "--steps", "4",
                        "--log-jsonl", str(log), "--lr", "3e-3", "--warmup", "1")
        assert run.returncode == 0, run.stdout + run.stderr
    assert losses(gpu) == pytest.approx(losses(cpu), rel=1e-4)


def test_compiled_gpu_job_matches_the_eager_one(tmp_path) -> None:
    """``--compile`` reaches every launched rank (TP 2 -> 1 stages and a one-GPU pipeline) and trains as eager."""
    runs = {}
    for flags in ((), ("--compile",)):
        log = tmp_path / f"{len(flags)}.jsonl"
        run = hexiscale("launch", str(PLAN4), "--local", "--device", "cuda", "--", "--steps", "4",
                        "--log-jsonl", str(log), "--lr", "3e-3", "--warmup", "1", *flags)
        assert run.returncode == 0, run.stdout + run.stderr
        runs[flags] = (losses(log), run.stdout)
    assert "blocks of rank 0's stage compiled" in runs[("--compile",)][1], runs[("--compile",)][1]
    assert runs[("--compile",)][0] == pytest.approx(runs[()][0], rel=1e-4)


@pytest.mark.parametrize("kind", ["hang", "kill"])
def test_failed_rank_stops_the_gpu_job(kind: str) -> None:
    run = hexiscale("launch", str(PLAN4), "--local", "--device", "cuda", "--grace", "120", "--", "--steps", "6",
                    "--dead-after", "8", "--hang-after", "15", "--heartbeat", "0.5",
                    env={"HEXISCALE_FAULT": f"2:2:{kind}"})
    out = run.stdout + run.stderr
    assert run.returncode == 3, out
    assert "stopping them" not in out
    survivors = (0, 1, 3) if kind == "kill" else (0, 1, 2, 3)
    assert out.count("stopping: rank 2 (host ") == len(survivors) and "failed at step 3" in out, out
    if kind == "hang":
        assert "stuck in maybe_inject@faults.py" in out, out
    else:
        assert "no heartbeat" in out, out
