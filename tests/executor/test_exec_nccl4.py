"""The oracle on 4 NCCL ranks: asymmetric plans whose stages change TP degree (skipped without 4
CUDA devices; ``make test-gpu`` on a 4-GPU machine runs it, CPU CI never does).

Every plan trains 3 AdamW steps (warm-up and clipping active) on its own GPU per rank and must
equal the single-process reference: losses, gradient norms and every final weight, at the
tolerances of :mod:`test_exec_nccl` (GPU kernels sum in other orders than the CPU reference). The
first two plans deadlocked before :mod:`executor.parallel.groups` created and connected every communicator
in one global order (issue 12). bf16 plans must track their fp32 twin within bf16 tolerance.
"""

from __future__ import annotations

from dataclasses import replace
from functools import cache

import pytest
import torch
from exec_jobs import (
    ORACLE_OPTIM,
    TINY,
    TINY8,
    assemble_pipeline,
    checkpoint_job,
    global_batches,
    make_plan,
    split_share_job,
    train_packed,
    train_plans,
)
from torch.testing import assert_close

from executor.parallel.split_share import shared_sets
from planner.interleave import interleaved
from planner.layout import build_topology
from planner.plan import Plan
from tests.support.dist_testing import DistPool
from tests.support.reference import ReferenceRun, reference_train
from tests.support.searched_plans import searched

pytestmark = [pytest.mark.gpu, pytest.mark.slow,
              pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.device_count() < 4,
                                 reason="needs 4 CUDA devices")]

RTOL, ATOL = 1e-4, 1e-5
BATCH, STEPS = 8, 3


def _opts(plan: Plan, **kw: object) -> Plan:
    return replace(plan, options=replace(plan.options, **kw))


def _p(pipes: list[tuple[int, int, str, list[tuple[int, ...]]]], **kw: object) -> Plan:
    return _opts(make_plan(TINY8, pipes), **kw)


def _chunks3(plan: Plan) -> Plan:
    """``plan``'s one pipeline interleaved with three layer chunks per stage."""
    return replace(plan, pipelines=(interleaved(plan.pipelines[0], 3),))


