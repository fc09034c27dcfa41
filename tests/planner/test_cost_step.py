"""The whole-plan estimate composed by hand from the tested lower-level functions."""

from __future__ import annotations

import pytest
from _cost_fixtures import MODEL, cluster, plan
from hypothesis import given, settings
from hypothesis import strategies as st

from planner.cost import (
    BREAKDOWN_TERMS,
    ProfileSet,
    activation_bytes,
    allreduce_time,
    estimate,
    gpipe_time,
    one_f_one_b_time,
    p2p_time,
    stage_params,
    stage_time,
    sync_groups,
)
from planner.errors import SpecError


def _opt(profiles: ProfileSet, gpu: str, layers: int, first: bool, last: bool, shards: int = 1) -> float:
    n = stage_params(MODEL, layers, 1, first, last) / shards
    return profiles.get(gpu).optimizer_time(n, 9 * layers + (1 if first else 0) + (2 if last else 0), "bf16")


@pytest.mark.parametrize("schedule", ["1f1b", "gpipe"])
def test_two_stage_pipeline_by_hand(schedule: str) -> None:
    c = cluster([("a", "fast", 2, 100.0)])
    p = plan([(8, 4, [(["a:0"], 4), (["a:1"], 4)])], schedule=schedule)
    profiles = ProfileSet(c.catalog)
    prof = profiles.get("fast")
    s0 = stage_time(MODEL, layers=4, first=True, last=False, micro_batch=2, tp=1, devices=[(prof, 1.0)], tp_link=None)
    s1 = stage_time(MODEL, layers=4, first=False, last=True, micro_batch=2, tp=1, devices=[(prof, 1.0)], tp_link=None)
    link = c.link("a:0", "a:1")
    x = p2p_time(activation_bytes(MODEL, 2, "bf16"), link)
    assert activation_bytes(MODEL, 2, "bf16") == 2 * MODEL.seq_len * MODEL.hidden_size * 4  # fp32 residual
    f = [s0.forward_s + x, s1.forward_s]
    b = [s0.backward_s, s1.backward_s + x]
    assert f[1] + b[1] > f[0] + b[0]  # the LM head makes the last stage the bottleneck: 1F1B closed form exact
    # each stage's first forward makes its cast-once weight copies, on the warm-up's critical path
    assert s0.copy_s > 0 and s1.copy_s > 0
    t_pipe = (one_f_one_b_time if schedule == "1f1b" else gpipe_time)(f, b, 4) + s0.copy_s + s1.copy_s
    est = estimate(p, c, profiles)
    assert est.pipelines[0].time_s == pytest.approx(t_pipe)
    norm = allreduce_time(4.0, 2, link)
    opt = max(_opt(profiles, "fast", 4, True, False), _opt(profiles, "fast", 4, False, True))
    assert est.step_time_s == pytest.approx(t_pipe + norm + opt)
    assert sum(est.breakdown[k] for k in BREAKDOWN_TERMS) == pytest.approx(est.step_time_s)
    assert est.bottleneck["stage"] == 1 and est.bottleneck["device"] == "a:1"
    assert est.breakdown["compute"] == pytest.approx(4 * (s1.forward_compute_s + s1.backward_compute_s) + s1.copy_s)
    assert est.breakdown["pp_comm"] == pytest.approx(4 * x)
    assert est.breakdown["tp_comm"] == 0.0
    assert est.pipelines[0].idle_s == 0.0
    tokens = 8 * MODEL.seq_len
    assert est.tokens_per_s == pytest.approx(tokens / est.step_time_s)
    assert est.mfu == pytest.approx(est.tokens_per_s * MODEL.model_flops_per_token() / (2 * 100e12))


