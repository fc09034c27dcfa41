"""The NaN/Inf guard (executor.train.nonfinite) on 4 gloo ranks: a NaN gradient on ONE rank of one
pipeline makes every rank take the same decision at the same step (the values are all-reduced), and
nothing of that step reaches the weights — under ``stop`` (every rank raises) and ``skip`` (the
step is dropped, training goes on), with and without ZeRO-1."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest
import torch
import torch.distributed as dist
from exec_jobs import TINY, global_batches, make_plan, pipeline_rows, pool_engine

from executor.train.nonfinite import NonFiniteStep
from planner.plan import Plan

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("executor-pool")]
PLAN = make_plan(TINY, [(4, 2, "1f1b", [(1, 2), (1, 2)]), (4, 2, "1f1b", [(1, 4)])])  # ranks 0,1 | 2
POISONED_RANK, POISONED_STEP = 2, 1


def nonfinite_job(plan: Plan, policy: str, batches: list[torch.Tensor]) -> dict[str, Any] | None:
    rank = dist.get_rank()
    eng = pool_engine(plan, seed=3, on_nonfinite=policy)
    if eng is None:
        return None
    groups = eng.groups
    out: dict[str, Any] = {"stats": [], "weights": [], "stopped_at": None}
    for k, tokens in enumerate(batches):
        handle = None
        if rank == POISONED_RANK and k == POISONED_STEP:
            handle = next(iter(eng.params.values())).register_hook(lambda g: g * float("nan"))
        try:
            out["stats"].append(eng.train_step(pipeline_rows(plan, eng.stage.pipeline, tokens)))
        except NonFiniteStep as exc:
            out["stopped_at"], out["message"] = k, str(exc)
        finally:
            if handle is not None:
                handle.remove()
        out["weights"].append({n: p.detach().clone() for n, p in eng.params.items()})
        if out["stopped_at"] is not None:
            break
    del eng
    groups.close()  # collective: the ranks outside the plan close theirs too
    return out


def _same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return all(torch.equal(a[n], b[n]) for n in a)


@pytest.mark.parametrize("zero", [0, 1])
def test_stop_and_skip_agree_on_every_rank(dist_pool, zero: int) -> None:
    plan = replace(PLAN, options=replace(PLAN.options, zero=zero))
    batches = global_batches(TINY, plan.global_batch_size, 3, seed=7)
    stopped = [r for r in dist_pool.run(nonfinite_job, plan, "stop", batches) if r is not None]
    skipped = [r for r in dist_pool.run(nonfinite_job, plan, "skip", batches) if r is not None]
    assert len(stopped) == len(skipped) == plan.world_size
    for r in stopped:  # every rank stops at the poisoned step, before the update
        assert r["stopped_at"] == POISONED_STEP and "not finite" in r["message"]
        assert _same(r["weights"][0], r["weights"][1])
    for r in skipped:  # every rank skips the same step and trains on afterwards
        assert [s.skipped for s in r["stats"]] == [False, True, False]
        assert _same(r["weights"][0], r["weights"][1]) and not _same(r["weights"][1], r["weights"][2])
        assert all(torch.isfinite(w).all() for w in r["weights"][2].values())
        assert torch.isfinite(torch.tensor(r["stats"][2].loss))
