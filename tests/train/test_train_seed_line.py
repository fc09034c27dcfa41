"""``hexiscale train`` with a seed user's launch line and no launcher around it: it starts the
layout's ranks on this machine and runs --run-iter // --accum-iter optimizer steps."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from executor.job.spawn import free_port
from tests.train.test_train_jobs import hexiscale

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("hexiscale-jobs")]


def test_seed_line_trains_here(tmp_path: Path) -> None:
    log = tmp_path / "m.jsonl"
    run = hexiscale("train", "--model-size", "tiny", "--layer-num", "4", "--micro_batch_num", "1",
                    "--global_batch_size", "2", "--hetero_configs", "[[1, 2, 1],]", "--layer_partitions", "[[1, 2, 1]]",
                    "--devices_id", "[[[0], [0, 0], [0]],]", "--accum-iter", "2", "--run-iter", "5",
                    "--master_addr", "127.0.0.1", "--master_port", str(free_port()), "--current_device", "0",
                    "--device", "cpu", "--dtype", "fp32", "--log-jsonl", str(log))
    assert run.returncode == 0, run.stdout + run.stderr
    assert "starting the plan's 4 ranks here" in run.stderr and "--run-iter 5: 2 optimizer steps" in run.stderr
    records = [json.loads(x) for x in log.read_text().splitlines()]
    # 2 steps, each of accum-iter 2 x batch 2 = 4 sequences of the tiny model's 32 tokens
    assert [r["step"] for r in records] == [1, 2] and records[0]["tokens"] == 4 * 32
    assert "step 2/2 pipeline 0 rank 0" in run.stdout
