"""The oracle for interleaved 1F1B (two or three layer chunks per stage, the last stage sending back
to the first between chunks): plans whose pipelines run interleaved train exactly like one dense
process — 2, 3 and 4 stages, TP changes between stages, two pipelines (data parallel) beside each other
and beside a 1F1B pipeline, ZeRO 0 and 1, full recompute, uneven micro-batch sizes, micro-batches =
and > stages; and context-parallel stages in interleaved pipelines (every stage cp 2, cp 2 -> tp 2,
a cp-1 last stage sending to a cp-2 first stage between chunks over three stages, ZeRO-1 beside a
second pipeline)."""

from __future__ import annotations

from dataclasses import replace

import pytest
from exec_jobs import TINY8, make_plan
from test_exec_cp_oracle import _slots_agree
from test_exec_oracle import run_oracle

from planner.interleave import interleaved
from planner.plan import Plan

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("executor-pool")]


def il_plan(pipes: list[tuple[int, int, str, list[tuple[int, ...]]]], zero: int = 0, chunks: int = 2,
            recompute: str = "none") -> Plan:
    """:func:`exec_jobs.make_plan` (stages ``(tp, layers[, cp])``) with ZeRO ``zero`` and ``recompute``,
    each ``interleaved-1f1b`` pipeline's stages cut into ``chunks`` layer chunks."""
    plan = make_plan(TINY8, [(b, m, "1f1b" if s == "interleaved-1f1b" else s, st) for b, m, s, st in pipes])
    pipelines = tuple(interleaved(p, chunks) if s == "interleaved-1f1b" else p
                      for p, (_, _, s, _) in zip(plan.pipelines, pipes))
    return replace(plan, pipelines=pipelines, options=replace(plan.options, zero=zero, recompute=recompute))


PLANS: dict[str, Plan] = {
    "il-2-stages-tp2-1-m4-uneven": il_plan([(5, 4, "interleaved-1f1b", [(2, 4), (1, 4)])]),
    "il-4-stages-tp1-2-1-2-m4": il_plan([(4, 4, "interleaved-1f1b", [(1, 2), (2, 2), (1, 2), (2, 2)])]),
    "il-two-pipelines-zero1": il_plan([(2, 2, "interleaved-1f1b", [(1, 3), (2, 5)]),
                                       (4, 4, "interleaved-1f1b", [(2, 4), (1, 4)])], zero=1),
    "il-4-stages-m8-beside-1f1b-zero1": il_plan([(8, 8, "interleaved-1f1b", [(1, 2), (1, 2), (1, 2), (1, 2)]),
                                                 (3, 2, "1f1b", [(2, 5), (1, 3)])], zero=1),
    "il-3-stages-tp2-1-1-recompute-full": il_plan([(6, 6, "interleaved-1f1b", [(2, 2), (1, 2), (1, 4)]),
                                                   (2, 2, "1f1b", [(1, 8)])], recompute="full"),
    "il-3-chunks-2-stages-tp2-1-zero1": il_plan([(6, 4, "interleaved-1f1b", [(2, 4), (1, 4)]),
                                                 (2, 2, "interleaved-1f1b", [(1, 3), (1, 5)])], zero=1, chunks=3),
}


# context parallelism inside interleaved rounds (executor.parallel.cp_p2p.CPStageComm.exchange); 4 ranks each,
# the shapes of test_exec_nccl4.py's il-cp plans
CP_PLANS: dict[str, Plan] = {
    "il-cp2-cp2-m4": il_plan([(4, 4, "interleaved-1f1b", [(1, 4, 2), (1, 4, 2)])]),
    "il-cp2-then-tp2-m2": il_plan([(4, 2, "interleaved-1f1b", [(1, 4, 2), (2, 4, 1)])]),
    "il-cp2-tp1-tp1-3-stages-m3": il_plan([(3, 3, "interleaved-1f1b", [(1, 3, 2), (1, 3), (1, 2)])]),
    "il-cp2-then-tp1-beside-1f1b-zero1": il_plan([(3, 2, "interleaved-1f1b", [(1, 4, 2), (1, 4)]),
                                                  (2, 2, "1f1b", [(1, 8)])], zero=1),
}


