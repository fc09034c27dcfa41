"""``convert --to-flags`` then ``--from-flags`` gives the plan back: the layout, the model and every
option the seed flags carry (dtype first: an fp32 plan came back bf16); what they cannot carry is
said on stderr."""

from __future__ import annotations

import json
import shlex
from dataclasses import replace
from pathlib import Path

import pytest

from hexiscale.cli.main import main
from planner.model import PRESETS
from planner.plan import PlanOptions, load_plan, plan_to_dict, save_plan

ROOT = Path(__file__).resolve().parents[2]
PLAN = ROOT / "examples" / "plans" / "demo-cpu-6-tiny.json"
CLUSTER = str(ROOT / "examples" / "clusters" / "demo-cpu-6.yaml")


def _round_trip(path: Path, capsys: pytest.CaptureFixture[str]) -> tuple[dict, str]:  # type: ignore[type-arg]
    assert main(["convert", "--to-flags", str(path), "--cluster", CLUSTER]) == 0
    printed = capsys.readouterr()
    assert main(["convert", "--from-flags", "--cluster", CLUSTER, *shlex.split(printed.out)]) == 0
    return json.loads(capsys.readouterr().out), printed.err


@pytest.mark.parametrize("options", [PlanOptions(dtype="fp32"), PlanOptions(dtype="fp16", recompute="full", zero=1),
                                     PlanOptions(recompute="selective")])
@pytest.mark.parametrize("seq_len", [None, 64])
def test_round_trip_keeps_the_plan(options: PlanOptions, seq_len: int | None, tmp_path: Path,
                                   capsys: pytest.CaptureFixture[str]) -> None:
    plan = load_plan(PLAN)
    plan = replace(plan, options=options, model=replace(plan.model, seq_len=seq_len or plan.model.seq_len),
                   estimate=None)
    save_plan(plan, tmp_path / "p.json")
    back, err = _round_trip(tmp_path / "p.json", capsys)
    assert back == plan_to_dict(plan) and err == ""


def test_a_cut_preset_round_trips(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    plan = load_plan(PLAN)
    model = replace(PRESETS["llama2-7b"], name="llama2-7b-L4", num_layers=4)
    plan = replace(plan, model=model, estimate=None)
    save_plan(plan, tmp_path / "p.json")
    assert _round_trip(tmp_path / "p.json", capsys)[0]["model"] == plan_to_dict(plan)["model"]


def test_what_the_flags_cannot_carry_is_said(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    plan = replace(load_plan(PLAN), options=PlanOptions(compile=True, residual_dtype="bf16"), estimate=None)
    save_plan(plan, tmp_path / "p.json")
    assert main(["convert", "--to-flags", str(tmp_path / "p.json")]) == 0
    err = capsys.readouterr().err
    assert "not carried" in err and "compile" in err and "residual dtype bf16" in err
