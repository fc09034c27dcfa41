"""``hexiscale train --compile`` and a plan's ``options.compile``: the flag travels to launched ranks
(``train_argv``), a CPU run stays eager and says so (for the flag and for the plan's option), and a
strategy pool refuses either in one line. Whether compiled blocks train
like eager ones on GPUs is ``tests/gpu/test_gpu_smoke.py``'s (compile_blocks) and the 4-GPU job
test's to show."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from executor.train.config import TrainConfig
from hexiscale.cli.main import main
from hexiscale.cli.train_args import train_argv
from planner.plan import Pipeline, Plan, PlanOptions, Stage, load_plan, save_plan

ROOT = Path(__file__).resolve().parents[2]
POOL = ROOT / "tests" / "data" / "pool-tiny-h100x4.json"
CLUSTER = ROOT / "examples" / "clusters" / "h100x4.yaml"
SEED_FLAGS = ["--cluster", str(ROOT / "examples" / "clusters" / "demo-cpu-6.yaml"), "--model", "tiny",
              "--hetero_configs", "[[1]]", "--layer_partitions", "[[4]]", "--global_bsz_size", "4", "--chunks", "2",
              "--dtype", "fp32", "--device", "cpu"]


def test_the_flag_travels_to_launched_ranks() -> None:
    assert "--compile" in train_argv(TrainConfig.flat(compile=True))
    assert "--compile" not in train_argv(TrainConfig.flat())


def test_a_cpu_run_stays_eager_and_says_so(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    for key in ("WORLD_SIZE", "RANK", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "HEXISCALE_FAULT"):
        monkeypatch.delenv(key, raising=False)
    log = tmp_path / "m.jsonl"
    assert main(["train", *SEED_FLAGS, "--steps", "2", "--compile", "--log-jsonl", str(log)]) == 0
    assert "--compile: the CPU runs eager" in capsys.readouterr().out
    assert [json.loads(x)["step"] for x in log.read_text().splitlines()] == [1, 2]


def test_a_plan_with_compile_on_cpu_stays_eager_says_so_and_trains(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    for key in ("WORLD_SIZE", "RANK", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "HEXISCALE_FAULT"):
        monkeypatch.delenv(key, raising=False)
    model = load_plan(ROOT / "examples" / "plans" / "demo-cpu-6-tiny.json").model
    plan_path, log = tmp_path / "compiled.json", tmp_path / "m.jsonl"
    save_plan(Plan(model, 4, (Pipeline(4, 2, (Stage(("a100:0",), 1, (0, model.num_layers)),)),),
                   PlanOptions(dtype="fp32", compile=True), "demo-cpu-6"), plan_path)
    assert '"compile": true' in plan_path.read_text()
    assert main(["train", "--plan", str(plan_path), "--cluster", str(ROOT / "examples" / "clusters" /
                 "demo-cpu-6.yaml"), "--device", "cpu", "--steps", "2", "--log-jsonl", str(log)]) == 0
    out = capsys.readouterr().out
    assert "options.compile: the CPU runs eager" in out and "--compile:" not in out
    assert [json.loads(x)["step"] for x in log.read_text().splitlines()] == [1, 2]


def test_a_strategy_pool_with_compiled_plans_refuses_them(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    for key in ("WORLD_SIZE", "RANK", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "HEXISCALE_FAULT"):
        monkeypatch.delenv(key, raising=False)
    pool = json.loads(POOL.read_text())
    pool["strategies"][-1]["plan"].setdefault("options", {})["compile"] = True
    path = tmp_path / "pool.json"
    path.write_text(json.dumps(pool))
    assert main(["train", "--plan", str(path), "--cluster", str(CLUSTER), "--step-tokens", "4096",
                 "--lengths", "synthetic:github", "--device", "cpu"]) == 1
    err = capsys.readouterr().err.strip()
    n = len(pool["strategies"]) - 1
    assert f"error: strategies[{n}].plan.options.compile: is not supported with a strategy pool" in err
    assert "\n" not in err


def test_a_strategy_pool_refuses_it(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    for key in ("WORLD_SIZE", "RANK", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "HEXISCALE_FAULT"):
        monkeypatch.delenv(key, raising=False)
    assert main(["train", "--plan", str(POOL), "--cluster", str(CLUSTER), "--compile", "--step-tokens", "4096",
                 "--lengths", "synthetic:github", "--device", "cpu"]) == 1
    err = capsys.readouterr().err.strip()
    assert "error: --compile: not available with a strategy pool" in err and "\n" not in err