@pytest.mark.parametrize("zero", [0, 1])
def test_uneven_batch_dp_pair_by_hand(zero: int) -> None:
    c = cluster([("a", "fast", 1, 100.0), ("b", "slow", 1, 100.0)], inter_bw=5.0, inter_lat=20.0)
    p = plan([(5, 5, [(["a:0"], 8)]), (3, 3, [(["b:0"], 8)])], zero=zero)
    profiles = ProfileSet(c.catalog)
    params = profiles.params
    sa = stage_time(MODEL, layers=8, first=True, last=True, micro_batch=1, tp=1,
                    devices=[(profiles.get("fast"), 1.0)], tp_link=None)
    sb = stage_time(MODEL, layers=8, first=True, last=True, micro_batch=1, tp=1,
                    devices=[(profiles.get("slow"), 1.0)], tp_link=None)
    t0, t1 = 5 * (sa.forward_s + sa.backward_s) + sa.copy_s, 3 * (sb.forward_s + sb.backward_s) + sb.copy_s
    groups = sync_groups(p)
    assert groups == {("a:0", "b:0"): pytest.approx(MODEL.param_count() * 4)}
    link = c.link("a:0", "b:0")
    sync = allreduce_time(MODEL.param_count() * 4, 2, link)
    ag = 0.0
    if zero:
        # reduce-scatter of the fp32 gradients and, after the step, all-gather of the fp32
        # parameters, each with the copies executor/parallel/zero.py makes around it (B bytes, k = 2 owners):
        # reduce side 6B + 7B/2, gather side 4B + 2B/2, at the slower device's copy bandwidth
        b_ = MODEL.param_count() * 4.0
        bw = min(profiles.get(g).device.memory_bandwidth_GBps for g in ("fast", "slow")) * 1e9
        bw *= params.memory_efficiency
        rounds = -(-b_ / 2 // (4 * 2**25))
        ag = 0.5 * sync + (4 * b_ + b_) / bw + rounds * 3 * params.kernel_overhead_s
        sync = 0.5 * sync + (6 * b_ + 3.5 * b_) / bw + rounds * 7 * params.kernel_overhead_s
    start = max(t0 - params.dp_overlap * sa.backward_s, t1 - params.dp_overlap * sb.backward_s)
    done = max(t0, t1, start + sync)
    shards = 2 if zero else 1
    opt = max(_opt(profiles, "fast", 8, True, True, shards), _opt(profiles, "slow", 8, True, True, shards))
    est = estimate(p, c, profiles)
    assert [q.time_s for q in est.pipelines] == pytest.approx([t0, t1])
    assert est.step_time_s == pytest.approx(done + allreduce_time(4.0, 2, link) + opt + ag)
    assert [q.idle_s for q in est.pipelines] == pytest.approx([done - t0, done - t1])
    assert sum(est.breakdown.values()) == pytest.approx(est.step_time_s)


def test_zero1_copies_cost_time() -> None:
    """ZeRO-1's copies around its reduce-scatter and all-gather are on the critical path: with
    them the ZeRO-1 step is not cheaper than the plain all-reduce's minus the optimizer saving."""
    from planner.cost.step import zero_copy_time

    red, gat = zero_copy_time(8e9, 4, 1e12, 0.0)
    assert red == pytest.approx((6 * 8e9 + 7 * 2e9) / 1e12) and gat == pytest.approx((4 * 8e9 + 2 * 2e9) / 1e12)
    assert zero_copy_time(8e9, 1, 1e12, 1e-5) == (0.0, 0.0)
    c = cluster([("a", "fast", 4, 400.0)])
    pipes = [(2, 1, [([f"a:{k}"], 8)]) for k in range(4)]
    plain, zero = estimate(plan(pipes), c), estimate(plan(pipes, zero=1), c)
    assert zero.breakdown["dp_sync"] > plain.breakdown["dp_sync"]


def test_finest_common_slices() -> None:
    c = cluster([("a", "fast", 2, 100.0), ("b", "fast", 4, 100.0)])
    p = plan([(4, 2, [(["a:0", "a:1"], 8)]), (4, 2, [(["b:0", "b:1", "b:2", "b:3"], 8)])])
    groups = sync_groups(p)
    assert set(groups) == {("a:0", "b:0"), ("a:0", "b:1"), ("a:1", "b:2"), ("a:1", "b:3")}
    assert sum(groups.values()) == pytest.approx(MODEL.param_count() * 4)
    h = MODEL.hidden_size
    replicated = (8 * 2 * h + h) * 4
    assert groups["a:0", "b:0"] - groups["a:0", "b:1"] == pytest.approx(replicated)
    est = estimate(p, c)
    assert est.step_time_s > 0 and est.breakdown["dp_sync"] > 0
    # one pipeline: nothing to synchronise
    assert sync_groups(plan([(4, 2, [(["a:0"], 8)])])) == {}


def test_slowdown_override_and_missing_device() -> None:
    base = cluster([("a", "fast", 2, 100.0)])
    slowed = cluster([("a", "fast", 2, 100.0)], devices={"a:1": {"slowdown": 2.0}})
    p = plan([(8, 4, [(["a:0"], 4), (["a:1"], 4)])])
    e0, e1 = estimate(p, base), estimate(p, slowed)
    assert e1.step_time_s > e0.step_time_s
    # the slowed device's GPU share of each pass doubles; its host share (issuing kernels) does not
    from planner.cost.stage import device_copies, device_split

    prof = ProfileSet(base.catalog).get("fast")
    parts = device_split(MODEL, prof, layers=4, first=False, last=True, micro_batch=2, tp=1, dtype="bf16",
                         recompute="none")
    want = 4 * sum(n * (max(2 * g.forward_s, h.forward_s) + max(2 * g.backward_s, h.backward_s)) for n, g, h in parts)
    # the first forward also makes the weight copies (GPU side slowed too, host side not)
    copies = device_copies(MODEL, prof, layers=4, first=False, last=True, tp=1, dtype="bf16")
    want += sum(n * (max(2 * (g.forward_s + cg), h.forward_s + ch) - max(2 * g.forward_s, h.forward_s))
                for (n, g, h), (cg, ch) in zip(parts, copies))
    assert e1.bottleneck["device"] == "a:1" and e1.breakdown["compute"] == pytest.approx(want)
    assert e0.breakdown["compute"] < e1.breakdown["compute"] <= 2 * e0.breakdown["compute"]
    with pytest.raises(SpecError, match="not in cluster"):
        estimate(plan([(8, 4, [(["a:0"], 4), (["zz:0"], 4)])]), base)


@settings(max_examples=15, deadline=None)
@given(st.floats(0.5, 50.0), st.floats(1.0, 8.0), st.floats(1.0, 8.0))
def test_more_bandwidth_never_slower(bw: float, inter_factor: float, intra_factor: float) -> None:
    nodes = [("a", "fast", 2, 20.0), ("b", "slow", 4, 20.0)]
    p = plan([(6, 3, [(["a:0"], 3), (["a:1"], 5)]), (2, 2, [(["b:0", "b:1"], 4), (["b:2", "b:3"], 4)])])
    before = estimate(p, cluster(nodes, inter_bw=bw))
    more = [(n, g, k, x * intra_factor) for n, g, k, x in nodes]
    after = estimate(p, cluster(more, inter_bw=bw * inter_factor))
    assert after.step_time_s <= before.step_time_s * (1 + 1e-12)


def test_to_dict_is_json() -> None:
    import json

    c = cluster([("a", "fast", 2, 100.0)])
    d = estimate(plan([(8, 4, [(["a:0"], 4), (["a:1"], 4)])]), c).to_dict()
    assert set(d["breakdown"]) == set(BREAKDOWN_TERMS)
    assert {"step_time_s", "tokens_per_s", "mfu", "hfu", "memory_gib", "oom", "bottleneck", "pipelines"} <= set(d)
    assert json.loads(json.dumps(d)) == d


def _executor_sync_bytes(p: object) -> dict[tuple[str, ...], float]:
    """The executor's own sync groups (planner/layout.py, pure) as {owner devices: fp32 bytes}."""
    import math

    from planner.layout import build_topology, logical_params

    topo = build_topology(p)  # type: ignore[arg-type]
    shapes = {i.name: i.shape for i in logical_params(topo.model)}
    device = {r.rank: r.device for r in p.ranks()}  # type: ignore[attr-defined]
    out: dict[tuple[str, ...], float] = {}
    for g in topo.sync_groups:
        n = 0
        for s in g.slices:
            shape = list(shapes[s.name])
            if s.dim is not None:
                shape[s.dim] = s.stop - s.start
            n += math.prod(shape)
        out[tuple(device[r] for r in g.ranks)] = 4.0 * n
    return out


@pytest.mark.parametrize("layout", [
    [(4, 2, [(["a:0", "a:1"], 8)]), (4, 2, [(["b:0"], 3), (["b:1", "b:2", "b:3", "b:4"], 5)])],
    [(2, 1, [(["a:0"], 2), (["a:1"], 6)]), (3, 3, [(["b:0", "b:1"], 5), (["b:2"], 3)]),
     (1, 1, [(["b:3", "b:4", "b:5", "b:6"], 8)])],
])
def test_sync_groups_match_the_executor_topology(layout: list) -> None:  # type: ignore[type-arg]
    p = plan(layout)
    mine = sync_groups(p)
    theirs = _executor_sync_bytes(p)
    assert set(mine) == set(theirs)
    for key, nbytes in theirs.items():
        assert mine[key] == pytest.approx(nbytes)


def test_sync_follows_the_executor_order_by_hand() -> None:
    """Groups (a:0, b:0) then (a:1, b:0): b:0 runs both in turn; then a:0 broadcasts the norm-scale
    gradients in its TP group (a:0, a:1)."""
    from planner.cost import group_allreduce_time, group_broadcast_time

    c = cluster([("a", "fast", 2, 100.0), ("b", "slow", 1, 100.0)], inter_bw=2.0, inter_lat=20.0)
    p = plan([(4, 2, [(["a:0", "a:1"], 8)]), (2, 2, [(["b:0"], 8)])])
    profiles = ProfileSet(c.catalog)
    est = estimate(p, c, profiles)
    t_a, t_b = (q.time_s for q in est.pipelines)
    groups = sync_groups(p)
    assert set(groups) == {("a:0", "b:0"), ("a:1", "b:0")}
    g1 = group_allreduce_time(groups["a:0", "b:0"], ("a:0", "b:0"), c)
    g2 = group_allreduce_time(groups["a:1", "b:0"], ("a:1", "b:0"), c)
    end1 = max(t_a, t_b) + g1
    end2 = max(t_a, end1) + g2
    h = MODEL.hidden_size
    bcast = group_broadcast_time((2 * h * 8 + h) * 4.0, ["a:0", "a:1"], c)
    done = max(end1, end2) + bcast  # a:0 is free at end1, a:1 at end2
    opt = max(profiles.get("fast").optimizer_time(stage_params(MODEL, 8, 2, True, True), 9 * 8 + 3, "bf16"),
              profiles.get("slow").optimizer_time(stage_params(MODEL, 8, 1, True, True), 9 * 8 + 3, "bf16"))
    norm = allreduce_time(4.0, 3, c.slowest_link(["a:0", "a:1", "b:0"]))
    assert est.step_time_s == pytest.approx(done + norm + opt)
    assert est.breakdown["dp_sync"] == pytest.approx(done - max(t_a, t_b) + norm)


@settings(max_examples=15, deadline=None)
@given(st.sampled_from(["a:0", "a:1", "b:0", "b:3"]), st.floats(1.0, 4.0), st.sampled_from(["1f1b", "gpipe"]))
def test_slower_device_never_faster(device: str, slowdown: float, schedule: str) -> None:
    nodes = [("a", "fast", 2, 50.0), ("b", "slow", 4, 20.0)]
    p = plan([(6, 3, [(["a:0"], 3), (["a:1"], 5)]), (2, 2, [(["b:0", "b:1"], 4), (["b:2", "b:3"], 4)])],
             schedule=schedule)
    before = estimate(p, cluster(nodes))
    after = estimate(p, cluster(nodes, devices={device: {"slowdown": slowdown}}))
    assert after.step_time_s >= before.step_time_s * (1 - 1e-12)
    assert after.memory_gib == before.memory_gib
