"""Vocabulary-parallel cross-entropy in row chunks: no fp32 copy of the whole micro-batch's logits.

The same function as :func:`executor.parallel.tp_layers.vocab_parallel_cross_entropy` (per-token fp32 loss
from this rank's vocabulary slice of the logits, ``logits_local[..., v]`` = id ``start + v``)::

    loss_t = lse_t - z_{t, y_t}        lse_t = log Σ_v exp(z_{t, v})   (over every rank's slice)
    ∂loss_t / ∂z_{t, v} = exp(z_{t, v} - lse_t) - [v == y_t]

computed differently: the unchunked function converts the whole ``[tokens, V/t]`` logits to fp32
and keeps their fp32 softmax for backward (8 B a logit for micro-batch 2 of llama-1.3b at seq 4096:
2 GiB, written and read again). Here rows are taken ``chunk_rows`` at a time: each chunk is
converted to fp32, reduced to this rank's log-sum-exp and target logit per row, and dropped. Saved
for backward are the logits as they came (bf16 under autocast) and one fp32 ``lse`` per row;
backward recomputes each chunk's softmax from them and writes its gradient, in the logits' dtype,
into its rows of the result.

Tensor parallelism: the per-row statistics are combined once over all chunks, two all-reduces of
``[tokens]`` vectors (MAX of the local lse, then SUM of ``exp(lse_r - max)`` stacked with the target
logit, which only its owner's slice holds): ``lse = max + log Σ_r exp(lse_r - max)``.

Results equal the unchunked function's up to fp32 rounding (the sums run in another order).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

CHUNK_ELEMENTS = 1 << 25  # fp32 elements of one chunk's temporaries (128 MiB)


def chunk_rows(vocab_local: int, elements: int = CHUNK_ELEMENTS) -> int:
    """Rows per chunk so that one chunk holds about ``elements`` logits."""
    return max(1, elements // max(1, vocab_local))


class _ChunkedVocabCE(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, logits: torch.Tensor, labels: torch.Tensor, start: int,  # type: ignore[override]
                group: Any, rows: int) -> torch.Tensor:
        vl = logits.shape[-1]
        z = logits.reshape(-1, vl)
        y = labels.reshape(-1)
        n = z.shape[0]
        outside = (y < start) | (y >= start + vl)
        idx = (y - start).masked_fill(outside, 0)
        lse = torch.empty(n, dtype=torch.float32, device=z.device)
        target = torch.empty(n, dtype=torch.float32, device=z.device)
        for r0 in range(0, n, rows):
            zc = z[r0:r0 + rows].float()
            lse[r0:r0 + rows] = torch.logsumexp(zc, dim=-1)
            target[r0:r0 + rows] = zc.gather(-1, idx[r0:r0 + rows, None]).squeeze(-1)
        target = target.masked_fill(outside, 0.0)
        if group is not None:
            top = lse.clone()
            dist.all_reduce(top, op=dist.ReduceOp.MAX, group=group)
            both = torch.stack([(lse - top).exp(), target])
            dist.all_reduce(both, group=group)
            lse, target = top + both[0].log(), both[1]
        ctx.rows = rows
        ctx.save_for_backward(logits, idx, outside, lse)
        return (lse - target).view(labels.shape)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[Any, ...]:  # type: ignore[override]
        logits, idx, outside, lse = ctx.saved_tensors
        rows = ctx.rows
        vl = logits.shape[-1]
        z = logits.reshape(-1, vl)
        g = grad.reshape(-1).float()
        inside = (~outside).float()
        out = torch.empty_like(z)
        for r0 in range(0, z.shape[0], rows):
            p = (z[r0:r0 + rows].float() - lse[r0:r0 + rows, None]).exp()
            hit = torch.arange(p.shape[0], device=p.device)
            p[hit, idx[r0:r0 + rows]] -= inside[r0:r0 + rows]
            out[r0:r0 + rows] = p * g[r0:r0 + rows, None]
        return out.view(logits.shape), None, None, None, None


def chunked_vocab_cross_entropy(logits_local: torch.Tensor, labels: torch.Tensor, *, vocab_start: int,
                                group: Any, rows: int = 0) -> torch.Tensor:
    """Per-token cross-entropy (fp32, shape of ``labels``) from this rank's vocabulary slice of the
    logits, computed ``rows`` rows at a time (0: :func:`chunk_rows` of the local vocabulary)."""
    return _ChunkedVocabCE.apply(logits_local, labels, vocab_start, group,
                                 rows or chunk_rows(logits_local.shape[-1]))
