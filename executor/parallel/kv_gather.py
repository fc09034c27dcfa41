"""The K/V all-gather of context parallelism (:mod:`executor.parallel.context_parallel`) as an
autograd function: forward all-gathers every CP rank's two chunks and puts them in global token
order; backward sums every rank's gradient of the gathered tensor and gives each rank its own
chunks — a reduce-scatter (gloo has none: an all-reduce, then the rank's part, the same sum).

Apart from the attention math so that :func:`executor.model.fast_path.compile_blocks` can make it a
graph break (:func:`keep_kv_gather_eager`) without an import cycle.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist


class GatherKV(torch.autograd.Function):
    """``[..., s_local, d]`` on every CP rank -> ``[..., S, d]`` in global token order (forward:
    all-gather; backward: the summed gradient of each rank's chunks, module docstring)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, cp: int, group: Any) -> torch.Tensor:  # type: ignore[override]
        ctx.cp, ctx.group = cp, group
        return gather_global(x, cp, group)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[Any, ...]:  # type: ignore[override]
        return scatter_local(grad, ctx.cp, ctx.group), None, None


def gather_global(x: torch.Tensor, cp: int, group: Any) -> torch.Tensor:
    """Every CP rank's two chunks ``[..., s_local, d]`` -> ``[..., S, d]`` in global token order."""
    parts = [torch.empty_like(x) for _ in range(cp)]
    dist.all_gather(parts, x.contiguous(), group=group)
    n = x.shape[-2] // 2
    chunks = [parts[c][..., :n, :] if c < cp else parts[2 * cp - 1 - c][..., n:, :] for c in range(2 * cp)]
    return torch.cat(chunks, dim=-2)


def scatter_local(grad: torch.Tensor, cp: int, group: Any) -> torch.Tensor:
    """The gradient of :func:`gather_global`: every rank's ``[..., S, d]`` summed, this rank's two
    chunks returned (a reduce-scatter; gloo has none: an all-reduce, then the rank's part)."""
    n = grad.shape[-2] // (2 * cp)

    def chunks(r: int) -> torch.Tensor:
        return torch.cat([grad[..., r * n:(r + 1) * n, :], grad[..., (2 * cp - 1 - r) * n:(2 * cp - r) * n, :]], dim=-2)
    if dist.get_backend(group) == "gloo":
        full = torch.stack([chunks(r) for r in range(cp)])
        dist.all_reduce(full, group=group)
        return full[dist.get_rank(group)].clone()
    per_rank = [chunks(r).contiguous() for r in range(cp)]
    out = torch.empty_like(per_rank[0])
    dist.reduce_scatter(out, per_rank, group=group)
    return out


def _gather_kv(kv: torch.Tensor, cp: int, group: Any) -> torch.Tensor:
    return GatherKV.apply(kv, cp, group)


_gather = _gather_kv  # what gather_kv calls (see keep_kv_gather_eager)


def keep_kv_gather_eager() -> None:
    """Make the K/V all-gather (and its reduce-scatter backward) a graph break under
    ``torch.compile``, as :func:`executor.parallel.tp_layers.keep_collectives_eager` does for the
    TP all-reduces (a collective traced inside a compiled autograd.Function went wrong there);
    :func:`executor.model.fast_path.compile_blocks` calls both."""
    global _gather
    if _gather is _gather_kv:
        _gather = torch.compiler.disable(_gather_kv)


def gather_kv(kv: torch.Tensor, cp: int, group: Any) -> torch.Tensor:
    """``[..., s_local, d]`` on every CP rank of ``group`` -> ``[..., S, d]`` in global token order."""
    return _gather(kv, cp, group)
