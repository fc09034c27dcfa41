"""``options.compile`` priced in time as well as memory (issue 32): compiled layers take
``compiled_layer_ratio`` of their eager time where a calibration measured it for the GPU type; where
none did, the step time stays eager and the estimate's notes say so (no invented speed-up); the
packaged H100 calibration carries the ratio of a recorded H100 run; ``hexiscale estimate`` prints it."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from hexiscale.cli.main import main
from planner.calibration.local import resolve_profiles
from planner.cluster import load_cluster
from planner.cost import ProfileSet, estimate
from planner.cost.params import DEFAULT_PARAMS
from planner.model import PRESETS
from planner.plan import Pipeline, Plan, PlanOptions, Stage, plan_to_dict

ROOT = Path(__file__).resolve().parents[2]
CLUSTER = ROOT / "examples" / "clusters" / "h100x4.yaml"
MODEL = replace(PRESETS["llama-1.3b"], seq_len=2048)


def dp2(compile: bool) -> Plan:
    pipes = tuple(Pipeline(8, 4, (Stage((f"h100:{k}",), 1, (0, MODEL.num_layers)),)) for k in range(2))
    return Plan(MODEL, 16, pipes, PlanOptions(compile=compile))


def test_a_measured_ratio_scales_the_layers_and_says_so() -> None:
    cluster = load_cluster(CLUSTER)
    profiles = ProfileSet(cluster.catalog, replace(DEFAULT_PARAMS, compiled_layer_ratio=0.6))
    eager, compiled = estimate(dp2(False), cluster, profiles), estimate(dp2(True), cluster, profiles)
    layer = [profiles.for_options(PlanOptions(compile=c)).get("h100-sxm").layer_time(MODEL, 2) for c in (False, True)]
    assert layer[1].forward_s == pytest.approx(0.6 * layer[0].forward_s)
    assert layer[1].backward_s == pytest.approx(0.6 * layer[0].backward_s)
    assert compiled.step_time_s < eager.step_time_s
    assert compiled.notes == ["options.compile: h100-sxm layers priced at 0.600 x their eager time (measured "
                              "compiled/eager ratio, default terms)"]
    assert eager.notes == [] and "notes" not in eager.to_dict() and compiled.to_dict()["notes"] == compiled.notes


def test_without_a_ratio_time_stays_eager_memory_compiled_and_the_notes_say_so() -> None:
    cluster = load_cluster(CLUSTER)
    profiles = ProfileSet(cluster.catalog, DEFAULT_PARAMS)
    eager, compiled = estimate(dp2(False), cluster, profiles), estimate(dp2(True), cluster, profiles)
    assert compiled.step_time_s == eager.step_time_s
    assert compiled.memory_gib["h100:0"] < eager.memory_gib["h100:0"]
    assert compiled.notes == ["options.compile: no measured compiled/eager ratio for h100-sxm (run 'hexiscale "
                              "calibrate' on a CUDA host of that type): its step time is priced as eager, its "
                              "memory as compiled"]


def test_the_packaged_h100_calibration_prices_compiled_plans_from_its_recorded_run() -> None:
    cal = json.loads((ROOT / "planner/profiles/calibration/h100.json").read_text())
    source = json.loads((ROOT / cal["fits"]["compile"]["source"]).read_text())
    steps = {r["config"]: r["step_time_s"] for r in source["results"]}
    assert cal["params"]["compiled_layer_ratio"] == pytest.approx(steps["1gpu-compile"] / steps["1gpu"], abs=1e-4)
    cluster = load_cluster(CLUSTER)
    profiles = resolve_profiles(cluster).profiles
    assert estimate(dp2(True), cluster, profiles).step_time_s < estimate(dp2(False), cluster, profiles).step_time_s


def test_estimate_prints_the_note(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(plan_to_dict(dp2(True))))
    assert main(["estimate", str(path), "--cluster", str(CLUSTER)]) == 0
    assert "note: options.compile: h100-sxm layers priced at 0.685 x their eager time" in capsys.readouterr().out
