"""``executor.model.recompute_core``: the attention core recomputed in the backward gives the gradients of
the core kept whole, under autocast too, and keeps only its inputs."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from executor.model.recompute_core import recomputed_core


def _core(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float | None) -> torch.Tensor:
    return F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scale)


def _inputs(seed: int, need: tuple[bool, bool, bool]) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return [torch.randn(2, 4, 32, 16, generator=gen).requires_grad_(r) for r in need]


@pytest.mark.parametrize("need", [(True, True, True), (True, False, True), (False, True, False)])
@pytest.mark.parametrize("scale", [None, 0.3])
def test_gradients_equal_the_core_kept_whole(need: tuple[bool, bool, bool], scale: float | None) -> None:
    a, b = _inputs(0, need), _inputs(0, need)
    up = torch.randn(2, 4, 32, 16, generator=torch.Generator().manual_seed(1))
    out_a = recomputed_core(_core, *a, scale)
    out_b = _core(*b, scale)
    assert torch.equal(out_a, out_b)
    (out_a * up).sum().backward()
    (out_b * up).sum().backward()
    for x, y in zip(a, b):
        assert (x.grad is None) == (y.grad is None)
        if x.grad is not None:
            assert torch.equal(x.grad, y.grad)


def test_the_recompute_runs_under_the_forwards_autocast() -> None:
    seen: list[torch.dtype] = []

    def core(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, _: None) -> torch.Tensor:
        out = torch.matmul(q, k.transpose(-1, -2)).softmax(-1) @ v  # matmul: bf16 under CPU autocast
        seen.append(out.dtype)
        return out

    q, k, v = _inputs(2, (True, True, True))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = recomputed_core(core, q, k, v, None)
    out.float().sum().backward()  # outside the autocast region, as the engine's backward is
    assert seen == [torch.bfloat16, torch.bfloat16] and q.grad is not None and q.grad.dtype == torch.float32


def test_only_the_inputs_are_kept_for_the_backward() -> None:
    q, k, v = _inputs(3, (True, True, True))
    kept: list[int] = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: kept.append(t.data_ptr()) or t, lambda t: t):
        recomputed_core(_core, q, k, v, None)
    assert sorted(kept) == sorted(t.data_ptr() for t in (q, k, v))
