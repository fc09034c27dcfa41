""":func:`executor.data.packed_docs.torch_varlen` adapts both signatures PyTorch's ``varlen_attn`` has had
(``is_causal`` without grouped-query heads; ``window_size`` + ``enable_gqa``): checked on CPU with
stand-ins of each that compute causal attention per document with SDPA."""

from __future__ import annotations

import sys
import types

import pytest
import torch
import torch.nn.functional as F

from executor.data.packed_docs import torch_varlen


def _per_doc(q, k, v, cu, causal):  # type: ignore[no-untyped-def]
    assert causal and q.shape[1] == k.shape[1]
    out = []
    for a, b in zip(cu[:-1].tolist(), cu[1:].tolist()):
        qq, kk, vv = (t[a:b].transpose(0, 1)[None] for t in (q, k, v))
        out.append(F.scaled_dot_product_attention(qq, kk, vv, is_causal=True)[0].transpose(0, 1))
    return torch.cat(out)


def first(query, key, value, cu_seq_q, cu_seq_k, max_q, max_k, is_causal=False, return_aux=None):  # type: ignore[no-untyped-def]
    return _per_doc(query, key, value, cu_seq_q, is_causal)


def newer(query, key, value, cu_seq_q, cu_seq_k, max_q, max_k, *, return_aux=None, scale=None,  # type: ignore[no-untyped-def]
          window_size=(-1, -1), enable_gqa=False):
    assert enable_gqa == (key.shape[1] != query.shape[1])
    rep = query.shape[1] // key.shape[1]
    key, value = key.repeat_interleave(rep, dim=1), value.repeat_interleave(rep, dim=1)
    return _per_doc(query, key, value, cu_seq_q, window_size == (-1, 0))


@pytest.mark.parametrize("impl", [first, newer])
def test_both_varlen_signatures_give_causal_gqa_attention(monkeypatch, impl) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setitem(sys.modules, "torch.nn.attention.varlen", types.SimpleNamespace(varlen_attn=impl))
    torch_varlen.cache_clear()
    try:
        fn = torch_varlen()
        assert fn is not None
        gen = torch.Generator().manual_seed(0)
        lens = (5, 1, 9)
        q = torch.randn(sum(lens), 4, 8, generator=gen)
        k, v = (torch.randn(sum(lens), 2, 8, generator=gen) for _ in range(2))
        cu = torch.tensor([0, 5, 6, 15], dtype=torch.int32)
        want = _per_doc(q, k.repeat_interleave(2, dim=1), v.repeat_interleave(2, dim=1), cu, True)
        torch.testing.assert_close(fn(q, k, v, cu, 9), want)
    finally:
        torch_varlen.cache_clear()