@pytest.mark.parametrize("name", list(CP_PLANS))
def test_interleaved_cp_oracle(dist_pool, name: str) -> None:
    plan = CP_PLANS[name]
    _slots_agree(plan, run_oracle(dist_pool, plan))


@pytest.mark.parametrize("name", list(PLANS))
def test_interleaved_oracle(dist_pool, name: str) -> None:
    run_oracle(dist_pool, PLANS[name])


def test_interleaved_plans_cover_the_claims() -> None:
    pipes = [p for pl in PLANS.values() for p in pl.pipelines if p.schedule == "interleaved-1f1b"]
    assert {p.chunks for p in pipes} == {2, 3} and all(len(s.chunks) == p.chunks for p in pipes for s in p.stages)
    assert {len(p.stages) for p in pipes} == {2, 3, 4}
    assert any(len({s.tp for s in p.stages}) > 1 for p in pipes)
    assert any(p.micro_batches == len(p.stages) for p in pipes) and any(p.micro_batches > len(p.stages) for p in pipes)
    assert any(len(set(p.micro_batch_sizes())) > 1 for p in pipes)
    assert any(sum(p.schedule == "interleaved-1f1b" for p in pl.pipelines) > 1 for pl in PLANS.values())
    assert {pl.options.zero for pl in PLANS.values()} == {0, 1}


@pytest.mark.parametrize("name", ["pp2+pp4-batch10", "single+pp3-batch8"])
def test_searched_plan_trains(dist_pool, name: str) -> None:
    """Layouts the search placed (tests.support.searched_plans: an interleaved pipeline beside a 1F1B
    one, chunks cut by planner.interleave, uneven on the 3-stage one; ZeRO-1) train exactly like one
    dense process. The second is test_exec_nccl4.py's ``il-searched-single+pp3-zero1``."""
    from tests.support.searched_plans import mixed_interleaved_search, searched

    plan = mixed_interleaved_search().plan if name == "pp2+pp4-batch10" else searched([[0], [2, 3, 4]], 8).plan
    assert {p.schedule for p in plan.pipelines} == {"interleaved-1f1b", "1f1b"} and plan.options.zero == 1
    run_oracle(dist_pool, plan)


@pytest.mark.parametrize("direction", ["interleaved-to-plain", "plain-to-interleaved"])
def test_checkpoint_between_interleaved_and_plain_plans(dist_pool, tmp_path, direction: str) -> None:
    """Checkpoints are logical: saved under an interleaved plan (ZeRO-1, two pipelines), loaded
    under a plain one, and the other way round, training continues exactly."""
    from exec_jobs import ORACLE_OPTIM, TINY, checkpoint_job, global_batches
    from torch.testing import assert_close

    from tests.support.reference import reference_train

    il = il_plan([(3, 2, "interleaved-1f1b", [(1, 4), (2, 4)]), (5, 4, "interleaved-1f1b", [(1, 2), (1, 2), (1, 2),
                                                                                              (1, 2)])], zero=1)
    plain = il_plan([(2, 1, "gpipe", [(1, 3), (2, 5)]), (6, 3, "1f1b", [(2, 8)])], zero=1)
    x, y = (il, plain) if direction == "interleaved-to-plain" else (plain, il)
    steps, split = 4, 2
    batches = global_batches(TINY8, 8, steps, seed=5)
    ref = reference_train(TINY8, batches, optim=ORACLE_OPTIM)
    res = dist_pool.run(checkpoint_job, x, y, make_plan(TINY, [(8, 1, "1f1b", [(1, 4)])]), batches, split,
                        str(tmp_path / "ckpt"))
    for rank in range(y.world_size):
        assert_close(res[rank]["losses_y"], ref.losses[split:], rtol=1e-5, atol=0)
    for name, want in ref.state.items():
        assert_close(res[0]["state"][name], want, rtol=1e-5, atol=2e-6, msg=lambda m, n=name: f"{n}: {m}")
