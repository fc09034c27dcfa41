"""The GPU varlen kernels of packed attention (flash-attn or PyTorch's ``varlen_attn``) against
causal SDPA run on each document alone, forward and backward, in bf16 (make test-gpu)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from executor.data.packed_docs import DocSpans, packed_attention, varlen_kernel_name

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]


@pytest.mark.parametrize(("hq", "hkv"), [(8, 8), (8, 2)])
def test_varlen_kernel_equals_attention_per_document(hq: int, hkv: int) -> None:
    lens = (700, 1, 129, 2048, 64)
    t, d = sum(lens), 128
    gen = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (torch.randn(1, h, t, d, device="cuda", dtype=torch.bfloat16, generator=gen).requires_grad_(True)
               for h in (hq, hkv, hkv))
    assert varlen_kernel_name(q) != "sdpa + document mask", "no varlen kernel on this GPU build"
    out = packed_attention(q, k, v, DocSpans(lens))
    dy = torch.randn_like(out)
    out.backward(dy)
    grads = [x.grad.clone() for x in (q, k, v)]
    start = 0
    for n in lens:
        sl = slice(start, start + n)
        qq, kk, vv = (x.detach()[:, :, sl].clone().requires_grad_(True) for x in (q, k, v))
        kr, vr = (x.repeat_interleave(hq // hkv, dim=1) for x in (kk, vv))
        ref = F.scaled_dot_product_attention(qq, kr, vr, is_causal=True)
        ref.backward(dy[:, :, sl])
        torch.testing.assert_close(out[:, :, sl].float(), ref.float(), rtol=2e-2, atol=2e-2)
        for g, x in zip(grads, (qq, kk, vv)):
            torch.testing.assert_close(g[:, :, sl].float(), x.grad.float(), rtol=5e-2, atol=5e-2)
        start += n


def test_doc_spans_reach_the_gpu_without_waiting_for_it() -> None:
    """A packed row's positions and document boundaries are copied to the GPU without a host sync:
    with ~0.5 s of kernels queued, both come back while the GPU is still busy (before the fix each
    copy waited for the queue: two host syncs per packed micro-batch)."""
    dev = torch.device("cuda", 0)
    torch.cuda.synchronize(dev)
    torch.cuda._sleep(int(1e9))  # ~0.5 s of GPU cycles queued on the current stream
    docs = DocSpans((700, 1, 129))
    pos, cu = docs.positions(dev), docs.cu_seqlens(dev)
    busy = not torch.cuda.current_stream(dev).query()
    torch.cuda.synchronize(dev)
    assert busy, "building a packed row's tables waited for the GPU's queued kernels"
    assert cu.tolist() == [0, 700, 701, 830]
    assert pos.tolist() == list(range(700)) + [0] + list(range(129))
