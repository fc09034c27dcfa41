"""Hot switching: transfers between layouts (pure rank math) and the oracle — a step whose phases
run under three different plans equals the single-device update on the same global batch."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
import torch
from exec_jobs import ORACLE_OPTIM, TINY8, global_docs, make_plan, train_hot_switch
from torch.testing import assert_close

from planner.errors import SpecError
from planner.layout import build_topology, logical_params, shard_range
from planner.layout_moves import grad_moves, weight_moves
from planner.plan import Pipeline, Plan, Stage
from planner.strategy_topology import rank_map, strategy_topology
from planner.varlen.seq_cost import PipelineCost, SeqCost
from planner.varlen.step_layout import StrategyCost, plan_step
from tests.support.reference import reference_train

W_ATOL = 2e-6  # as the oracle (tests/executor/test_exec_oracle.py)


def _reorder(plan: Plan, order: list[int]) -> Plan:
    """``plan`` with its devices renamed ``d:i -> d:order[i]`` (same structure, another rank order)."""
    ren = {f"d:{i}": f"d:{j}" for i, j in enumerate(order)}
    pipes = tuple(Pipeline(p.batch_size, p.micro_batches,
                           tuple(Stage(tuple(ren[d] for d in s.devices), s.tp, s.layers) for s in p.stages), p.schedule)
                  for p in plan.pipelines)
    return replace(plan, pipelines=pipes)


HOME = make_plan(TINY8, [(2, 1, "1f1b", [(2, 8)]), (1, 1, "1f1b", [(1, 3), (1, 5)])])  # TP 2 | PP 2
TP4 = _reorder(make_plan(TINY8, [(1, 1, "1f1b", [(4, 8)])]), [3, 2, 1, 0])  # TP 4, devices in reverse
DP4 = _reorder(make_plan(TINY8, [(1, 1, "1f1b", [(1, 8)])] * 4), [1, 0, 3, 2])  # four TP-1 replicas
DEVICES = HOME.devices


def _covered(moves, topo, q: int) -> dict[str, list[tuple[int, int]]]:
    out: dict[str, list[tuple[int, int]]] = {}
    for m in moves:
        if m.dst == q:
            out.setdefault(m.ref.name, []).append((m.ref.start, m.ref.stop))
    return out


def test_strategy_topology_renames_ranks_by_device() -> None:
    assert rank_map(TP4, DEVICES) == [3, 2, 1, 0]
    topo = strategy_topology(TP4, DEVICES)
    [[st]] = topo.pipelines
    assert st.ranks == (3, 2, 1, 0) and st.leader == 3
    assert topo.stage_of(0).ranks.index(0) == 3  # job rank 0 drives d:0, the 4th TP rank of TP4
    dp = strategy_topology(DP4, DEVICES)
    assert [p[0].ranks for p in dp.pipelines] == [(1,), (0,), (3,), (2,)]
    assert [g.ranks for g in dp.sync_groups] == sorted(g.ranks for g in dp.sync_groups)
    with pytest.raises(SpecError, match="same devices"):
        rank_map(make_plan(TINY8, [(1, 1, "1f1b", [(2, 8)])]), DEVICES)


def test_weight_moves_cover_every_target_slice_once_and_prefer_local_copies() -> None:
    src = build_topology(HOME)
    for plan in (TP4, DP4):
        dst = strategy_topology(plan, DEVICES)
        moves = weight_moves(src, dst)
        for q in range(4):
            st = dst.stage_of(q)
            got = _covered(moves, dst, q)
            for info in logical_params(TINY8):
                dim = info.shard_dim
                size = info.shape[0] if dim is None else info.shape[dim]
                want = (0, size) if dim is None else shard_range(size, st.tp, st.ranks.index(q))
                pieces = sorted(got[info.name])
                assert pieces[0][0] == want[0] and pieces[-1][1] == want[1]
                assert all(a[1] == b[0] for a, b in zip(pieces, pieces[1:]))  # no gap, no overlap
        for m in moves:  # a rank that holds the piece at home copies it locally
            home_st = src.stage_of(m.dst)
            if home_st.holds(m.ref.name):
                dim = m.ref.dim
                info = next(i for i in logical_params(TINY8) if i.name == m.ref.name)
                size = info.shape[0] if dim is None else info.shape[dim]
                lo, hi = (0, size) if dim is None else shard_range(size, home_st.tp, home_st.ranks.index(m.dst))
                if lo <= m.ref.start and m.ref.stop <= hi:
                    assert m.src == m.dst
    # TP 4 from TP 2 | PP 2: every rank needs slices it lacks, and senders share the load
    sends = [sum(1 for m in weight_moves(src, strategy_topology(TP4, DEVICES)) if m.src == r != m.dst)
             for r in range(4)]
    assert min(sends) > 0


def test_grad_moves_send_each_active_pipeline_once_to_one_home_pipeline() -> None:
    home = build_topology(HOME)
    dp = strategy_topology(DP4, DEVICES)
    moves = grad_moves(dp, home, pipelines=[0, 2, 3])
    for info in logical_params(TINY8):
        size = info.shape[0] if info.shard_dim is None else info.shape[info.shard_dim]
        for p in (0, 2, 3):
            (src_rank,) = dp.pipelines[p][0].ranks
            target = home.pipelines[p % 2]
            mine = [m for m in moves if m.src == src_rank and m.ref.name == info.name]
            assert {home.stage_of(m.dst).pipeline for m in mine} == {p % 2}
            if info.shard_dim is not None:  # the whole tensor arrives, cut at the target's shards
                assert sum(m.ref.stop - m.ref.start for m in mine) == size
            else:  # a replicated gradient reaches every TP rank of the target stage
                assert {m.dst for m in mine} == set(next(s for s in target if s.holds(info.name)).ranks)
    assert not any(m.src == dp.pipelines[1][0].ranks[0] for m in moves)  # pipeline 1 trained nothing


def _costs(caps: tuple[int, ...], pipes: int) -> tuple[PipelineCost, ...]:
    return tuple(PipelineCost((SeqCost(1e-9, 1e-5, 1e-4),), caps[0], math.inf) for _ in range(pipes))


# HotSPa-style buckets on the tiny model: <= 12 tokens on DP 4, <= 24 on the home plan, the rest on TP 4
STRATEGIES = [StrategyCost("home", (PipelineCost((SeqCost(1e-9, 1e-5, 1e-4),), 24, math.inf),
                                    PipelineCost((SeqCost(1e-9, 1e-5, 1e-4),) * 2, 24, math.inf))),
              StrategyCost("tp4", _costs((40,), 1)), StrategyCost("dp4", _costs((12,), 4))]


@pytest.mark.slow
@pytest.mark.xdist_group("executor-pool")
@pytest.mark.parametrize("variant", ["fp32", "zero1-recompute"])
def test_hot_switching_oracle(dist_pool, variant: str) -> None:
    """Three steps, each with phases under TP 2 | PP 2 (home), TP 4 and DP 4 (ranks in other
    orders): losses, gradient norms and final weights equal the dense single-process update."""
    plans = [HOME, TP4, DP4]
    if variant == "zero1-recompute":
        plans[0] = replace(HOME, options=replace(HOME.options, zero=1))
        plans[1] = replace(TP4, options=replace(TP4.options, recompute="selective"))
    steps = [global_docs(TINY8, 1, n, seed=200 + k)[0] for k, n in enumerate((14, 9, 12))]
    layouts = [plan_step([len(d) - 1 for d in docs], STRATEGIES, assign="threshold") for docs in steps]
    assert all({ph.strategy for ph in lay.phases} == {0, 1, 2} for lay in layouts[:1])
    ref = reference_train(TINY8, steps, optim=ORACLE_OPTIM)
    results = dist_pool.run(train_hot_switch, plans, 0, steps, layouts)
    for rank, r in enumerate(results[:4]):
        assert_close(r["losses"], ref.losses, rtol=1e-5, atol=0, msg=f"losses on rank {rank}")
        assert_close(r["norms"], ref.grad_norms, rtol=1e-5, atol=0, msg=f"grad norms on rank {rank}")
        assert all(n > 0 for n in r["sent"]) and r["released"]
        assert r["phases"] == [len(lay.phases) for lay in layouts]
    assert all(r is None for r in results[4:])
    assert min(ref.grad_norms) > ORACLE_OPTIM.grad_clip
    for name, want in ref.state.items():
        assert_close(results[0]["state"][name], want, rtol=1e-5, atol=W_ATOL, msg=lambda s, n=name: f"{n}: {s}")


def test_reference_docs_loss_is_per_document() -> None:
    """The oracle's reference trains each document alone: its loss is the token-weighted mean of
    the documents' own losses."""
    from tests.support.reference import reference_model

    docs = global_docs(TINY8, 1, 3, seed=9)[0]
    model = reference_model(TINY8, 0)
    with torch.no_grad():
        each = [float(model.loss(d[None])) for d in docs]
        got = model.loss(docs)
    want = sum(x * (len(d) - 1) for x, d in zip(each, docs)) / sum(len(d) - 1 for d in docs)
    assert torch.is_tensor(got) and float(got) == pytest.approx(want, rel=1e-6)
