"""executor.model.chunked_loss: the row-chunked cross-entropy equals the unchunked one (fp32, 1e-6), and
with it on, the last stage's loss saves no fp32 copy of the micro-batch's logits for backward (TP
1; the TP collectives are checked on 2 and 4 ranks in ``test_exec_tp_layers``)."""

from __future__ import annotations

import pytest
import torch
from torch.testing import assert_close

from executor.model.chunked_loss import chunk_rows, chunked_vocab_cross_entropy
from executor.model.llama import StageModule
from executor.parallel.tp_layers import vocab_parallel_cross_entropy
from planner.model import PRESETS


@pytest.mark.parametrize("rows", [1, 4, 7, 64])
def test_chunked_equals_unchunked_fp32(rows: int) -> None:
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(3, 7, 50, generator=gen) * 4
    labels = torch.randint(0, 50, (3, 7), generator=gen)
    g = torch.rand(3, 7, generator=gen)
    ref_in, in_ = logits.clone().requires_grad_(), logits.clone().requires_grad_()
    ref = vocab_parallel_cross_entropy(ref_in, labels, vocab_start=0, group=None)
    ref.backward(g)
    out = chunked_vocab_cross_entropy(in_, labels, vocab_start=0, group=None, rows=rows)
    out.backward(g)
    assert out.dtype == torch.float32 and out.shape == labels.shape
    assert_close(out, ref, rtol=1e-6, atol=1e-6)
    assert_close(in_.grad, ref_in.grad, rtol=1e-6, atol=1e-6)


def test_chunk_rows_bounds_a_chunk() -> None:
    assert chunk_rows(32000, 1 << 25) == 1048 and chunk_rows(10**9, 1 << 25) == 1


def _saved_fp32_logit_copies(stage: StageModule, hidden: torch.Tensor, labels: torch.Tensor) -> int:
    """Tensors of at least ``tokens x vocab`` fp32 elements the loss keeps for backward."""
    big = labels.numel() * stage.spec.vocab_size
    seen = []

    def pack(t: torch.Tensor) -> torch.Tensor:
        seen.append(t.dtype == torch.float32 and t.numel() >= big)
        return t

    with torch.autocast("cpu", dtype=torch.bfloat16), torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        stage.loss(hidden, labels).sum().backward()
    return sum(seen)


def test_stage_loss_keeps_no_fp32_logits_under_bf16() -> None:
    m = PRESETS["tiny"]
    stage = StageModule(m, layers=(0, 0), first=False, last=True, tp=1, tp_rank=0, group=None)
    for p in stage.parameters():
        torch.nn.init.normal_(p, std=0.02)
    hidden = torch.randn(2, 16, m.hidden_size)
    labels = torch.randint(0, m.vocab_size, (2, 16))
    assert _saved_fp32_logit_copies(stage, hidden, labels) == 1  # the default: the planner's formula
    stage.chunked_loss = True
    assert _saved_fp32_logit_copies(stage, hidden, labels) == 0