PLANS: dict[str, Plan] = {
    # the two plans that deadlocked on 4 GPUs (issue 12)
    "tp1-2-1": _p([(8, 4, "1f1b", [(1, 2), (2, 4), (1, 2)])]),
    "tp2-1+single-gpipe": _p([(5, 5, "1f1b", [(2, 3), (1, 5)]), (3, 1, "gpipe", [(1, 8)])]),
    "tp2-1+single-gpipe-zero1": _p([(5, 5, "1f1b", [(2, 3), (1, 5)]), (3, 1, "gpipe", [(1, 8)])], zero=1),
    "tp1-2+single": _p([(6, 3, "1f1b", [(1, 3), (2, 5)]), (2, 2, "1f1b", [(1, 8)])]),
    "tp2-1-1": _p([(8, 4, "1f1b", [(2, 2), (1, 3), (1, 3)])]),
    "tp1-1-2-gpipe": _p([(8, 4, "gpipe", [(1, 3), (1, 2), (2, 3)])]),
    "tp4": _p([(8, 2, "1f1b", [(4, 8)])]),
    "pp4-1f1b": _p([(8, 8, "1f1b", [(1, 2), (1, 2), (1, 2), (1, 2)])]),
    # fewer micro-batches than stages: stages 0 and 1 turn from their last forward to their first
    # backward with one fused send/receive (executor.parallel.schedules.run_ops), as GPipe's turn above does
    "pp4-1f1b-fewer-mb-than-stages": _p([(8, 2, "1f1b", [(1, 2), (1, 2), (1, 2), (1, 2)])]),
    "tp2-vs-pp2": _p([(4, 2, "1f1b", [(2, 8)]), (4, 4, "1f1b", [(1, 4), (1, 4)])]),
    "tp2-vs-pp2-zero1": _p([(3, 3, "gpipe", [(2, 8)]), (5, 5, "1f1b", [(1, 6), (1, 2)])], zero=1),
    "three-pipelines-zero1": _p([(3, 3, "1f1b", [(2, 8)]), (3, 1, "gpipe", [(1, 8)]), (2, 2, "1f1b", [(1, 8)])],
                                zero=1),
    "four-pipelines-zero1": _p([(3, 3, "1f1b", [(1, 8)]), (2, 1, "gpipe", [(1, 8)]), (2, 2, "1f1b", [(1, 8)]),
                                (1, 1, "1f1b", [(1, 8)])], zero=1),
    "tp1-2-1-recompute-full": _p([(8, 4, "1f1b", [(1, 2), (2, 4), (1, 2)])], recompute="full"),
    "tp2-1+single-recompute-selective": _p([(6, 3, "1f1b", [(2, 5), (1, 3)]), (2, 2, "gpipe", [(1, 8)])],
                                           recompute="selective"),
    # ZB-H1 (executor.parallel.weight_grad_store): W ops between a B's send and the next receive, TP changes
    # between stages, the hooks' bucket launches coming from W ops, ZeRO-1, fewer mb than stages
    "zb-tp1-2-1": _p([(8, 4, "zb-h1", [(1, 2), (2, 4), (1, 2)])]),
    "zb-pp4": _p([(8, 8, "zb-h1", [(1, 2), (1, 2), (1, 2), (1, 2)])]),
    "zb-pp4-fewer-mb-than-stages": _p([(8, 2, "zb-h1", [(1, 2), (1, 2), (1, 2), (1, 2)])]),
    "zb-tp2-1+single-gpipe-zero1": _p([(5, 5, "zb-h1", [(2, 3), (1, 5)]), (3, 1, "gpipe", [(1, 8)])], zero=1),
    "zb-tp2-1+zb-single-recompute-full": _p([(6, 3, "zb-h1", [(2, 5), (1, 3)]), (2, 2, "zb-h1", [(1, 8)])],
                                            recompute="full"),
    # context parallelism (stages are (tp, layers, cp); executor.parallel.context_parallel, cp_p2p): K/V
    # all-gathers on their own CP communicators, piece-wise boundaries for cp 2 -> 1, 1 -> 2, 2 -> 2
    "cp2": _p([(8, 4, "1f1b", [(1, 8, 2)])]),
    "cp4": _p([(8, 2, "1f1b", [(1, 8, 4)])]),
    "cp2xtp2": _p([(8, 4, "1f1b", [(2, 8, 2)])]),
    "cp2-then-tp2": _p([(8, 4, "1f1b", [(1, 4, 2), (2, 4)])]),
    "zb-tp2-then-cp2": _p([(8, 4, "zb-h1", [(2, 4), (1, 4, 2)])]),
    "zb-cp2-cp2": _p([(8, 4, "zb-h1", [(1, 3, 2), (1, 5, 2)])]),
    "zb-cp2+tp2-zero1": _p([(4, 2, "zb-h1", [(1, 8, 2)]), (4, 2, "1f1b", [(2, 8)])], zero=1),
    "lone-cp4-zero1": _p([(8, 2, "1f1b", [(1, 8, 4)])], zero=1),  # ZeRO-1 over the CP slots alone
    "cp2xtp2-recompute-selective": _p([(8, 4, "1f1b", [(2, 8, 2)])], recompute="selective"),
    # interleaved 1F1B (two layer chunks per stage, planner.schedules.comm's rounds): 4 stages send from the
    # last back to the first over their own boundary group; every forward before the first backward
    # (m = stages); TP changes between stages; two interleaved pipelines and ZeRO-1
    "il-pp4": _p([(8, 8, "interleaved-1f1b", [(1, 2), (1, 2), (1, 2), (1, 2)])]),
    "il-pp4-m4": _p([(8, 4, "interleaved-1f1b", [(1, 2), (1, 2), (1, 2), (1, 2)])]),
    "il-tp2-1-1-uneven-mb": _p([(8, 6, "interleaved-1f1b", [(2, 2), (1, 3), (1, 3)])]),
    "il-pp2-x2-zero1": _p([(5, 4, "interleaved-1f1b", [(1, 4), (1, 4)]),
                           (3, 2, "interleaved-1f1b", [(1, 3), (1, 5)])], zero=1),
    "il-tp2-1+single-zero1": _p([(5, 4, "interleaved-1f1b", [(2, 3), (1, 5)]), (3, 1, "1f1b", [(1, 8)])], zero=1),
    "il-3-chunks-tp1-2": _chunks3(_p([(8, 6, "1f1b", [(1, 4), (2, 4)])])),
    # interleaved 1F1B with CP stages (stages (tp, layers, cp); executor.parallel.cp_p2p's exchange in the rounds,
    # planner.schedules.slot_comm): every stage cp 2; cp 2 -> tp 2, the wrap tp 2 -> cp 2 on the same groups;
    # three stages whose last (cp 1) sends to the first (cp 2) on their own wrap pairs; ZeRO-1 beside 1F1B
    "il-cp2-cp2": _p([(8, 4, "interleaved-1f1b", [(1, 4, 2), (1, 4, 2)])]),
    "il-cp2-then-tp2": _p([(8, 4, "interleaved-1f1b", [(1, 4, 2), (2, 4)])]),
    "il-cp2-tp1-tp1": _p([(8, 6, "interleaved-1f1b", [(1, 3, 2), (1, 3), (1, 2)])]),
    "il-cp2-tp1+single-zero1": _p([(5, 4, "interleaved-1f1b", [(1, 4, 2), (1, 4)]), (3, 1, "1f1b", [(1, 8)])],
                                  zero=1),
    # placed by the search (tests.support.searched_plans): a 1F1B single stage beside an interleaved
    # 3-stage pipeline of uneven chunks (2+1 layers on its first stage), ZeRO-1
    "il-searched-single+pp3-zero1": searched([[0], [2, 3, 4]], BATCH).plan,
}
BF16_PLANS = ("tp1-2-1", "tp2-1+single-gpipe-zero1", "tp2-vs-pp2", "zb-tp1-2-1", "cp2xtp2", "cp2-then-tp2",
              "il-pp4")
