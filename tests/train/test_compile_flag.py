"""``hexiscale train --compile``: the flag travels to launched ranks (``train_argv``), a CPU run
stays eager and says so, and a strategy pool refuses it in one line. Whether compiled blocks train
like eager ones on GPUs is ``tests/gpu/test_gpu_smoke.py``'s (compile_blocks) and the 4-GPU job
test's to show."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from executor.train_config import TrainConfig
from hexiscale.cli.main import main
from hexiscale.cli.train_args import train_argv

ROOT = Path(__file__).resolve().parents[2]
POOL = ROOT / "tests" / "data" / "pool-tiny-h100x4.json"
CLUSTER = ROOT / "examples" / "clusters" / "h100x4.yaml"
SEED_FLAGS = ["--cluster", str(ROOT / "examples" / "clusters" / "demo-cpu-6.yaml"), "--model", "tiny",
              "--hetero_configs", "[[1]]", "--layer_partitions", "[[4]]", "--global_bsz_size", "4", "--chunks", "2",
              "--dtype", "fp32", "--device", "cpu"]


def test_the_flag_travels_to_launched_ranks() -> None:
    assert "--compile" in train_argv(TrainConfig(compile=True))
    assert "--compile" not in train_argv(TrainConfig())


def test_a_cpu_run_stays_eager_and_says_so(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    for key in ("WORLD_SIZE", "RANK", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "HEXISCALE_FAULT"):
        monkeypatch.delenv(key, raising=False)
    log = tmp_path / "m.jsonl"
    assert main(["train", *SEED_FLAGS, "--steps", "2", "--compile", "--log-jsonl", str(log)]) == 0
    assert "--compile: the CPU runs eager" in capsys.readouterr().out
    assert [json.loads(x)["step"] for x in log.read_text().splitlines()] == [1, 2]


def test_a_strategy_pool_refuses_it(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    for key in ("WORLD_SIZE", "RANK", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "HEXISCALE_FAULT"):
        monkeypatch.delenv(key, raising=False)
    assert main(["train", "--plan", str(POOL), "--cluster", str(CLUSTER), "--compile", "--step-tokens", "4096",
                 "--lengths", "synthetic:github", "--device", "cpu"]) == 1
    err = capsys.readouterr().err.strip()
    assert "error: --compile: is not supported with a strategy pool" in err and "\n" not in err
