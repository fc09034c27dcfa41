"""Golden tests of the pure rank/group arithmetic (no processes)."""

from __future__ import annotations

import math

import pytest
from exec_jobs import TINY, TINY8, make_plan

from executor.model.llama import check_supported
from planner.errors import SpecError
from planner.layout import SliceRef, build_topology, logical_params, shard_range, stage_params
from planner.model import ModelSpec


def _groups(topo) -> dict[tuple[int, ...], list[SliceRef]]:
    return {g.ranks: list(g.slices) for g in topo.sync_groups}


def test_docstring_worked_example() -> None:
    plan = make_plan(TINY, [(4, 2, "1f1b", [(2, 4)]), (4, 2, "1f1b", [(1, 2), (2, 2)])])
    # TINY has 2 KV heads, so the docstring's tp 4 stage is tp 2 here; check the tp-4 version on TINY8.
    plan8 = make_plan(TINY8, [(4, 2, "1f1b", [(2, 8)]), (4, 2, "1f1b", [(1, 4), (4, 4)])])
    topo = build_topology(plan8)
    assert topo.world_size == 7
    assert topo.tp_groups() == [(0, 1), (2,), (3, 4, 5, 6)]
    p1 = topo.pipelines[1]
    assert (p1[0].next_leader, p1[1].prev_leader) == (3, 2)
    assert p1[0].prev_leader is None and p1[1].next_leader is None
    g = _groups(topo)
    assert sorted(g) == [(0, 2), (0, 3), (0, 4), (1, 2), (1, 5), (1, 6)]
    h = TINY8.hidden_size
    assert SliceRef("layers.0.attn.wq.weight", 0, 0, h // 2) in g[(0, 2)]
    assert SliceRef("layers.0.attn.wq.weight", 0, h // 2, h) in g[(1, 2)]
    for j, owners in enumerate([(0, 3), (0, 4), (1, 5), (1, 6)]):
        assert SliceRef("layers.5.attn.wq.weight", 0, j * h // 4, (j + 1) * h // 4) in g[owners]
        assert SliceRef("layers.5.attn.wo.weight", 1, j * h // 4, (j + 1) * h // 4) in g[owners]
        v = TINY8.vocab_size
        assert SliceRef("lm_head.weight", 0, j * v // 4, (j + 1) * v // 4) in g[owners]
    assert SliceRef("layers.1.attn_norm.weight", None, 0, h) in g[(0, 2)]
    assert SliceRef("final_norm.weight", None, 0, h) in g[(0, 3)]
    assert [(b.ranks, len(b.names)) for b in topo.tp_broadcasts] == [((0, 1), 8 * 2 + 1), ((3, 4, 5, 6), 4 * 2 + 1)]
    assert build_topology(plan).world_size == 5


def test_three_pipelines_tp_4_2_1_mixes() -> None:
    # pipeline 0: tp4 -> tp2 -> tp1 ; pipeline 1: tp1 -> tp4 ; pipeline 2: one tp 1 stage... (<= 8 ranks
    # is only needed for the processes; the arithmetic is checked on 16 ranks here)
    plan = make_plan(TINY8, [(6, 3, "1f1b", [(4, 3), (2, 3), (1, 2)]),
                             (3, 3, "gpipe", [(1, 2), (4, 6)]),
                             (2, 1, "1f1b", [(2, 4), (1, 4)])])
    topo = build_topology(plan)
    assert topo.world_size == 7 + 5 + 3
    assert topo.tp_groups() == [(0, 1, 2, 3), (4, 5), (6,), (7,), (8, 9, 10, 11), (12, 13), (14,)]
    s = [st for pipe in topo.pipelines for st in pipe]
    assert [(st.prev_leader, st.next_leader) for st in s] == [
        (None, 4), (0, 6), (4, None), (None, 8), (7, None), (None, 14), (12, None)]
    # every slice of every logical parameter is owned once per pipeline, slices tile the tensor
    for info in logical_params(TINY8):
        holders = [topo.holder(p, info.name) for p in range(3)]
        refs = [(g.ranks, r) for g in topo.sync_groups for r in g.slices if r.name == info.name]
        if info.shard_dim is None:
            assert [o for o, _ in refs] == [tuple(h.leader for h in holders)]
            continue
        lcm = math.lcm(*(h.tp for h in holders))
        assert len(refs) == lcm
        size = info.shape[info.shard_dim]
        assert sorted((r.start, r.stop) for _, r in refs) == [(j * size // lcm, (j + 1) * size // lcm)
                                                             for j in range(lcm)]
        for owners, r in refs:
            for p, (h, rank) in enumerate(zip(holders, owners)):
                assert rank in h.ranks and h.pipeline == p
                lo, hi = shard_range(size, h.tp, h.ranks.index(rank))
                assert lo <= r.start and r.stop <= hi
                dim, a, b = topo.local_slice(rank, r)
                assert (dim, b - a) == (info.shard_dim, r.stop - r.start) and a == r.start - lo
    # layer 0 wq: tp 4 (p0) vs 1 (p1) vs 2 (p2) -> 4 slices
    g = _groups(topo)
    owners = [o for o, refs in g.items() if any(r.name == "layers.0.attn.wq.weight" for r in refs)]
    assert sorted(owners) == [(0, 7, 12), (1, 7, 12), (2, 7, 13), (3, 7, 13)]
    # layer 7 (p0 tp1 rank 6, p1 tp4, p2 tp1 rank 14)
    owners = [o for o, refs in g.items() if any(r.name == "layers.7.mlp.w_down.weight" for r in refs)]
    assert sorted(owners) == [(6, 8, 14), (6, 9, 14), (6, 10, 14), (6, 11, 14)]
    assert [b.ranks for b in topo.tp_broadcasts] == [(0, 1, 2, 3), (4, 5), (8, 9, 10, 11), (12, 13)]


def test_single_pipeline_has_no_sync() -> None:
    topo = build_topology(make_plan(TINY, [(4, 2, "1f1b", [(2, 2), (1, 1), (2, 1)])]))
    assert topo.sync_groups == () and topo.tp_broadcasts == ()
    assert topo.stage_of(3).ranks == (3, 4) and topo.tp_rank(4) == 1


def test_same_layout_pipelines_pair_matching_ranks() -> None:
    topo = build_topology(make_plan(TINY, [(2, 1, "1f1b", [(2, 4)]), (2, 1, "1f1b", [(2, 4)])]))
    assert sorted(_groups(topo)) == [(0, 2), (1, 3)]
    assert all(len(b.names) == 4 * 2 + 1 for b in topo.tp_broadcasts)


def test_stage_params_cover_model_once() -> None:
    plan = make_plan(TINY8, [(2, 1, "1f1b", [(1, 3), (2, 1), (4, 4)])])
    names = [p.name for st in build_topology(plan).pipelines[0]
             for p in stage_params(TINY8, st.layers, st.is_first, st.is_last)]
    assert names == [p.name for p in logical_params(TINY8)]
    assert sum(p.numel for p in logical_params(TINY8)) == TINY8.param_count()


def test_tied_embeddings_rejected() -> None:
    tied = ModelSpec("tied", 2, 64, 128, 4, 2, 256, 16, tie_embeddings=True)
    with pytest.raises(SpecError, match="tie_embeddings"):
        check_supported(make_plan(tied, [(1, 1, "1f1b", [(1, 2)])]))