# ``small-buckets:``: gradient buckets of SMALL_BUCKETS elements, so the overlapped reduction runs as
# dozens of reduce-scatters (all-reduces without ZeRO) launched from the backward's and the W ops'
# hooks on the autograd thread, and ZeRO-1's dozens of weight all-gathers are waited layer by layer
SMALL_BUCKETS = 3000
OVERLAP = [f"small-buckets:{n}" for n, p in PLANS.items()
           if p.options.zero or n in ("tp2-vs-pp2", "zb-tp2-1+zb-single-recompute-full")]


@pytest.fixture(scope="module")
def nccl4() -> DistPool:
    pool = DistPool(4, timeout=150, backend="nccl", pg_timeout=120, preload=("executor.train.engine", "exec_jobs"))
    yield pool
    pool.close()


@cache
def _batches() -> list[torch.Tensor]:
    return global_batches(TINY8, BATCH, STEPS)


@cache
def _reference() -> ReferenceRun:
    return reference_train(TINY8, _batches(), optim=ORACLE_OPTIM)


def _variant(name: str) -> tuple[str, dict[str, object]]:
    """``[chunked-loss:][small-buckets:]plan`` -> the plan's key and train_plans' keywords."""
    *prefixes, key = name.split(":")
    kw: dict[str, object] = {"chunked_loss": "chunked-loss" in prefixes}
    if "small-buckets" in prefixes:
        kw["bucket_numel"] = SMALL_BUCKETS
    return key, kw


@pytest.mark.parametrize("name", [*PLANS, "chunked-loss:tp2-1+single-gpipe-zero1", *OVERLAP,
                                  "chunked-loss:small-buckets:zb-tp2-1+single-gpipe-zero1"])
def test_nccl4_oracle(nccl4: DistPool, name: str) -> None:
    """``chunked-loss:``: the plan with executor.model.chunked_loss (its TP all-reduces on NCCL);
    ``small-buckets:``: see ``SMALL_BUCKETS``."""
    key, kw = _variant(name)
    plan, ref = PLANS[key], _reference()
    res = nccl4.run(train_plans, [plan], [_batches()], accelerator=True, **kw)
    results = [r[0] for r in res[:plan.world_size]]  # ranks beyond the plan idle
    for r in results:
        assert_close(r["losses"], ref.losses, rtol=RTOL, atol=0, msg=f"{name} losses")
        assert_close(r["norms"], ref.grad_norms, rtol=RTOL, atol=0, msg=f"{name} norms")
    for p in range(len(plan.pipelines)):
        rebuilt = assemble_pipeline(plan, results, p)
        for n, want in ref.state.items():
            assert_close(rebuilt[n], want, rtol=RTOL, atol=ATOL, msg=lambda m, n=n, p=p: f"{name} p{p} {n}: {m}")


@pytest.mark.parametrize("name", ["cp2xtp2", "cp2-then-tp2"])
def test_nccl4_cp_compiled_blocks(nccl4: DistPool, name: str) -> None:
    """Compiled blocks (Inductor) on CP stages: the K/V all-gather and its reduce-scatter stay eager
    graph breaks (executor.parallel.kv_gather.keep_kv_gather_eager, as the TP all-reduces:
    traced inside a compiled block, an NCCL collective once gave an 8 % wrong gradient norm)."""
    plan, ref = PLANS[name], _reference()
    res = nccl4.run(train_plans, [plan], [_batches()], accelerator=True, compile_backend="inductor")
    results = [r[0] for r in res[:plan.world_size]]  # ranks beyond the plan idle
    for r in results:
        assert_close(r["losses"], ref.losses, rtol=RTOL, atol=0, msg=f"{name} losses")
        assert_close(r["norms"], ref.grad_norms, rtol=RTOL, atol=0, msg=f"{name} norms")
    rebuilt = assemble_pipeline(plan, results, 0)
    for n, want in ref.state.items():
        assert_close(rebuilt[n], want, rtol=RTOL, atol=ATOL, msg=lambda m, n=n: f"{name} {n}: {m}")


