"""The blockwise CP attention's math on one process (executor.parallel.cp_blockwise): every CP
rank's local forward over the gathered K/V equals its rows of dense causal attention, its dQ the
dense dQ rows, and the ranks' dK/dV summed the dense dK/dV — the log-sum-exp merge and the
flash backward against the merged output (CPU's flash kernel; CUDA's run in the 4-GPU suite and
``benchmarks/executor/cp_attention.py``)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from executor.parallel.attention_pieces import KERNELS, kernel_for
from executor.parallel.context_parallel import split_sequence
from executor.parallel.cp_blockwise import expand_kv, local_backward, local_forward, pieces


def _rows(x: torch.Tensor, seq: int, cp: int, r: int) -> torch.Tensor:
    return split_sequence(x, cp, r, dim=-2)


@pytest.mark.parametrize(("cp", "kv_heads"), [(1, 4), (2, 4), (4, 4), (2, 2)])
def test_local_pieces_equal_dense_causal_attention(cp: int, kv_heads: int) -> None:
    torch.manual_seed(0)
    b, h, seq, d = 2, 4, 64, 16
    q = torch.randn(b, h, seq, d, dtype=torch.float64).float().requires_grad_(True)
    k, v = (torch.randn(b, kv_heads, seq, d).requires_grad_(True) for _ in range(2))
    dout = torch.randn(b, h, seq, d)
    ref = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=kv_heads != h)
    dq_ref, dk_ref, dv_ref = torch.autograd.grad(ref, (q, k, v), dout)
    kv = expand_kv(torch.stack([k, v]).detach(), h)
    kernel = KERNELS["cpu-flash"]
    dkv = torch.zeros(kv.shape)
    for r in range(cp):
        ql = _rows(q.detach(), seq, cp, r)
        out, lse, aux = local_forward(ql, kv, cp, r, kernel)
        torch.testing.assert_close(out, _rows(ref.detach(), seq, cp, r), atol=2e-6, rtol=2e-5)
        dq, part = local_backward(_rows(dout, seq, cp, r), ql, kv, out, lse, aux, cp, r, kernel)
        torch.testing.assert_close(dq, _rows(dq_ref, seq, cp, r), atol=2e-6, rtol=2e-5)
        dkv += part
    g = h // kv_heads
    dkv = dkv.view(2, b, kv_heads, g, seq, d).sum(dim=3)
    torch.testing.assert_close(dkv[0], dk_ref, atol=5e-6, rtol=5e-5)
    torch.testing.assert_close(dkv[1], dv_ref, atol=5e-6, rtol=5e-5)


def test_pieces_cover_each_chunks_causal_keys_once() -> None:
    n = 8
    for chunk in range(6):
        covered = sorted((a, b) for a, b, _ in pieces(chunk, n))
        assert covered[0][0] == 0 and covered[-1][1] == (chunk + 1) * n
        assert all(covered[i][1] == covered[i + 1][0] for i in range(len(covered) - 1))
        assert [c for a, b, c in pieces(chunk, n) if a == chunk * n] == [True]  # the own chunk is causal


def test_kernel_choice_by_device_and_dtype() -> None:
    assert kernel_for(torch.zeros(1, 1, 2, 8)) is KERNELS["cpu-flash"]
    assert kernel_for(torch.zeros(1, 1, 2, 8, dtype=torch.bfloat16)) is KERNELS["cpu-flash"]
    assert kernel_for(torch.zeros(1, 1, 2, 8), "cuda-flash") is KERNELS["cuda-flash"]
