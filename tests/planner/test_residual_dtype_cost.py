"""``options.residual_dtype`` in the plan file, the cost model and the search: a bf16 residual
stream saves ``2·h`` bytes a token of every layer's saved input and the norms' and residual adds'
traffic; the plan says so, the estimate counts it, ``hexiscale plan --residual-dtype`` writes it."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from hexiscale.cli.main import main
from planner.cost import ProfileSet, estimate
from planner.cost.memory import compiled_layer_activation_bytes, layer_activation_bytes
from planner.cost.params import DEFAULT_PARAMS
from planner.errors import SpecError
from planner.plan import load_plan, plan_from_dict, plan_to_dict
from planner.search.config import PlannerConfig
from planner.search.planner import search
from tests.planner._cost_fixtures import CATALOG, MODEL, cluster, plan

ROOT = Path(__file__).resolve().parents[2]
LOW = replace(DEFAULT_PARAMS, residual_in_compute_dtype=True)


def test_the_plan_file_keeps_the_option_and_omits_the_default() -> None:
    p = plan([(8, 2, [(["a:0"], 8)])], residual_dtype="bf16")
    data = plan_to_dict(p)
    assert data["options"]["residual_dtype"] == "bf16"
    assert plan_from_dict(data).options.residual_dtype == "bf16"
    assert "residual_dtype" not in plan_to_dict(plan([(8, 2, [(["a:0"], 8)])]))["options"]


def test_a_residual_dtype_other_than_fp32_or_the_compute_dtype_is_refused() -> None:
    with pytest.raises(SpecError, match=r"options\.residual_dtype.*use fp32 or fp32"):
        plan([(8, 2, [(["a:0"], 8)])], dtype="fp32", residual_dtype="bf16")
    with pytest.raises(SpecError, match="--residual-dtype"):
        PlannerConfig(dtype="fp32", residual_dtype="bf16").check()


@pytest.mark.parametrize("compile", [False, True])
def test_each_layer_keeps_two_bytes_a_token_less_of_its_input(compile: bool) -> None:
    t = 2 * MODEL.seq_len
    fn = compiled_layer_activation_bytes if compile else layer_activation_bytes
    args = (MODEL, 2, 1, "bf16") if compile else (MODEL, 2, 1, "bf16", "none")
    # compiled: the layer input; eager: both norms' inputs (their outputs need no cast either)
    saved = t * MODEL.hidden_size * 2 if compile else t * MODEL.hidden_size * (2 * 2 + 3 * 2)
    assert fn(*args, params=DEFAULT_PARAMS) - fn(*args, params=LOW) == saved
    full = layer_activation_bytes(MODEL, 2, 1, "bf16", "full", params=DEFAULT_PARAMS)
    assert full - layer_activation_bytes(MODEL, 2, 1, "bf16", "full", params=LOW) == t * MODEL.hidden_size * 2


def test_the_estimate_counts_the_option() -> None:
    c = cluster([("a", "fast", 2, 100.0)])
    base = plan([(8, 4, [(["a:0"], 4), (["a:1"], 4)])], compile=True)
    low = replace(base, options=replace(base.options, residual_dtype="bf16"))
    profiles = ProfileSet(CATALOG)
    e0, e1 = estimate(base, c, profiles), estimate(low, c, profiles)
    assert e1.step_time_s < e0.step_time_s  # less norm and residual traffic
    for dev in ("a:0", "a:1"):
        assert e1.memory_gib[dev] < e0.memory_gib[dev]
    # the same numbers as a profile set built with the option's parameters
    direct = estimate(low, c, ProfileSet(CATALOG, LOW))
    assert direct.step_time_s == e1.step_time_s and direct.memory_gib == e1.memory_gib


def test_the_search_costs_and_writes_the_option() -> None:
    c = cluster([("a", "fast", 2, 100.0)])
    cfg = PlannerConfig(time_limit_s=5, residual_dtype="bf16")
    result = search(c, MODEL, 8, config=cfg, profiles=ProfileSet(CATALOG))
    assert result.plan.options.residual_dtype == "bf16"
    again = estimate(result.plan, c, ProfileSet(CATALOG))
    assert again.step_time_s == pytest.approx(result.estimate.step_time_s, rel=1e-9)


def test_hexiscale_plan_flag(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cl = ROOT / "examples" / "clusters" / "demo-cpu-6.yaml"
    out = tmp_path / "plan.json"
    assert main(["plan", str(cl), "--model", "tiny", "--global-batch", "8", "--time-limit", "3",
                 "--residual-dtype", "bf16", "-o", str(out)]) == 0
    assert load_plan(out).options.residual_dtype == "bf16"
    assert "residual bf16" in capsys.readouterr().out  # the plan table says so
    assert main(["estimate", str(out), "--cluster", str(cl)]) == 0
    assert "bf16 residual (options.residual_dtype)" in capsys.readouterr().out
    assert main(["plan", str(cl), "--model", "tiny", "--lengths", "synthetic:github", "--step-tokens", "4096",
                 "--residual-dtype", "bf16"]) == 1
    assert "--residual-dtype" in capsys.readouterr().err
