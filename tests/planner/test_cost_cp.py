"""The cost model prices context parallelism (planner.cost.context): properties a cp2 stage must
have against the tp2 and the one-device stage of the same layers at long sequences."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from hexiscale.cli.cmd_estimate import advice
from planner.cluster import Link, load_cluster
from planner.cost import estimate
from planner.cost.context import cp_comm_time
from planner.cost.gradsync import stage_owners, sync_groups
from planner.cost.memory import stage_params
from planner.model import ModelSpec
from planner.plan import Pipeline, Plan, PlanOptions, Stage
from planner.state_layout import zero_sharded

ROOT = Path(__file__).resolve().parents[2]
CLUSTER = load_cluster(ROOT / "examples" / "clusters" / "h100x4.yaml")
LONG = ModelSpec("llama-1.3b", 24, 2048, 5632, 16, 16, 32000, 65536)
DEVS = ("h100:0", "h100:1")


def _plan(tp: int, cp: int, *, recompute: str = "none", zero: int = 0, model: ModelSpec = LONG) -> Plan:
    devs = DEVS[:tp * cp]
    return Plan(model, 2, (Pipeline(2, 2, (Stage(devs, tp, (0, model.num_layers), cp),)),),
                PlanOptions(recompute=recompute, zero=zero))


@pytest.mark.parametrize("recompute", ["none", "full"])
def test_cp2_memory_against_tp2_and_one_device(recompute: str) -> None:
    one = estimate(_plan(1, 1, recompute=recompute), CLUSTER).memory["h100:0"]
    tp2 = estimate(_plan(2, 1, recompute=recompute), CLUSTER).memory["h100:0"]
    cp2 = estimate(_plan(1, 2, recompute=recompute), CLUSTER).memory["h100:0"]
    # weights replicated across the CP slots, sharded by TP
    assert cp2.weights == pytest.approx(one.weights) and tp2.weights < 0.6 * one.weights
    # activations split by the sequence: at most the one-device stage's half plus the gathered K,V,
    # and below TP 2's (TP replicates the norms' inputs and the residual stream); the half itself
    # where the loss's transient, at another moment than the CP attention's backward, is the larger
    assert cp2.activations < tp2.activations
    assert 0.5 * one.activations <= cp2.activations < 0.5 * one.activations + LONG.num_layers * (
        2 * 2 * 2 * LONG.seq_len * LONG.kv_dim)


def test_zero1_shards_over_the_cp_slots_as_the_engine_does() -> None:
    """The engine shards where every parameter has two owners or more
    (planner.state_layout.zero_sharded): a lone pipeline whose stages all use CP shards over its CP
    slots; with a stage without CP it keeps whole state, and so does the estimate. (The 64K run of
    a lone cp4 stage, benchmarks/results/long_context_cuda_20261127T063113Z.json, ran before the
    engine sharded there: 69.0 GiB measured where the estimate had sharded and said 64.0.)"""
    one = estimate(_plan(1, 1, zero=1), CLUSTER).memory["h100:0"]
    cp2 = estimate(_plan(1, 2, zero=1), CLUSTER).memory["h100:0"]
    assert zero_sharded(_plan(1, 2, zero=1)) and not zero_sharded(_plan(1, 2, zero=0))
    assert cp2.optimizer == pytest.approx(one.optimizer / 2)
    mixed = Plan(LONG, 2, (Pipeline(2, 2, (Stage(DEVS, 1, (0, 12), 2), Stage(("h100:2",), 1, (12, 24)))),),
                 PlanOptions(zero=1))
    assert not zero_sharded(mixed)
    unsharded = replace(mixed, options=PlanOptions(zero=0))
    assert estimate(mixed, CLUSTER).memory["h100:0"].optimizer == pytest.approx(
        estimate(unsharded, CLUSTER).memory["h100:0"].optimizer)
    groups = sync_groups(_plan(1, 2, zero=1))
    assert groups and all(set(owners) == set(DEVS) for owners in groups)  # the two slots sum their gradients


def test_owners_count_every_cp_slot_of_every_pipeline() -> None:
    plan = Plan(LONG, 4, (Pipeline(2, 2, (Stage(DEVS, 1, (0, 24), 2),)),
                          Pipeline(2, 2, (Stage(("h100:2",), 1, (0, 12)), Stage(("h100:3",), 1, (12, 24))))),
                PlanOptions(zero=1))
    assert stage_owners(plan) == [[3], [3, 3]]
    assert {len(owners) for owners in sync_groups(plan)} == {3}
    est = estimate(plan, CLUSTER)
    # ZeRO-1: AdamW's two fp32 moments of a third of the stage's parameters
    assert est.memory["h100:0"].optimizer == pytest.approx(8.0 * stage_params(LONG, 24, 1, True, True) / 3)


def test_cp2_time_balances_the_quadratic_attention() -> None:
    one = estimate(_plan(1, 1), CLUSTER).pipelines[0].stages[0]
    cp2 = estimate(_plan(1, 2), CLUSTER).pipelines[0].stages[0]
    half_seq = ModelSpec(**{**LONG.__dict__, "seq_len": LONG.seq_len // 2})
    naive = estimate(_plan(1, 1, model=half_seq), CLUSTER).pipelines[0].stages[0]  # S/2 with its own attention
    assert one.compute_s / 2 <= cp2.compute_s < one.compute_s
    assert cp2.compute_s > naive.compute_s  # the balanced chunks attend to the whole sequence's K,V
    assert cp2.cp_comm_s > 0 and one.cp_comm_s == 0
    assert cp2.forward_s > one.forward_s / 2


def test_cp_collectives_follow_the_link_and_recompute() -> None:
    fast, slow = Link("nvlink", 450.0, 10.0), Link("pcie", 24.0, 10.0)
    kw = dict(layers=24, micro_batch=1, tp=1, cp=2, dtype="bf16", seq_len=65536)
    f_fast, b_fast, _, _ = cp_comm_time(LONG, recompute="none", link=fast, **kw)  # type: ignore[arg-type]
    f_slow, b_slow, _, _ = cp_comm_time(LONG, recompute="none", link=slow, **kw)  # type: ignore[arg-type]
    _, b_full, _, _ = cp_comm_time(LONG, recompute="full", link=fast, **kw)  # type: ignore[arg-type]
    _, b_sel, _, _ = cp_comm_time(LONG, recompute="selective", link=fast, **kw)  # type: ignore[arg-type]
    # the backward gathers K,V again (the node keeps only its own) and reduce-scatters dK,dV
    assert f_slow > 10 * f_fast and b_fast == pytest.approx(2 * f_fast)
    # the recomputed forward (the layer's or the core's) gathers K,V once more
    assert b_full == pytest.approx(3 * f_fast) and b_sel == pytest.approx(b_full)
    assert cp_comm_time(LONG, recompute="none", link=fast, **{**kw, "cp": 1}) == (0.0, 0.0, 0.0, 0.0)  # type: ignore[arg-type]


def test_cp_over_a_slow_link_is_the_bottleneck_and_the_hint_says_so() -> None:
    cluster = load_cluster(ROOT / "examples" / "clusters" / "nvlink-pcie-slow-link.yaml")
    plan = Plan(LONG, 2, (Pipeline(2, 2, (Stage(("nv:0", "pc:0"), 1, (0, 24), 2),)),), PlanOptions(recompute="full"))
    est = estimate(plan, cluster)
    assert est.bottleneck["term"] == "tp_comm" and est.pipelines[0].stages[0].cp_comm_s > est.breakdown["compute"]
    assert "CP K/V collectives" in advice(plan, cluster, est)


@pytest.mark.parametrize("last_cp", [2, 1])
def test_interleaved_cp_stages_are_priced_like_their_1f1b_twin_with_a_smaller_bubble(last_cp: int) -> None:
    """Interleaved 1F1B with a cp2 first stage and a cp2 (or tp2) last stage: each stage's compute and
    CP collectives are its 1F1B twin's (the chunks split the same layers at the same cp), the bubble
    shrinks, the p2p grows by the sends between chunks (the last stage's back to the cp2 first one,
    split over its slots) and more activations are in flight."""
    from planner.interleave import interleaved

    devs = tuple(f"h100:{i}" for i in range(4))
    last = Stage(devs[2:], 1 if last_cp > 1 else 2, (12, 24), last_cp)
    pipe = Pipeline(4, 4, (Stage(devs[:2], 1, (0, 12), 2), last))
    plain = Plan(LONG, 4, (pipe,), PlanOptions(recompute="full"))
    il = replace(plain, pipelines=(interleaved(pipe, 2),))
    e1, e2 = estimate(plain, CLUSTER), estimate(il, CLUSTER)
    for s1, s2 in zip(e1.pipelines[0].stages, e2.pipelines[0].stages):
        assert s2.compute_s == pytest.approx(s1.compute_s) and s2.cp_comm_s == pytest.approx(s1.cp_comm_s)
        assert s2.pp_comm_s > s1.pp_comm_s
    assert e2.pipelines[0].stages[0].cp_comm_s > 0 and e2.step_time_s < e1.step_time_s
    assert all(e2.memory[d].activations > e1.memory[d].activations for d in devs)
