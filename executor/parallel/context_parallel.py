"""Context parallelism inside a stage: the causal load-balanced sequence split and attention over
the CP group by an all-gather of K and V (GQA keeps them small).

Layout (:mod:`planner.cp_layout`): the sequence of ``S`` tokens is cut into ``2·cp`` chunks of
``L``; CP rank ``r`` holds chunks ``r`` and ``2·cp-1-r`` of the activations, labels and RoPE
positions. Attention of local chunk ``c`` needs the keys ``[0, (c+1)·L)``:

1. K and V (after RoPE, at global positions) are all-gathered over the stage's CP group and put in
   global order (:class:`GatherKV`); its backward sums every rank's gradient of the gathered K/V and
   gives each rank its own chunks: a reduce-scatter (gloo has none: an all-reduce, then the rank's
   part — the same sum);
2. each local query chunk attends to that prefix with the causal mask aligned lower-right (query
   ``i`` of chunk ``c`` sees keys ``<= c·L + i``): exactly the rows of dense causal attention.

The loss of a CP rank is the sum over its tokens scaled by ``1 / global_tokens``; CP ranks of a
stage hold the same weight shards and their gradients are SUM-reduced with the pipelines'
(:func:`planner.layout.build_topology` adds them as owners), so the step equals the dense one.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F

from executor.model import fast_path
from planner.cp_layout import cp_intervals, cp_positions


@dataclass(frozen=True)
class CPContext:
    """This rank's place in its stage's CP group."""

    cp: int
    cp_rank: int
    group: Any  # the stage's CP group of this TP rank (executor.parallel.groups.ProcessGroups.cp_group)


@functools.lru_cache(maxsize=64)
def local_positions(seq: int, cp: int, cp_rank: int, device: torch.device) -> torch.Tensor:
    """Global positions of ``cp_rank``'s tokens of an ``seq``-token sequence (local order), made
    on ``device`` once: a copy from host memory per forward would block the host on a GPU."""
    return torch.tensor(cp_positions(seq, cp, cp_rank), dtype=torch.long, device=device)


def split_sequence(x: torch.Tensor, cp: int, cp_rank: int, dim: int = 1) -> torch.Tensor:
    """``cp_rank``'s two chunks of ``x`` along ``dim`` (its full sequence), in local order."""
    if cp == 1:
        return x
    seq = x.shape[dim]
    parts = [x.narrow(dim, a, b - a) for a, b in cp_intervals(seq, cp, cp_rank)]
    return torch.cat(parts, dim=dim)


class GatherKV(torch.autograd.Function):
    """``[..., s_local, d]`` on every CP rank -> ``[..., S, d]`` in global token order (forward:
    all-gather; backward: the summed gradient of each rank's chunks, module docstring)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, cp: int, group: Any) -> torch.Tensor:  # type: ignore[override]
        ctx.cp, ctx.group = cp, group
        parts = [torch.empty_like(x) for _ in range(cp)]
        dist.all_gather(parts, x.contiguous(), group=group)
        n = x.shape[-2] // 2
        chunks = [parts[c][..., :n, :] if c < cp else parts[2 * cp - 1 - c][..., n:, :] for c in range(2 * cp)]
        return torch.cat(chunks, dim=-2)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[Any, ...]:  # type: ignore[override]
        cp, group = ctx.cp, ctx.group
        n = grad.shape[-2] // (2 * cp)
        per_rank = [torch.cat([grad[..., r * n:(r + 1) * n, :], grad[..., (2 * cp - 1 - r) * n:(2 * cp - r) * n, :]],
                              dim=-2).contiguous() for r in range(cp)]
        if dist.get_backend(group) == "gloo":  # no reduce-scatter on gloo: the same sum, all of it
            full = torch.stack(per_rank)
            dist.all_reduce(full, group=group)
            return full[dist.get_rank(group)], None, None
        out = torch.empty_like(per_rank[0])
        dist.reduce_scatter(out, per_rank, group=group)
        return out, None, None


def _gather_kv(kv: torch.Tensor, cp: int, group: Any) -> torch.Tensor:
    return GatherKV.apply(kv, cp, group)


_gather = _gather_kv  # the K/V all-gather attention calls (see keep_kv_gather_eager)


def keep_kv_gather_eager() -> None:
    """Make the K/V all-gather (and its reduce-scatter backward) a graph break under
    ``torch.compile``, as :func:`executor.parallel.tp_layers.keep_collectives_eager` does for the
    TP all-reduces (a collective traced inside a compiled autograd.Function went wrong there);
    :func:`executor.model.fast_path.compile_blocks` calls both."""
    global _gather
    if _gather is _gather_kv:
        _gather = torch.compiler.disable(_gather_kv)


def _lower_right(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, backends: fast_path.Backends) -> torch.Tensor:
    from torch.nn.attention.bias import causal_lower_right

    mask = causal_lower_right(q.shape[-2], k.shape[-2])
    if not backends or fast_path.sdpa_kernel is None:
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    with fast_path.sdpa_kernel(list(backends)):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)


def cp_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cp: CPContext,
                 backends: fast_path.Backends = ()) -> torch.Tensor:
    """Causal GQA attention of the local queries ``q [b, Hq, 2L, d]`` over the whole sequence, from
    the local ``k, v [b, Hkv, 2L, d]`` (module docstring)."""
    hq, hkv = q.shape[1], k.shape[1]
    kv = _gather(torch.stack([k, v]), cp.cp, cp.group)
    rep = hq // hkv
    if rep > 1:
        two, b, g, s, d = kv.shape
        kv = kv[:, :, :, None].expand(two, b, g, rep, s, d).reshape(two, b, hq, s, d)
    n = q.shape[-2] // 2
    outs = []
    for half, c in enumerate((cp.cp_rank, 2 * cp.cp - 1 - cp.cp_rank)):
        end = (c + 1) * n
        outs.append(_lower_right(q[..., half * n:(half + 1) * n, :], kv[0, ..., :end, :], kv[1, ..., :end, :],
                                 backends))
    return torch.cat(outs, dim=-2)
