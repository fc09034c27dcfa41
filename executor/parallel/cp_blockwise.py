"""Context-parallel causal attention block by block, merged by log-sum-exp (one autograd node).

Local query chunk ``c`` (of ``2·cp`` chunks of ``n`` tokens, :mod:`planner.cp_layout`) attends to
the gathered keys ``[0, (c+1)·n)``. That is two pieces with plain kernels: the keys before the
chunk, all visible (``[0, c·n)``, no mask), and the chunk's own keys under the ordinary square
causal mask. Each piece runs a flash kernel that returns its log-sum-exp
(:mod:`executor.parallel.attention_pieces`); the outputs merge exactly as
``o = sum_i o_i · exp(lse_i - lse)`` with ``lse = logsumexp_i(lse_i)``.

Why not one masked call: SDPA takes a lower-right causal mask over ``c·n + n`` keys only on torch's
flash or memory-efficient kernels, never cuDNN; on H100 at 64K over 4 ranks one rank's attention
took 53 ms that way against 31 ms block by block on cuDNN (0.86 of the dense kernel's share;
``benchmarks/executor/cp_attention.py``, benchmarks/results/cp_attention_20261127T062806Z.json),
and it kept the whole gathered K/V for the backward.

What the node keeps: q, the **local** k and v, the output and its log-sum-exp. The backward
all-gathers K/V again (one more all-gather a layer, instead of keeping ``cp`` times the local K/V
per layer), runs each piece's flash backward against the merged output and log-sum-exp, sums the
K/V gradients in fp32 and reduce-scatters them to their owners
(:func:`executor.parallel.kv_gather.scatter_local`).
"""

from __future__ import annotations

from typing import Any

import torch

from executor.parallel.attention_pieces import PieceKernel
from executor.parallel.kv_gather import gather_global, scatter_local

Piece = tuple[int, int, bool]  # keys [start, stop), causal


def pieces(chunk: int, n: int) -> list[Piece]:
    """The key pieces of local chunk ``chunk`` (``n`` tokens a chunk): its own keys under the square
    causal mask, then the earlier keys, unmasked (none for chunk 0)."""
    own = [(chunk * n, (chunk + 1) * n, True)]
    return own + ([(0, chunk * n, False)] if chunk else [])


