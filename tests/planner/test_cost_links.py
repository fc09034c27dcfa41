"""Collective and p2p times: hand-computed cases and monotonicity in bandwidth."""

from __future__ import annotations

import math

import pytest
from _cost_fixtures import MODEL, cluster
from hypothesis import given
from hypothesis import strategies as st

from planner.cluster import Link
from planner.cost import (
    CostParams,
    allreduce_time,
    boundary_time,
    broadcast_time,
    group_allreduce_time,
    hierarchical_allreduce_time,
    p2p_time,
    reduce_scatter_time,
    ring_allreduce_time,
    tp_comm_time,
    tree_allreduce_time,
)

EXACT = CostParams(link_efficiency=1.0)
LINK = Link("infiniband", bandwidth_GBps=10.0, latency_us=5.0)


def test_p2p_and_broadcast_by_hand() -> None:
    assert p2p_time(1e9, LINK, EXACT) == pytest.approx(5e-6 + 0.1)
    assert broadcast_time(1e9, 4, LINK, EXACT) == pytest.approx(3 * 5e-6 + 0.1)
    assert broadcast_time(1e9, 1, LINK, EXACT) == 0.0
    assert p2p_time(1e9, LINK, CostParams(link_efficiency=0.5)) == pytest.approx(5e-6 + 0.2)


def test_ring_tree_and_best_by_hand() -> None:
    ring = 2 * 3 * 5e-6 + 2 * 3 / 4 * 0.1
    tree = 2 * 2 * 5e-6 + 2 * 0.1
    assert ring_allreduce_time(1e9, 4, LINK, EXACT) == pytest.approx(ring)
    assert tree_allreduce_time(1e9, 4, LINK, EXACT) == pytest.approx(tree)
    assert reduce_scatter_time(1e9, 4, LINK, EXACT) == pytest.approx(ring / 2)
    assert allreduce_time(1e9, 4, LINK, EXACT) == pytest.approx(ring)  # large: ring wins
    # a tiny message over many ranks is latency-bound: tree wins
    small_ring = 2 * 63 * 5e-6 + 2 * 63 / 64 * 8 / 1e10
    small_tree = 2 * 6 * 5e-6 + 2 * 8 / 1e10
    assert allreduce_time(8, 64, LINK, EXACT) == pytest.approx(min(small_ring, small_tree))
    assert allreduce_time(8, 64, LINK, EXACT) == pytest.approx(small_tree)
    assert allreduce_time(8, 64, LINK, CostParams(link_efficiency=1.0, allreduce_algo="ring")) == \
        pytest.approx(small_ring)


def test_hierarchical_by_hand() -> None:
    intra = Link("nvlink", 100.0, 2.0)
    b = 1e9
    want = 2 * (1 * 2e-6 + 0.5 * b / 100e9) + ring_allreduce_time(b / 2, 2, LINK, EXACT)
    assert hierarchical_allreduce_time(b, 2, 2, intra, LINK, EXACT) == pytest.approx(want)
    # a 2x2 group: the cluster-level function takes the faster of flat and hierarchical
    c = cluster([("a", "fast", 2, 100.0), ("b", "fast", 2, 100.0)], inter_bw=10.0, inter_lat=5.0)
    devs = ["a:0", "a:1", "b:0", "b:1"]
    flat = ring_allreduce_time(b, 4, LINK, EXACT)
    assert group_allreduce_time(b, devs, c, EXACT) == pytest.approx(min(flat, want))
    assert want < flat
    assert group_allreduce_time(b, devs, c, CostParams(link_efficiency=1.0, hierarchical_allreduce=False)) == \
        pytest.approx(flat)


