"""planner.state_move_plan: the pieces of a layout switch move every element of the training state exactly
once into place (a numpy simulation of the transfer), reuse local copies, prefer same-node
senders, fuse one message per pair, and report bytes and the lower bound; golden cases by hand."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings

from planner.chunks import Chunk, contains, intersect
from planner.errors import SpecError
from planner.layout import logical_params
from planner.model import ModelSpec
from planner.plan import Plan, PlanOptions
from planner.state_layout import MOMENTS, rank_states, state_tensor
from planner.state_move_plan import ReshardPlan, reshard_plan
from tests.support.random_plans import TINY, TINY8, named_plan, plan_pairs


def _plan(model: ModelSpec, pipes: list[tuple[int, list[tuple[list[str], int]]]], zero: int = 0) -> Plan:
    return named_plan(model, pipes, zero=zero, micro=1)


def _rect(arr: np.ndarray, c: Chunk, base: Chunk) -> np.ndarray:
    """The ``c`` part of ``arr``, which holds rectangle ``base``."""
    return arr[tuple(slice(o - b, o - b + n) for o, b, n in zip(c.offsets, base.offsets, c.sizes))]


def simulate(rp: ReshardPlan) -> dict[str, list[np.ndarray]]:
    """Fill every old holding from random logical tensors, apply the pieces, return the new
    holdings (asserting that every new element is written exactly once)."""
    rng = np.random.default_rng(0)
    logical = {state_tensor(k, i.name): rng.standard_normal(i.shape)
               for i in logical_params(rp.old.model) for k in ("model", *MOMENTS)}
    old = {s.device: s for s in rank_states(rp.old)}
    new = {s.device: s for s in rank_states(rp.new)}
    held = {d: [_rect(logical[h.tensor], h.chunk, Chunk(h.chunk.name, (0,) * len(h.chunk.sizes), ()))
                for h in s.holdings] for d, s in old.items()}
    got = {d: [np.full(h.chunk.sizes, np.nan) for h in s.holdings] for d, s in new.items()}
    writes = {d: [np.zeros(h.chunk.sizes, dtype=int) for h in s.holdings] for d, s in new.items()}
    for p in rp.pieces:
        src, dst = old[p.src].holdings[p.src_slot], new[p.dst].holdings[p.dst_slot]
        assert src.tensor == dst.tensor == p.tensor and contains(src.chunk, p.chunk) and contains(dst.chunk, p.chunk)
        _rect(got[p.dst][p.dst_slot], p.chunk, dst.chunk)[...] = _rect(held[p.src][p.src_slot], p.chunk, src.chunk)
        _rect(writes[p.dst][p.dst_slot], p.chunk, dst.chunk)[...] += 1
    for d, s in new.items():
        for j, h in enumerate(s.holdings):
            assert (writes[d][j] == 1).all(), (d, h)
            want = _rect(logical[h.tensor], h.chunk, Chunk(h.chunk.name, (0,) * len(h.chunk.sizes), ()))
            np.testing.assert_array_equal(got[d][j], want)
    return got


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(pair=plan_pairs())
def test_random_switches_move_every_element_once_reuse_local_copies_and_prefer_the_node(
        pair: tuple[Plan, Plan]) -> None:
    old, new = pair
    rp = reshard_plan(old, new)
    simulate(rp)
    old_states = {s.device: s for s in rank_states(old)}
    for p in rp.pieces:
        if p.src == p.dst:
            continue
        mine = old_states.get(p.dst)
        assert mine is None or not any(h.tensor == p.tensor and intersect(h.chunk, p.chunk) for h in mine.holdings), \
            f"{p.dst} receives {p} but holds part of it"
        holders = [s.device for s in old_states.values()
                   if any(h.tensor == p.tensor and contains(h.chunk, p.chunk) for h in s.holdings)]
        if any(h.split(":")[0] == p.dst.split(":")[0] for h in holders):
            assert p.src.split(":")[0] == p.dst.split(":")[0], f"{p} skips a holder on {p.dst}'s node: {holders}"
    # one message per ordered pair; totals agree
    assert sum(len(ps) for ps in rp.messages.values()) == sum(p.src != p.dst for p in rp.pieces)
    assert sum(rp.bytes_out(d) for d in rp.devices) == sum(rp.bytes_in(d) for d in rp.devices) == rp.moved_bytes
    assert all(rp.bytes_out(d) == 0 for d in rp.joining) and all(rp.bytes_in(d) == 0 for d in rp.leaving)
    assert {frozenset(k) for k in rp.messages} == {frozenset(k) for k in rp.pairs()}
    assert rp.devices[:new.world_size] == tuple(new.devices) and set(rp.devices) == set(old.devices) | set(new.devices)


def test_golden_tp2_pipeline_to_two_pipelines() -> None:
    """Golden (module docstring of planner.state_move_plan): ``a:0`` receives the other half of every
    sharded tensor from ``a:1``; ``b:0`` gets each half from its only holder and the replicated
    norm scales from the less loaded ``a:0``."""
    old = _plan(TINY, [(4, [(["a:0", "a:1"], 4)])])
    new = _plan(TINY, [(2, [(["a:0"], 4)]), (2, [(["b:0"], 4)])])
    rp = reshard_plan(old, new)
    simulate(rp)
    sharded = sum(i.numel for i in logical_params(TINY) if i.shard_dim is not None)
    replicated = sum(i.numel for i in logical_params(TINY) if i.shard_dim is None)
    assert (sharded, replicated) == (217088, 576)
    b = 4 * 3  # fp32 bytes x (weights + two moments)
    assert rp.bytes_in("a:0") == b * sharded // 2 and rp.bytes_in("b:0") == b * (sharded + replicated)
    assert rp.bytes_out("a:1") == b * sharded and rp.bytes_out("a:0") == b * (sharded // 2 + replicated)
    assert rp.local_bytes == b * (sharded // 2 + replicated)
    assert rp.pairs() == [("a:0", "b:0"), ("a:0", "a:1"), ("b:0", "a:1")]
    assert rp.devices == ("a:0", "b:0", "a:1") and rp.leaving == ("a:1",) and rp.joining == ("b:0",)
    assert rp.lower_bound_s(bandwidth_GBps=10) == pytest.approx(b * (sharded + replicated) / 10e9)
    assert len(rp.messages) == 3


def test_golden_zero_settings_on_the_same_devices() -> None:
    """ZeRO-1 -> ZeRO-0 on two pipelines (TP 1 and TP 2) of the same devices: weights stay; each
    moment element is held once and needed by one rank per pipeline (a norm scale by both TP ranks
    of pipeline 1), so it moves to every needer but its holder. ZeRO-0 -> ZeRO-1 and unchanged
    plans move nothing."""
    z0 = _plan(TINY8, [(3, [(["a:0"], 8)]), (3, [(["a:1", "a:2"], 8)])])
    z1 = replace(z0, options=replace(z0.options, zero=1))
    total = sum(i.numel for i in logical_params(TINY8))
    replicated = sum(i.numel for i in logical_params(TINY8) if i.shard_dim is None)
    down = reshard_plan(z1, z0)
    simulate(down)
    assert down.moved_bytes == 4 * 2 * (total + replicated)
    own = sum(h.numel for h in rank_states(z1)[0].holdings if h.tensor.startswith("optim/"))
    assert down.bytes_in("a:0") == 4 * (2 * total - own)
    for rp in (reshard_plan(z0, z1), reshard_plan(z0, z0), reshard_plan(z1, z1)):
        simulate(rp)
        assert rp.moved_bytes == 0 and not rp.messages and rp.lower_bound_s(bandwidth_GBps=1) == 0


def test_zero1_parts_tile_each_part_and_hold_every_moment_once() -> None:
    plan = replace(_plan(TINY8, [(2, [(["a:0", "a:1"], 3), (["a:2"], 5)]), (2, [(["b:0"], 8)]),
                                 (1, [(["b:1", "b:2", "b:3", "a:3"], 8)])]), options=PlanOptions(zero=1, dtype="fp32"))
    counts = {state_tensor(k, i.name): 0 for i in logical_params(TINY8) for k in MOMENTS}
    for s in rank_states(plan):
        for k in MOMENTS:
            spans = sorted((h.part, h.at, h.at + h.numel) for h in s.holdings if h.tensor.startswith(f"optim/{k}/"))
            for j, size in enumerate(s.part_sizes):
                mine = [(a, b) for part, a, b in spans if part == j]
                assert [a for a, _ in mine] == [0] + [b for _, b in mine[:-1]] and (mine[-1][1] if mine else 0) == size
        for h in s.holdings:
            if h.tensor in counts:
                counts[h.tensor] += h.numel
    assert counts == {state_tensor(k, i.name): i.numel for i in logical_params(TINY8) for k in MOMENTS}


def test_same_node_sender_preferred_and_the_cluster_bound() -> None:
    from planner.cluster import parse_cluster

    cluster = parse_cluster({"nodes": [{"name": "a", "gpu": "h100-sxm", "gpus": 4,
                                        "intra_link": {"bandwidth_GBps": 100}},
                                       {"name": "b", "gpu": "h100-sxm", "gpus": 4,
                                        "intra_link": {"bandwidth_GBps": 100}}],
                             "inter_node": {"bandwidth_GBps": 10}})
    old = _plan(TINY, [(2, [(["a:0"], 4)]), (2, [(["b:0"], 4)])])
    new = _plan(TINY, [(2, [(["a:1"], 4)]), (2, [(["b:1"], 4)])])
    rp = reshard_plan(old, new, cluster)
    assert {(p.src, p.dst) for p in rp.pieces} == {("a:0", "a:1"), ("b:0", "b:1")}
    per = rp.bytes_in("a:1")
    assert rp.lower_bound_s(cluster=cluster) == pytest.approx(per / 100e9)
    assert rp.report(cluster=cluster)["lower_bound_s"] == pytest.approx(per / 100e9)


def test_another_model_is_refused() -> None:
    with pytest.raises(SpecError, match="trains model 'tiny-8l'"):
        reshard_plan(_plan(TINY, [(2, [(["a:0"], 4)])]), _plan(TINY8, [(2, [(["a:0"], 8)])]))