def expand_kv(kv: torch.Tensor, heads: int) -> torch.Tensor:
    """Stacked ``[2, b, Hkv, S, d]`` K/V repeated to ``heads`` query heads (GQA)."""
    two, b, g, s, d = kv.shape
    if heads == g:
        return kv
    return kv[:, :, :, None].expand(two, b, g, heads // g, s, d).reshape(two, b, heads, s, d)


def _merge(outs: list[torch.Tensor], lses: list[torch.Tensor], dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    if len(outs) == 1:
        return outs[0], lses[0]
    lse = torch.logsumexp(torch.stack(lses), dim=0)
    out = sum(o.float() * torch.exp(lp - lse).unsqueeze(-1) for o, lp in zip(outs, lses))
    assert isinstance(out, torch.Tensor)
    return out.to(dtype), lse


def local_forward(q: torch.Tensor, kv: torch.Tensor, cp: int, cp_rank: int,
                  kernel: PieceKernel) -> tuple[torch.Tensor, torch.Tensor, list[Any]]:
    """The rank's attention from the gathered, expanded ``kv [2, b, Hq, S, d]``: (output, its
    log-sum-exp ``[b, Hq, 2n]``, the pieces' kernel state for :func:`local_backward`)."""
    b, heads, s2, d = q.shape
    n = s2 // 2
    # [b, 2n, H, d] memory seen as [b, H, 2n, d]: ``wo``'s input (``out.transpose(1, 2)``) is then a
    # view, as it is of SDPA's output without CP, not a copy
    out = torch.empty(b, s2, heads, d, device=q.device, dtype=q.dtype).transpose(1, 2)
    lse = torch.empty(b, heads, s2, device=q.device, dtype=torch.float32)
    auxes = []
    for half, chunk in enumerate((cp_rank, 2 * cp - 1 - cp_rank)):
        rows = slice(half * n, (half + 1) * n)
        got = [kernel.forward(q[..., rows, :], kv[0, ..., a:b, :], kv[1, ..., a:b, :], causal)
               for a, b, causal in pieces(chunk, n)]
        out[..., rows, :], lse[..., rows] = _merge([g.out for g in got], [g.lse for g in got], q.dtype)
        auxes.append([g.aux for g in got])
        del got
    return out, lse, auxes


def local_backward(dout: torch.Tensor, q: torch.Tensor, kv: torch.Tensor, out: torch.Tensor, lse: torch.Tensor,
                   auxes: list[Any], cp: int, cp_rank: int, kernel: PieceKernel) -> tuple[torch.Tensor, torch.Tensor]:
    """(dq, the fp32 gradient of the whole gathered ``kv``) from this rank's queries."""
    dkv = torch.zeros(kv.shape, dtype=torch.float32, device=kv.device)
    dq = torch.empty_like(q)
    n = q.shape[-2] // 2
    dout = dout.contiguous()
    for half, chunk in enumerate((cp_rank, 2 * cp - 1 - cp_rank)):
        rows = slice(half * n, (half + 1) * n)
        qh, oh, lh, dh = q[..., rows, :], out[..., rows, :], lse[..., rows], dout[..., rows, :]
        acc: torch.Tensor | None = None
        for (a, b, causal), aux in zip(pieces(chunk, n), auxes[half]):
            gq, gk, gv = kernel.backward(dh, qh, kv[0, ..., a:b, :], kv[1, ..., a:b, :], oh, lh, aux, causal)
            acc = gq.float() if acc is None else acc.add_(gq)
            dkv[0, ..., a:b, :] += gk
            dkv[1, ..., a:b, :] += gv
        assert acc is not None
        dq[..., rows, :] = acc
        del gq, gk, gv, acc
    return dq, dkv


class BlockwiseCPAttention(torch.autograd.Function):
    """``q [b, Hq, 2n, d]``, local ``k, v [b, Hkv, 2n, d]`` -> the local rows of dense causal
    attention over the whole sequence (module docstring)."""

    @staticmethod
    def forward(ctx: Any, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cp: int, cp_rank: int,  # type: ignore[override]
                group: Any, kernel: PieceKernel) -> torch.Tensor:
        kv = expand_kv(gather_global(torch.stack([k, v]), cp, group), q.shape[1])
        out, lse, auxes = local_forward(q, kv, cp, cp_rank, kernel)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.meta = (cp, cp_rank, group, kernel, auxes)
        return out

    @staticmethod
    def backward(ctx: Any, dout: torch.Tensor) -> tuple[Any, ...]:  # type: ignore[override]
        q, k, v, out, lse = ctx.saved_tensors
        cp, cp_rank, group, kernel, auxes = ctx.meta
        kv = expand_kv(gather_global(torch.stack([k, v]), cp, group), q.shape[1])
        dq, dkv = local_backward(dout, q, kv, out, lse, auxes, cp, cp_rank, kernel)
        del kv, q, out, lse
        two, b, heads, s, d = dkv.shape
        g = k.shape[1]
        if g != heads:
            dkv = dkv.view(two, b, g, heads // g, s, d).sum(dim=3)
        dkv = dkv.to(k.dtype)  # frees the fp32 sum (when the dtype differs) before the reduce-scatter's copies
        local = scatter_local(dkv, cp, group)
        return dq, local[0], local[1], None, None, None, None


def blockwise_cp_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cp: int, cp_rank: int, group: Any,
                           kernel: PieceKernel) -> torch.Tensor:
    """:class:`BlockwiseCPAttention` (module docstring)."""
    out = BlockwiseCPAttention.apply(q, k, v, cp, cp_rank, group, kernel)
    assert isinstance(out, torch.Tensor)
    return out