def test_tp_group_across_a_slow_link() -> None:
    """A TP-4 stage split over two nodes talks at the inter-node pace: 2 all-reduces per layer forward."""
    c = cluster([("a", "fast", 2, 100.0), ("b", "fast", 2, 100.0)], inter_bw=2.0, inter_lat=20.0)
    devs = ["a:0", "a:1", "b:0", "b:1"]
    link = c.slowest_link(devs)
    assert link is not None and link.bandwidth_GBps == 2.0
    mb, layers = 2, 3
    tokens_h = mb * MODEL.seq_len * MODEL.hidden_size
    ar_bf16 = 2 * 3 * 20e-6 + 2 * 3 / 4 * tokens_h * 2 / 2e9  # forward: bf16 outputs of wo / w_down
    ar_fp32 = 2 * 3 * 20e-6 + 2 * 3 / 4 * tokens_h * 4 / 2e9  # backward: fp32 gradients of the norm outputs
    ring = CostParams(link_efficiency=1.0, allreduce_algo="ring")
    f, b = tp_comm_time(MODEL, layers=layers, first=False, last=False, micro_batch=mb, tp=4, dtype="bf16",
                        recompute="none", link=link, params=ring)
    assert f == pytest.approx(2 * layers * ar_bf16)
    assert b == pytest.approx(2 * layers * ar_fp32)
    f_full, b_full = tp_comm_time(MODEL, layers=layers, first=False, last=False, micro_batch=mb, tp=4,
                                  dtype="bf16", recompute="full", link=link, params=ring)
    # full recompute repeats the wo all-reduce of each layer (the checkpoint stops before w_down's)
    assert (f_full, b_full) == pytest.approx((f, b + layers * ar_bf16))
    # a bf16 residual stream halves the backward bytes
    bf16 = CostParams(link_efficiency=1.0, allreduce_algo="ring", fp32_residual=False)
    _, b16 = tp_comm_time(MODEL, layers=layers, first=False, last=False, micro_batch=mb, tp=4, dtype="bf16",
                          recompute="none", link=link, params=bf16)
    assert b16 == pytest.approx(2 * layers * ar_bf16)
    # the same group inside one node is faster
    fast = c.slowest_link(["a:0", "a:1"])
    f2, _ = tp_comm_time(MODEL, layers=layers, first=False, last=False, micro_batch=mb, tp=2, dtype="bf16",
                         recompute="none", link=fast, params=EXACT)
    assert f2 < f


def test_boundary_equal_and_changing_tp() -> None:
    c = cluster([("a", "fast", 4, 100.0), ("b", "fast", 4, 50.0)], inter_bw=10.0, inter_lat=5.0)
    nbytes = 1e8
    # leader to leader over the inter-node link, then a broadcast inside the receiving group (b's link)
    want = 5e-6 + nbytes / 10e9 + 1 * 2e-6 + nbytes / 50e9
    assert boundary_time(nbytes, ["a:0"], ["b:0", "b:1"], c, EXACT) == pytest.approx(want)
    assert boundary_time(nbytes, ["a:0", "a:1"], ["b:0", "b:1"], c, EXACT) == pytest.approx(want)
    # TP 4 -> 1: no broadcast
    assert boundary_time(nbytes, ["b:0", "b:1", "b:2", "b:3"], ["a:0"], c, EXACT) == \
        pytest.approx(5e-6 + nbytes / 10e9)


links = st.builds(Link, st.just("other"), st.floats(0.1, 1000), st.floats(0, 100))


@given(st.floats(1, 1e10), st.integers(2, 64), links, st.floats(1.0, 10.0), st.sampled_from(["ring", "tree", "best"]))
def test_more_bandwidth_never_slower(nbytes: float, n: int, link: Link, factor: float, algo: str) -> None:
    params = CostParams(allreduce_algo=algo)
    faster = Link(link.kind, link.bandwidth_GBps * factor, link.latency_us)
    for fn in (allreduce_time, broadcast_time, reduce_scatter_time):
        assert fn(nbytes, n, faster, params) <= fn(nbytes, n, link, params) * (1 + 1e-12)
    assert p2p_time(nbytes, faster, params) <= p2p_time(nbytes, link, params)
    assert math.isfinite(allreduce_time(nbytes, n, link, params))
