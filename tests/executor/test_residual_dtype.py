"""``options.residual_dtype``: a bf16 residual stream inside each stage (executor/model/llama.py).

Under CPU autocast (the GPU path's numerics): the blocks see a bf16 residual, the stage's output
is fp32 (so pipeline boundaries carry what they carried before), and a model cut into two stages
computes bit for bit what the uncut model does, forward and gradients. Without autocast the option
changes nothing."""

from __future__ import annotations

import pytest
import torch

from executor.model.init import logical_init
from executor.model.llama import StageModule
from planner.layout import stage_params
from planner.model import PRESETS

MODEL = PRESETS["tiny"]
LAYERS = MODEL.num_layers


def _stage(layers: tuple[int, int], *, residual: str) -> StageModule:
    first, last = layers[0] == 0, layers[1] == LAYERS
    stage = StageModule(MODEL, layers=layers, first=first, last=last, tp=1, tp_rank=0, group=None,
                        residual=residual)
    dims = {p.name: p.shard_dim for p in stage_params(MODEL, layers, first, last)}
    stage.load_logical(logical_init(MODEL, 0, dims), dims)
    return stage


def _ids(seed: int = 3) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    tok = torch.randint(0, MODEL.vocab_size, (2, MODEL.seq_len + 1), generator=gen)
    return tok[:, :-1], tok[:, 1:]


def _block_input_dtypes(stage: StageModule) -> list[torch.dtype]:
    seen: list[torch.dtype] = []
    for block in stage.layers.values():
        block.register_forward_pre_hook(lambda _m, args: seen.append(args[0].dtype))
    return seen


@pytest.mark.parametrize(("residual", "inside"), [("bf16", torch.bfloat16), ("fp32", torch.float32)])
def test_blocks_see_the_residual_dtype_and_the_stage_returns_fp32(residual: str, inside: torch.dtype) -> None:
    stage = _stage((0, LAYERS - 1), residual=residual)
    seen = _block_input_dtypes(stage)
    x, _ = _ids()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = stage(x)
    assert seen == [inside] * (LAYERS - 1)
    assert out.dtype == torch.float32


def test_without_autocast_the_option_changes_nothing() -> None:
    x, y = _ids()
    low, plain = _stage((0, LAYERS), residual="bf16"), _stage((0, LAYERS), residual="fp32")
    seen = _block_input_dtypes(low)
    assert torch.equal(low.loss(low(x), y), plain.loss(plain(x), y))
    assert set(seen) == {torch.float32}


def test_the_bf16_residual_changes_the_autocast_numerics() -> None:
    """The option is in effect: under autocast its loss is not the fp32 residual's bit for bit."""
    x, y = _ids()
    low, plain = _stage((0, LAYERS), residual="bf16"), _stage((0, LAYERS), residual="fp32")
    with torch.autocast("cpu", dtype=torch.bfloat16):
        a, b = low.loss(low(x), y), plain.loss(plain(x), y)
    assert not torch.equal(a, b)
    torch.testing.assert_close(a.mean(), b.mean(), rtol=2e-2, atol=2e-2)


def test_two_stages_equal_one_bit_for_bit() -> None:
    """The stage boundary's fp32 round trip is exact: a pipeline cut changes no bit."""
    x, y = _ids()
    whole = _stage((0, LAYERS), residual="bf16")
    cut = LAYERS // 2
    head, tail = _stage((0, cut), residual="bf16"), _stage((cut, LAYERS), residual="bf16")
    with torch.autocast("cpu", dtype=torch.bfloat16):
        ref = whole.loss(whole(x), y)
        mid = head(x)
        sent = mid.detach().requires_grad_(True)  # what the next stage receives
        got = tail.loss(tail(sent), y)
    assert mid.dtype == torch.float32
    assert torch.equal(ref, got)
    ref.sum().backward()
    got.sum().backward()
    mid.backward(sent.grad)
    grads = dict(head.named_parameters()) | dict(tail.named_parameters())
    for name, p in whole.named_parameters():
        assert torch.equal(p.grad, grads[name].grad), name
