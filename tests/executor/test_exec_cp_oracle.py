"""The oracle for context parallelism (executor.parallel.context_parallel, executor.parallel.cp_p2p):
plans whose stages split the sequence over CP ranks train exactly like one dense process — cp x tp
meshes; CP changes and TP changes at one boundary (cp 2 -> 1, 1 -> 2, 2 -> 4, cp 2 x tp 2 -> cp 4
x tp 1); CP beside a second pipeline (data parallel) with and without ZeRO-1; 1F1B, ZB-H1 and
GPipe; selective and full recompute. Every CP slot ends with the same weights. Plus checkpoints
across CP layouts and the one-line refusals."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from exec_jobs import (
    ORACLE_OPTIM,
    TINY,
    TINY8,
    checkpoint_job,
    global_batches,
    make_plan,
    train_packed,
    train_plans,
)
from test_exec_oracle import run_oracle
from torch.testing import assert_close

from planner.layout import build_topology
from planner.plan import Plan
from tests.support.dist_testing import DistPool
from tests.support.reference import reference_train

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("executor-pool")]


def _opts(plan: Plan, **options: object) -> Plan:
    return replace(plan, options=replace(plan.options, **options))


# stages are (tp, layers, cp)
PLANS: dict[str, Plan] = {
    "cp2-tp1": make_plan(TINY, [(4, 2, "1f1b", [(1, 4, 2)])]),
    "cp2xtp2": make_plan(TINY, [(4, 2, "1f1b", [(2, 4, 2)])]),
    "cp2-then-tp2": make_plan(TINY, [(4, 3, "1f1b", [(1, 2, 2), (2, 2, 1)])]),
    "tp2-then-cp2-zb": make_plan(TINY, [(4, 3, "zb-h1", [(2, 2, 1), (1, 2, 2)])]),
    "cp2-cp2-zb": make_plan(TINY, [(4, 4, "zb-h1", [(1, 1, 2), (1, 3, 2)])]),
    "cp2-then-cp4-gpipe-full-recompute": _opts(make_plan(TINY, [(3, 3, "gpipe", [(1, 2, 2), (1, 2, 4)])]),
                                               recompute="full"),
    "cp2xtp2-then-cp4xtp1": make_plan(TINY, [(4, 2, "1f1b", [(2, 2, 2), (1, 2, 4)])]),
    "cp2-beside-tp2-dp": make_plan(TINY, [(3, 2, "1f1b", [(1, 4, 2)]), (1, 1, "zb-h1", [(2, 4, 1)])]),
    "cp2xtp2-selective-recompute": _opts(make_plan(TINY, [(4, 2, "1f1b", [(2, 4, 2)])]), recompute="selective"),
    "cp2xtp2-beside-tp1-zero1": _opts(make_plan(TINY, [(2, 1, "1f1b", [(2, 4, 2)]), (2, 2, "zb-h1", [(1, 4)])]),
                                      zero=1),
    "cp2-beside-tp2-zero1": _opts(make_plan(TINY, [(2, 2, "zb-h1", [(1, 4, 2)]), (2, 2, "1f1b", [(2, 4, 1)])]),
                                  zero=1),
    # one pipeline whose every stage uses CP: ZeRO-1 shards over the CP slots (state_layout.zero_sharded)
    "lone-cp2-cp2-zero1": _opts(make_plan(TINY, [(4, 2, "1f1b", [(1, 2, 2), (1, 2, 2)])]), zero=1),
    "lone-cp2xtp2-zero1": _opts(make_plan(TINY, [(4, 2, "zb-h1", [(2, 4, 2)])]), zero=1),
}


def _slots_agree(plan: Plan, results: list) -> None:
    """Every CP slot of a stage holds the same shards as slot 0 (their gradients were summed)."""
    topo = build_topology(plan)
    for pipe in topo.pipelines:
        for st in pipe:
            if st.cp_rank == 0:
                continue
            for tp_rank, rank in enumerate(st.ranks):
                ref = results[st.slots[0][tp_rank]]["shards"]
                for name, t in results[rank]["shards"].items():
                    assert_close(t, ref[name], rtol=0, atol=0, msg=lambda m, n=name, r=rank: f"rank {r} {n}: {m}")


@pytest.mark.parametrize("name", list(PLANS))
def test_cp_oracle(dist_pool: DistPool, name: str) -> None:
    plan = PLANS[name]
    _slots_agree(plan, run_oracle(dist_pool, plan))


def test_cp_plans_cover_the_claims() -> None:
    pipes = [p for pl in PLANS.values() for p in pl.pipelines]
    meshes = {(s.cp, s.tp) for p in pipes for s in p.stages}
    assert {(2, 1), (2, 2)} <= meshes
    boundaries = {((a.cp, a.tp), (b.cp, b.tp)) for p in pipes for a, b in zip(p.stages, p.stages[1:])}
    assert {((2, 1), (1, 2)), ((1, 2), (2, 1)), ((2, 1), (2, 1)), ((2, 1), (4, 1)), ((2, 2), (4, 1))} <= boundaries
    assert {p.schedule for p in pipes} == {"1f1b", "zb-h1", "gpipe"}
    assert {pl.options.recompute for pl in PLANS.values()} == {"none", "selective", "full"}
    multi = [pl for pl in PLANS.values() if len(pl.pipelines) > 1]
    assert {pl.options.zero for pl in multi} == {0, 1}
    assert max(pl.world_size for pl in PLANS.values()) <= 8


def test_cp_refuses_a_sequence_that_does_not_split(dist_pool: DistPool) -> None:
    """A sequence whose length 2 x cp does not divide is refused in one line naming the stage's cp, by
    every rank of the pipeline alike (the cp-1 stage too, which would otherwise wait for pieces)."""
    plan = PLANS["cp2-then-tp2"]
    odd = [torch.randint(0, TINY.vocab_size, (plan.global_batch_size, 31))]  # 30 tokens: not 4 | 30
    with pytest.raises(Exception) as err:
        dist_pool.run(train_plans, [plan], [odd])
    text = str(err.value)
    assert "pipelines[0].stages[0].cp" in text and "multiples of 4 tokens" in text


def test_cp_checkpoint_reshards_exactly(dist_pool: DistPool, tmp_path) -> None:
    """Saved under a CP plan with ZeRO-1 (CP slots own disjoint parts, slot 0 writes the weights),
    loaded under another CP mesh: the run continues exactly like the dense one."""
    steps, split = 4, 2
    x = _opts(make_plan(TINY, [(4, 2, "zb-h1", [(1, 2, 2), (2, 2)]), (4, 2, "1f1b", [(2, 4)])]), zero=1)
    y = make_plan(TINY, [(8, 2, "1f1b", [(2, 4, 2)])])
    other = make_plan(TINY8, [(8, 1, "1f1b", [(1, 8)])])
    batches = global_batches(TINY, 8, steps, seed=5)
    ref = reference_train(TINY, batches, optim=ORACLE_OPTIM)
    res = dist_pool.run(checkpoint_job, x, y, other, batches, split, str(tmp_path / "ckpt"))
    for rank in range(y.world_size):
        assert_close(res[rank]["losses_y"], ref.losses[split:], rtol=1e-5, atol=0)
    for name, want in ref.state.items():
        assert_close(res[0]["state"][name], want, rtol=1e-5, atol=2e-6, msg=lambda m, n=name: f"{n}: {m}")


def _docs(lengths: list[int], seed: int) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return [torch.randint(0, TINY.vocab_size, (n,), generator=gen) for n in lengths]


PACKED: dict[str, Plan] = {
    "packed-cp2-then-tp2": make_plan(TINY, [(2, 2, "1f1b", [(1, 2, 2), (2, 2)])]),
    "packed-cp2xtp2-beside-tp1-zb": make_plan(TINY, [(2, 2, "zb-h1", [(2, 4, 2)]), (1, 1, "1f1b", [(1, 4)])]),
    # interleaved: one round's exchange carries micro-batches of 12 and 8 tokens (pieces cut per tensor)
    # (4 ranks: test_exec_nccl4.py runs it too)
    "packed-il-cp2-then-tp1": make_plan(TINY, [(2, 2, "interleaved-1f1b", [(1, 2, 2), (1, 2)]),
                                               (1, 1, "1f1b", [(1, 4)])]),
}


def packed_steps(pipelines: int) -> tuple[list[list[torch.Tensor]], list[list[list[list[int]]]]]:
    """Two steps of documents and their rows, every row a multiple of 2 x cp = 4 tokens."""
    steps = [_docs([5, 9, 3, 7, 5], 11), _docs([13, 4, 6, 5], 12)]  # inputs 4, 8, 2, 6, 4 | 12, 3, 5, 4
    if pipelines == 2:  # rows of 12 + 8 tokens and 4 tokens
        return steps, [[[[0, 1], [2, 3]], [[4]]], [[[0], [1, 2]], [[3]]]]
    return steps, [[[[0, 1], [2, 3, 4]]], [[[0], [1, 2, 3]]]]  # rows of 12 + 12 tokens


@pytest.mark.parametrize("name", list(PACKED))
def test_cp_packed_documents_train_like_each_document_alone(dist_pool: DistPool, name: str) -> None:
    """Packed rows (documents back to back, positions restarting, attention inside each document)
    split over CP ranks: the K/V all-gather masked by document and global position trains like the
    dense reference on every document alone (rows of multiples of 2 x cp = 4 tokens)."""
    plan = PACKED[name]
    steps, layouts = packed_steps(len(plan.pipelines))
    ref = reference_train(TINY, steps, optim=ORACLE_OPTIM)
    results = dist_pool.run(train_packed, plan, steps, layouts)
    n = plan.world_size
    for rank, r in enumerate(results[:n]):
        assert_close(r["losses"], ref.losses, rtol=1e-5, atol=0, msg=f"losses on rank {rank}")
        assert_close(r["norms"], ref.grad_norms, rtol=1e-5, atol=0, msg=f"grad norms on rank {rank}")
    for key, want in ref.state.items():
        assert_close(results[0]["state"][key], want, rtol=1e-5, atol=2e-6, msg=lambda m, k=key: f"{k}: {m}")
    _slots_agree(plan, results)


def test_cp_refuses_a_packed_row_that_does_not_split(dist_pool: DistPool) -> None:
    """A packed row whose token count 2 x cp does not divide: one line naming the stage's cp."""
    docs = _docs([5, 8], 13)  # one row of 4 + 7 = 11 tokens
    with pytest.raises(Exception) as err:
        dist_pool.run(train_packed, PACKED["packed-cp2-then-tp2"], [docs], [[[[0, 1]]]])
    assert "pipelines[0].stages[0].cp" in str(err.value) and "a multiple of 4 tokens" in str(err.value)
