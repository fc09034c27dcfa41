"""A plan whose schedule the cost model prices but the executor does not run (none is registered
so, today: a stand-in ``x-priced``): ``launch`` refuses it (a pool's strategies too) before any rank
starts, and a lone ``train`` in pre-flight, before any step; one line each. Interleaved 1F1B is
trained, but not where layouts switch: in a strategy pool or an elastic job it is refused in one
line before any rank starts."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import planner.plan as plan_module
from hexiscale.cli.main import main
from planner.interleave import interleaved
from planner.plan import Pipeline, Plan, PlanOptions, Stage, load_plan, plan_to_dict, save_plan
from planner.schedules import REGISTRY, Schedule
from planner.schedules.one_f_one_b import one_f_one_b_ops

ROOT = Path(__file__).resolve().parents[2]
CLUSTER = ROOT / "examples" / "clusters" / "demo-cpu-6.yaml"
MODEL = load_plan(ROOT / "examples" / "plans" / "demo-cpu-6-tiny.json").model


@pytest.fixture
def priced(monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setitem(REGISTRY, "x-priced", Schedule("x-priced", one_f_one_b_ops, trained=False))
    monkeypatch.setattr(plan_module, "SCHEDULES", (*plan_module.SCHEDULES, "x-priced"))
    return "x-priced"


def _plan(schedule: str, devices: int) -> Plan:
    cut = [MODEL.num_layers * i // devices for i in range(devices + 1)]
    stages = tuple(Stage((f"a100:{i}",), 1, (cut[i], cut[i + 1])) for i in range(devices))
    pipe = Pipeline(4, 2, stages, "1f1b")
    pipe = interleaved(pipe) if schedule == "interleaved-1f1b" else Pipeline(4, 2, stages, schedule)
    return Plan(MODEL, 4, (pipe,), PlanOptions(dtype="fp32"), "demo-cpu-6")


def _one_error(capsys: pytest.CaptureFixture[str], field: str, said: str) -> None:
    err = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert len(err) == 1 and f"{field}: {said}" in err[0], err


def test_train_refuses_a_priced_schedule_in_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, priced: str,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    for key in ("WORLD_SIZE", "RANK", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "HEXISCALE_FAULT"):
        monkeypatch.delenv(key, raising=False)
    path, log = tmp_path / "x.json", tmp_path / "m.jsonl"
    save_plan(_plan(priced, 1), path)
    assert main(["train", "--plan", str(path), "--cluster", str(CLUSTER), "--device", "cpu", "--steps", "1",
                 "--log-jsonl", str(log)]) == 1
    _one_error(capsys, "pipelines[0].schedule", f"schedule '{priced}' is priced but not trained yet")
    assert not log.exists() or not log.read_text().strip()


def test_launch_refuses_before_any_rank_starts(tmp_path: Path, priced: str, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "x.json"
    save_plan(_plan(priced, 2), path)
    assert main(["launch", str(path), "--cluster", str(CLUSTER), "--local", "--dry-run"]) == 1
    _one_error(capsys, "pipelines[0].schedule", f"schedule '{priced}' is priced but not trained yet")
    pool = tmp_path / "pool.json"
    strategies = [{"name": n, "plan": plan_to_dict(_plan(n, 2))} for n in ("zb-h1", priced)]
    pool.write_text(json.dumps({"format": "hexiscale.pool/1", "context": MODEL.seq_len, "home": 0,
                                "strategies": strategies}))
    assert main(["launch", str(pool), "--cluster", str(CLUSTER), "--local", "--dry-run"]) == 1
    _one_error(capsys, "strategies[1].plan.pipelines[0].schedule", f"schedule '{priced}' is priced but not trained")


def test_interleaved_is_refused_where_layouts_switch(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "il.json"
    save_plan(_plan("interleaved-1f1b", 2), path)
    assert main(["launch", str(path), "--cluster", str(CLUSTER), "--local", "--dry-run"]) == 0  # trained alone
    capsys.readouterr()
    assert main(["launch", str(path), "--cluster", str(CLUSTER), "--local", "--elastic", "--dry-run"]) == 1
    _one_error(capsys, "pipelines[0].schedule", "interleaved-1f1b is not trained in an elastic job")
    pool = tmp_path / "pool.json"
    strategies = [{"name": n, "plan": plan_to_dict(_plan(n, 2))} for n in ("1f1b", "interleaved-1f1b")]
    pool.write_text(json.dumps({"format": "hexiscale.pool/1", "context": MODEL.seq_len, "home": 0,
                                "strategies": strategies}))
    assert main(["launch", str(pool), "--cluster", str(CLUSTER), "--local", "--dry-run"]) == 1
    _one_error(capsys, "strategies[1].plan.pipelines[0].schedule", "interleaved-1f1b is not trained in a strategy pool")
