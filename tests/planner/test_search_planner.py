"""The planner end to end: plans validate and fit, the 2-stage layer split is the analytic
optimum, infeasible inputs explain themselves, results are deterministic, the planner matches the
exhaustive enumerator on a tiny cluster and beats the seed-style baseline."""

from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path

import pytest

from planner.cluster import load_cluster, parse_cluster
from planner.cost import estimate
from planner.errors import PlanInfeasible, SpecError
from planner.model import PRESETS
from planner.plan import plan_to_dict
from planner.search import PlannerConfig, search
from planner.search.baselines import seed_style
from planner.search.candidate import evaluate, stage_costs
from planner.search.enumerate import enumerate_plans
from planner.search.graph import make_units
from planner.search.oracle import Oracle, Setting
from planner.seed_flags import plan_to_flags
from planner.validate import validate

ROOT = Path(__file__).resolve().parents[2]
CLUSTERS = ROOT / "examples" / "clusters"
FAST = PlannerConfig(time_limit_s=20, max_evaluations=250)
SMALL = replace(PRESETS["llama-1.3b"], seq_len=1024)


def two_gpu_cluster(gpu_a: str, gpu_b: str) -> object:
    return parse_cluster({
        "name": "pair",
        "nodes": [{"name": "a", "gpu": gpu_a, "gpus": 1, "intra_link": {"bandwidth_GBps": 100}},
                  {"name": "b", "gpu": gpu_b, "gpus": 1, "intra_link": {"bandwidth_GBps": 100}}],
        "inter_node": {"kind": "infiniband", "bandwidth_GBps": 25, "latency_us": 5}})


@pytest.mark.parametrize("name,model,batch", [("demo-cpu-6", "llama2-7b", 16), ("seed-32gpu-4types", "llama-1.3b", 32),
                                              ("seed-uneven-nodes", "llama2-13b", 64)])
def test_plans_validate_fit_and_carry_their_estimate(name: str, model: str, batch: int) -> None:
    cluster = load_cluster(CLUSTERS / f"{name}.yaml")
    result = search(cluster, PRESETS[model], batch, config=FAST)
    plan = result.plan
    validate(plan, cluster)
    assert plan.global_batch_size == batch
    assert plan.estimate is not None and plan.estimate["step_time_s"] > 0
    again = estimate(plan, cluster)
    assert again.fits
    assert again.step_time_s == pytest.approx(plan.estimate["step_time_s"])
    flags = plan_to_flags(plan, cluster)  # each node's GPUs in ascending order: always expressible here
    assert flags.devices_id is not None and sum(flags.global_bsz_size) == batch


def test_two_stage_split_matches_the_analytic_optimum() -> None:
    """A100 then RTX 3090 as one 2-stage pipeline: the split sits at the crossing of the two
    stages' linear times a_i·n + e_i (the steady state runs at the slower one)."""
    cluster = two_gpu_cluster("a100-sxm-80g", "rtx3090")
    oracle = Oracle(cluster, SMALL)
    units = make_units(cluster, {"a": 1, "b": 1})
    s = Setting(micro_batch=1, recompute="none", zero=0)
    B = 64
    cand = evaluate(oracle, [units], s, B, use_ilp=True)
    assert cand.feasible
    (layout,) = cand.layouts
    m = layout.micro_batches
    c0, c1 = stage_costs(oracle, units, m, s, 1)
    L = SMALL.num_layers
    cross = (c1.per_layer_s * L + c1.fixed_s - c0.fixed_s) / (c0.per_layer_s + c1.per_layer_s)

    def total(n: int) -> float:
        t = (c0.time(n), c1.time(L - n))
        return (m - 1) * max(t) + sum(t)

    best = min((n for n in (math.floor(cross), math.ceil(cross)) if 1 <= n < L), key=total)
    assert total(layout.counts[0]) == pytest.approx(total(best))
    assert layout.counts[0] > L // 2  # the A100 is faster: it takes more layers
    assert layout.batch == B