@pytest.mark.parametrize("name", ["packed-cp2-then-tp2", "packed-il-cp2-then-tp1"])
def test_nccl4_cp_packed_documents(nccl4: DistPool, name: str) -> None:
    """Packed rows on a cp 2 stage, then a tp 2 stage: K/V all-gather masked by document and global position
    (executor.parallel.context_parallel.cp_packed_attention) equals every document trained alone. The
    interleaved one exchanges micro-batches of 12 and 8 tokens in one round (each cut by its own length)."""
    from test_exec_cp_oracle import PACKED, packed_steps

    plan = PACKED[name]  # 4 ranks (the pool's size)
    steps, layouts = packed_steps(len(plan.pipelines))
    ref = reference_train(plan.model, steps, optim=ORACLE_OPTIM)
    res = nccl4.run(train_packed, plan, steps, layouts, accelerator=True)
    for r in res[:plan.world_size]:
        assert_close(r["losses"], ref.losses, rtol=RTOL, atol=0, msg="losses")
        assert_close(r["norms"], ref.grad_norms, rtol=RTOL, atol=0, msg="norms")
    for n, want in ref.state.items():
        assert_close(res[0]["state"][n], want, rtol=RTOL, atol=ATOL, msg=lambda m, n=n: f"{n}: {m}")


@pytest.mark.parametrize("name", [*BF16_PLANS, "chunked-loss:tp2-1+single-gpipe-zero1",
                                  "small-buckets:zb-tp2-1+single-gpipe-zero1"])
def test_nccl4_bf16_tracks_fp32(nccl4: DistPool, name: str) -> None:
    """bf16 runs the engine's cast-once weights (executor.model.cast_once: copies made after ZeRO-1's
    gates); ``chunked-loss:`` also the chunked cross-entropy, in both runs; ``small-buckets:`` the
    copies made after each layer's own gathers."""
    key, kw = _variant(name)
    fp32 = PLANS[key]
    bf16 = _opts(fp32, dtype="bf16")
    res = nccl4.run(train_plans, [fp32, bf16], [_batches(), _batches()], accelerator=True, **kw)
    l32, l16 = res[0][0]["losses"], res[0][1]["losses"]
    assert all(torch.isfinite(torch.tensor(l16)))
    assert_close(l16, l32, rtol=2e-2, atol=0)


def test_nccl4_checkpoint_between_plans(nccl4: DistPool, tmp_path) -> None:
    """Saved under a TP 1 -> 2 -> 1 pipeline, resumed under three ZeRO-1 pipelines of other TP."""
    batches = global_batches(TINY, 8, 4, seed=5)
    ref = reference_train(TINY, batches, optim=ORACLE_OPTIM)
    x = make_plan(TINY, [(8, 4, "1f1b", [(1, 1), (2, 2), (1, 1)])])
    y = _opts(make_plan(TINY, [(3, 3, "1f1b", [(2, 4)]), (3, 1, "gpipe", [(1, 4)]), (2, 2, "1f1b", [(1, 4)])]),
              zero=1)
    other = make_plan(TINY8, [(8, 1, "1f1b", [(1, 8)])])
    res = nccl4.run(checkpoint_job, x, y, other, batches, 2, str(tmp_path / "ck"), accelerator=True)
    for r in res:
        assert_close(r["losses_x"] + r["losses_y"], ref.losses, rtol=RTOL, atol=0)
    for n, want in ref.state.items():
        assert_close(res[0]["state"][n], want, rtol=RTOL, atol=ATOL, msg=lambda m, n=n: f"{n}: {m}")
    assert "differs in" in res[0]["other_model_error"]


def test_nccl4_sync_groups_share_the_default_communicators_resources(nccl4: DistPool) -> None:
    """executor.parallel.split_share: the gradient-sync groups are splits sharing the default
    communicator's resources, the TP and p2p groups are not; each group works."""
    plan = PLANS["tp2-vs-pp2-zero1"]
    share = shared_sets(build_topology(plan))
    assert share  # the case has sync groups that may share
    for rows in nccl4.run(split_share_job, plan):
        for ranks, shared, total in rows:
            assert (shared == 1) == (ranks in share), ranks
            assert total == len(ranks), ranks
