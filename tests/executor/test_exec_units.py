"""Single-process checks: LR schedule, clipping rule, deterministic init, the stage module on one
rank against the dense reference, and the test pool's error reporting."""

from __future__ import annotations

import math

import pytest
import torch
import torch.distributed as dist
from exec_jobs import TINY, TINY8, engine_errors_job
from torch.testing import assert_close

from executor.model.init import init_tensor, logical_init
from executor.model.llama import StageModule, shard_of
from executor.train.optim import OptimConfig, clip_coefficient, decays, lr_at
from planner.layout import logical_params
from tests.support.dist_testing import DistributedError, run_distributed
from tests.support.reference import reference_model


def test_lr_warmup_then_cosine() -> None:
    cfg = OptimConfig(lr=1.0, min_lr=0.1, warmup_steps=4, total_steps=14)
    assert [lr_at(k, cfg) for k in range(4)] == [0.25, 0.5, 0.75, 1.0]
    assert lr_at(4, cfg) == pytest.approx(1.0)
    assert lr_at(9, cfg) == pytest.approx(0.1 + 0.45 * (1 + math.cos(math.pi * 0.5)))
    assert lr_at(14, cfg) == pytest.approx(0.1) and lr_at(100, cfg) == pytest.approx(0.1)
    assert all(lr_at(k, cfg) >= lr_at(k + 1, cfg) for k in range(4, 20))
    assert lr_at(0, OptimConfig(lr=2.0, min_lr=0.0, warmup_steps=0, total_steps=10)) == pytest.approx(2.0)


def test_clip_coefficient_and_decay_groups() -> None:
    assert float(clip_coefficient(torch.tensor(4.0), 1.0)) == pytest.approx(1 / (4 + 1e-6))
    assert float(clip_coefficient(torch.tensor(0.5), 1.0)) == 1.0
    assert float(clip_coefficient(torch.tensor(9.0), 0.0)) == 1.0
    assert not decays("layers.0.attn_norm.weight") and not decays("final_norm.weight")
    assert decays("embed.weight") and decays("layers.3.mlp.w_down.weight")
    with pytest.raises(ValueError):
        OptimConfig(lr=1e-3, min_lr=1e-2)


def test_init_is_per_name_and_seeded() -> None:
    full = logical_init(TINY, seed=3)
    assert list(full) == [p.name for p in logical_params(TINY)]
    some = logical_init(TINY, seed=3, names=["layers.2.attn.wk.weight", "lm_head.weight"])
    assert set(some) == {"layers.2.attn.wk.weight", "lm_head.weight"}
    assert torch.equal(some["lm_head.weight"], full["lm_head.weight"])
    assert not torch.equal(logical_init(TINY, seed=4, names=["lm_head.weight"])["lm_head.weight"],
                           full["lm_head.weight"])
    assert not torch.equal(full["layers.0.attn.wq.weight"], full["layers.1.attn.wq.weight"])
    assert torch.equal(full["final_norm.weight"], torch.ones(TINY.hidden_size))
    wo = init_tensor(TINY, 0, "layers.0.attn.wo.weight", (64, 64))
    assert float(wo.std()) == pytest.approx(0.02 / math.sqrt(2 * TINY.num_layers), rel=0.1)


@pytest.mark.parametrize("model", [TINY, TINY8], ids=lambda m: m.name)
def test_single_rank_stage_equals_dense_reference(model) -> None:
    """The whole model as one tp-1 stage (no process group) vs the independent dense reference."""
    ref = reference_model(model, seed=0)
    stage = StageModule(model, layers=(0, model.num_layers), first=True, last=True, tp=1, tp_rank=0, group=None)
    dims = {p.name: p.shard_dim for p in logical_params(model)}
    stage.load_logical(logical_init(model, 0), dims)
    tokens = torch.randint(0, model.vocab_size, (3, model.seq_len + 1), generator=torch.Generator().manual_seed(0))
    loss = stage.loss(stage(tokens[:, :-1]), tokens[:, 1:]).mean()
    want = ref.loss(tokens)
    assert_close(loss, want, rtol=1e-6, atol=0)
    loss.backward()
    want.backward()
    grads = dict(stage.named_parameters())
    for name, p in ref.named_parameters():
        assert_close(grads[name].grad, p.grad, rtol=1e-5, atol=1e-7, msg=lambda m, n=name: f"{n}: {m}")
    assert abs(float(want.detach()) - math.log(model.vocab_size)) < 0.1  # near-uniform predictions at init


def test_shard_of() -> None:
    t = torch.arange(24.0).view(4, 6)
    assert torch.equal(shard_of(t, 1, 3, 2), t[:, 4:6])
    assert torch.equal(shard_of(t, 0, 2, 1), t[2:])
    assert shard_of(t, None, 4, 3) is t


def _fail_on_rank_one() -> int:
    if dist.get_rank() == 1:
        raise ValueError("boom on purpose")
    dist.barrier()
    return 0


def _deadlock() -> None:
    if dist.get_rank() == 0:
        dist.recv(torch.zeros(1), src=1)  # rank 1 never sends


def _rank_and_sum() -> tuple[int, float]:
    t = torch.ones(2) * (dist.get_rank() + 1)
    dist.all_reduce(t)
    return dist.get_rank(), float(t[0])


@pytest.mark.slow
def test_dist_testing_results_errors_and_timeouts() -> None:
    assert run_distributed(_rank_and_sum, 3) == [(0, 6.0), (1, 6.0), (2, 6.0)]
    with pytest.raises(DistributedError, match="(?s)rank 1 failed.*ValueError: boom on purpose"):
        run_distributed(_fail_on_rank_one, 2, timeout=60)
    with pytest.raises(TimeoutError, match="did not finish on ranks"):
        run_distributed(_deadlock, 2, timeout=3)


@pytest.mark.slow
@pytest.mark.xdist_group("executor-pool")
def test_engine_misuse_errors(dist_pool) -> None:
    res = dist_pool.run(engine_errors_job)
    for rank, r in enumerate(res):
        assert "the plan needs 9 ranks, torch.distributed has 8" in r["world"]
        if rank >= 2:
            assert "is not part of the plan" in r["outside"]
            continue
        for shape in ["(3, 33)", "(2, 34)", "(2,)"]:
            assert "expects tokens [2, <= 33]" in r[shape]