def test_infeasible_names_the_stage_and_the_fix() -> None:
    cluster = load_cluster(CLUSTERS / "demo-cpu-6.yaml")
    with pytest.raises(PlanInfeasible) as err:
        search(cluster, PRESETS["llama2-70b"], 32, config=FAST)
    text = str(err.value)
    assert "stage 0 (a100:0" in text and "fits" in text and "of 80 layers" in text
    assert "add at least" in text and "a100-sxm-80g" in text
    restricted = replace(FAST, recompute=("none",), zero=(0,), micro_batch_sizes=(4,))
    with pytest.raises(PlanInfeasible) as err2:  # (at seq 4096 no micro-batch size fits without recompute)
        search(cluster, replace(PRESETS["llama2-7b"], seq_len=2048), 32, config=restricted)
    assert err2.value.path == "options" and "stage" in err2.value.message
    assert err2.value.hint.startswith("allow a smaller micro-batch size")  # the smallest change comes first
    no_mbs_choice = replace(restricted, micro_batch_sizes=(1,), recompute=("none",), zero=(0,))
    big = replace(PRESETS["llama2-7b"], seq_len=8192)
    with pytest.raises(PlanInfeasible) as err3:
        search(cluster, big, 32, config=no_mbs_choice)
    assert err3.value.path == "options" and "allow" in err3.value.hint


def test_bad_requests_are_spec_errors() -> None:
    cluster = load_cluster(CLUSTERS / "demo-cpu-6.yaml")
    with pytest.raises(SpecError, match="global-batch"):
        search(cluster, SMALL, 0, config=FAST)
    with pytest.raises(SpecError, match="objective"):
        search(cluster, SMALL, 8, config=replace(FAST, objective="latency"))


def test_planning_is_deterministic_for_a_fixed_seed() -> None:
    cluster = load_cluster(CLUSTERS / "seed-uneven-nodes.yaml")
    cfg = replace(FAST, seed=3, max_evaluations=150)
    a = search(cluster, SMALL, 48, config=cfg)
    b = search(cluster, SMALL, 48, config=cfg)
    assert not a.cut_short and not b.cut_short
    assert plan_to_dict(a.plan) == plan_to_dict(b.plan)
    assert a.log == b.log


def test_matches_the_enumerated_optimum_on_a_tiny_cluster() -> None:
    cluster = parse_cluster({
        "name": "tiny-mix",
        "nodes": [{"name": "a", "gpu": "a100-sxm-80g", "gpus": 2, "intra_link": {"bandwidth_GBps": 300}},
                  {"name": "r", "gpu": "rtx4090", "gpus": 2, "intra_link": {"bandwidth_GBps": 20}}],
        "inter_node": {"bandwidth_GBps": 3.125, "latency_us": 50}})
    cfg = replace(FAST, micro_batch_sizes=(1, 2), max_evaluations=400)
    planned = search(cluster, SMALL, 32, config=cfg)
    optimum = enumerate_plans(cluster, SMALL, 32, config=cfg, finalists=6)
    assert planned.estimate.step_time_s <= optimum.best.estimate.step_time_s * 1.01


def test_beats_the_seed_style_baseline() -> None:
    cluster = load_cluster(CLUSTERS / "seed-32gpu-4types.yaml")
    ours = search(cluster, SMALL, 64, config=FAST)
    base = seed_style(cluster, SMALL, 64, trials=10, seed=0)
    assert base.estimate is not None
    assert ours.estimate.tokens_per_s > base.tokens_per_s


def test_small_batch_leaves_devices_idle_instead_of_failing() -> None:
    """32 GPUs, a 4-layer model and 2 samples: at most 2 pipelines of 4 stages can be used."""
    cluster = load_cluster(CLUSTERS / "seed-32gpu-4types.yaml")
    result = search(cluster, PRESETS["tiny"], 2, config=FAST)
    validate(result.plan, cluster)
    assert result.plan.world_size <= 2 * 4 * 8
    assert len(result.plan.pipelines) <= 2
    assert any("idle" in line for line in result.log)
