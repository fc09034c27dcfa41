"""executor.model.cast_once under CPU autocast (bf16), the numerics of the GPU path, which the engine
never takes on CPU (there it trains in fp32, the oracle's path, untouched by this module):

* a cast-once projection computes autocast's bf16 product bit for bit, and its input gradient;
  its weight gradient is the bf16 GEMM's, in fp32 (on CUDA the GEMM writes fp32 directly);
* a stage trained by hand as the engine does (weights_changed() after each optimizer step) makes
  one copy per layer and step, whatever the micro-batch count, and never uses a stale copy:
  every block and the head see copies equal to the current weights, and the losses follow
  autocast's own within bf16 rounding.
The ZeRO-1 case (copies made after the all-gather gate) runs on gloo ranks in test_exec_zero."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.testing import assert_close

from executor.model.cast_once import CastOnceLinear
from executor.model.init import logical_init
from executor.model.llama import StageModule
from executor.parallel.tp_layers import ColumnParallelLinear, RowParallelLinear
from executor.train.optim import OptimConfig, build_optimizer
from planner.layout import stage_params
from planner.model import PRESETS

MODEL = PRESETS["tiny"]


def test_projection_is_autocasts_product_with_an_fp32_weight_gradient() -> None:
    gen = torch.Generator().manual_seed(0)
    x, w, dy = (torch.randn(2, 5, 16, generator=gen), torch.randn(8, 16, generator=gen),
                torch.randn(2, 5, 8, generator=gen).bfloat16())
    xa, wa = x.clone().requires_grad_(), w.clone().requires_grad_()
    xc, wc = x.clone().requires_grad_(), w.clone().requires_grad_()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        ya = F.linear(xa, wa)
        yc = CastOnceLinear.apply(xc, wc, w.bfloat16(), False)
    assert yc.dtype == torch.bfloat16 and torch.equal(yc, ya)
    ya.backward(dy)
    yc.backward(dy)
    assert xc.grad is not None and wc.grad is not None and wa.grad is not None
    assert torch.equal(xc.grad, xa.grad) and wc.grad.dtype == torch.float32
    assert_close(wc.grad, wa.grad, rtol=1e-2, atol=1e-2)


def _stage() -> StageModule:
    stage = StageModule(MODEL, layers=(0, MODEL.num_layers), first=True, last=True, tp=1, tp_rank=0, group=None)
    dims = {p.name: p.shard_dim for p in stage_params(MODEL, (0, MODEL.num_layers), True, True)}
    stage.load_logical(logical_init(MODEL, 0, dims), dims)
    return stage


def _linears(mod: torch.nn.Module) -> list[ColumnParallelLinear | RowParallelLinear]:
    return [m for m in mod.modules() if isinstance(m, (ColumnParallelLinear, RowParallelLinear))]


def _train(stage: StageModule, steps: int, micro: int) -> list[float]:
    """Steps of ``micro`` micro-batches under CPU bf16 autocast; the engine's two invalidations."""
    # fused AdamW, as on CUDA: it writes the weights without bumping their version counters
    opt = build_optimizer(list(stage.named_parameters()), OptimConfig(lr=1e-2, warmup_steps=0, fused=True))
    opt.register_step_post_hook(stage.weights_changed)
    gen = torch.Generator().manual_seed(3)
    losses = []
    for _ in range(steps):
        stage.weights_changed()  # Engine.zero_grads
        opt.zero_grad()
        total = 0.0
        for _ in range(micro):
            tok = torch.randint(0, MODEL.vocab_size, (2, MODEL.seq_len + 1), generator=gen)
            with torch.autocast("cpu", dtype=torch.bfloat16):
                loss = stage.loss(stage(tok[:, :-1]), tok[:, 1:]).mean()
            loss.backward()
            total += float(loss.detach())
        opt.step()
        losses.append(total / micro)
    return losses


def _check_fresh(stage: StageModule, seen: list[bool]) -> None:
    """At every block's and the head's use: each copy equals its weight in bf16."""
    def check(mod: torch.nn.Module) -> None:
        for lin in _linears(mod):
            seen.append(lin.weight_lp is not None and torch.equal(lin.weight_lp, lin.weight.detach().bfloat16()))

    for block in stage.layers.values():
        block.register_forward_pre_hook(lambda m, _args: check(m))
    assert stage.lm_head is not None
    stage.lm_head.register_forward_pre_hook(lambda m, _args: check(m))


def test_one_copy_per_layer_and_step_never_stale_and_losses_follow_autocast() -> None:
    on, off = _stage(), _stage()
    on.cast_once = True
    seen: list[bool] = []
    _check_fresh(on, seen)
    steps, micro = 3, 2
    lo, la = _train(on, steps, micro), _train(off, steps, micro)
    assert seen and all(seen)
    assert len(seen) == steps * micro * len(_linears(on))
    assert on.weight_copies.copies_made == steps * (MODEL.num_layers + 1)  # layers + head, once a step
    assert all(lin.weight_lp is None for lin in _linears(off))  # off: autocast's casts, nothing kept
    assert_close(torch.tensor(lo), torch.tensor(la), rtol=2e-2, atol=0)
    on.cast_once = False
    assert all(lin.weight_lp is None for lin in _linears(on))


def test_a_weight_written_in_place_is_copied_again() -> None:
    stage = _stage()
    stage.cast_once = True
    tok = torch.randint(0, MODEL.vocab_size, (1, 9))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        stage(tok)
        lin = _linears(stage.layers["0"])[0]
        with torch.no_grad():
            lin.weight.mul_(2.0)  # e.g. a checkpoint load or a layout switch (copy_): _version moves
        stage(tok)
    assert lin.weight_lp is not None and torch.equal(lin.weight_lp, lin.weight.detach().bfloat16())


def test_without_autocast_no_copy_is_made() -> None:
    stage = _stage()
    stage.cast_once = True
    stage(torch.randint(0, MODEL.vocab_size, (1, 9)))
    assert stage.weight_copies.copies_made == 0
