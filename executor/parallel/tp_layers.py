"""Megatron-style tensor-parallel layers and the autograd functions of their collectives.

A stage's TP ranks all hold the same (replicated) activations between blocks. Inside a block:

* ``ColumnParallelLinear`` holds rows ``[r·out/t, (r+1)·out/t)`` of ``W [out, in]``; its input
  passes through :func:`copy_to_tp` (forward identity, backward all-reduce of the input gradient,
  because each rank's partial output only sees its rows of ``W``).
* ``RowParallelLinear`` holds columns ``[r·in/t, (r+1)·in/t)``; it multiplies the matching input
  shard and :func:`reduce_from_tp` sums the partial outputs (forward all-reduce, backward identity).
* ``VocabParallelEmbedding`` holds vocabulary rows ``[r·V/t, (r+1)·V/t)``: ids outside the range
  look up zeros and the partial embeddings are summed across the group.
* The LM head is a column-parallel linear over the vocabulary; :func:`vocab_parallel_cross_entropy`
  computes the exact softmax cross-entropy from vocabulary-sharded logits:
  ``loss = log Σ_v exp(z_v - m) - (z_y - m)`` with ``m`` the global max (all-reduce MAX), the
  exp-sum and the target logit all-reduced (SUM). Its gradient is ``softmax - onehot(y)``,
  restricted to the local vocabulary slice.

``group=None`` means TP degree 1: every collective is skipped.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from executor.model import cast_once
from executor.parallel.weight_grad_store import WeightGradStore, store_linear

# ------------------------------------------------------------------------------ collectives


def _all_reduce_sum(t: torch.Tensor, group: Any) -> torch.Tensor:
    dist.all_reduce(t, group=group)
    return t


_all_reduce = _all_reduce_sum  # in-place SUM all-reduce of the TP layers (see keep_collectives_eager)


def keep_collectives_eager() -> None:
    """Make the TP all-reduces graph breaks under ``torch.compile`` (``torch.compiler.disable``).
    Traced inside a compiled block's autograd.Function, the NCCL all-reduce of a TP-2 stage gave a
    first-step gradient norm 8 % off eager's on 4x H200 (same loss; single-GPU compiled blocks are
    exact). :func:`executor.model.fast_path.compile_blocks` calls this, so only a process that compiles
    imports the compiler stack: importing it in every process made a gloo rank abort at exit in a
    third of the CPU profiler's comm sweeps ("terminate called without an active exception")."""
    global _all_reduce
    if _all_reduce is _all_reduce_sum:
        _all_reduce = torch.compiler.disable(_all_reduce_sum)


class _CopyToTP(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, group: Any) -> torch.Tensor:  # type: ignore[override]
        ctx.group = group
        return x.view_as(x)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:  # type: ignore[override]
        return _all_reduce(grad.contiguous().clone(), ctx.group), None


class _ReduceFromTP(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, group: Any) -> torch.Tensor:  # type: ignore[override]
        return _all_reduce(x.contiguous().clone(), group)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:  # type: ignore[override]
        return grad, None


def copy_to_tp(x: torch.Tensor, group: Any) -> torch.Tensor:
    """Identity forward; all-reduce of the gradient in backward."""
    return x if group is None else _CopyToTP.apply(x, group)


def reduce_from_tp(x: torch.Tensor, group: Any) -> torch.Tensor:
    """All-reduce (SUM) forward; identity backward."""
    return x if group is None else _ReduceFromTP.apply(x, group)


# ------------------------------------------------------------------------------ layers


class _Projection(nn.Module):
    """A linear layer's weight and its cast-once copy (:mod:`executor.model.cast_once`): a buffer outside
    the state dict, None until the stage makes it (a buffer, so compiled blocks take it as input)."""

    weight: nn.Parameter
    weight_lp: torch.Tensor | None
    grad_acc: torch.Tensor | None  # the earlier micro-batches' weight gradient for this one's GEMM
    fp32_wgrad: bool

    def _lowp_slot(self) -> None:
        self.register_buffer("weight_lp", None, persistent=False)
        self.register_buffer("grad_acc", None, persistent=False)
        self.fp32_wgrad = False


def _project(x: torch.Tensor, layer: ColumnParallelLinear | RowParallelLinear) -> torch.Tensor:
    """A zero-bubble schedule's store defers the weight gradient (its own path, multiplying with the
    same cast-once copy: :mod:`executor.parallel.weight_grad_store`), except for a micro-batch whose ``W`` is inlined
    (``store.defers`` off); every other schedule goes through the cast-once copy."""
    if layer.wgrad_store is not None and layer.wgrad_store.defers:
        return store_linear(x, layer.weight, layer.wgrad_store, layer.weight_lp)
    return cast_once.linear(x, layer)


class ColumnParallelLinear(_Projection):
    """``y_local = x @ W_local^T`` with ``W_local`` = this rank's rows of ``W [out, in]`` (no bias)."""

    def __init__(self, in_features: int, out_features: int, *, tp: int, group: Any,
                 device: torch.device | None = None):
        super().__init__()
        if out_features % tp:
            raise ValueError(f"out_features={out_features} is not divisible by tp={tp}")
        self.group = group
        self.weight = nn.Parameter(torch.empty(out_features // tp, in_features, device=device))
        self.wgrad_store: WeightGradStore | None = None  # zero-bubble schedules: executor.parallel.weight_grad_store
        self._lowp_slot()

    def forward(self, x: torch.Tensor, *, input_is_copied: bool = False) -> torch.Tensor:
        if not input_is_copied:
            x = copy_to_tp(x, self.group)
        return _project(x, self)


class RowParallelLinear(_Projection):
    """``y = Σ_ranks x_local @ W_local^T`` with ``W_local`` = this rank's columns of ``W [out, in]``."""

    def __init__(self, in_features: int, out_features: int, *, tp: int, group: Any,
                 device: torch.device | None = None):
        super().__init__()
        if in_features % tp:
            raise ValueError(f"in_features={in_features} is not divisible by tp={tp}")
        self.group = group
        self.weight = nn.Parameter(torch.empty(out_features, in_features // tp, device=device))
        self.wgrad_store: WeightGradStore | None = None  # zero-bubble schedules: executor.parallel.weight_grad_store
        self._lowp_slot()

    def forward(self, x_local: torch.Tensor) -> torch.Tensor:
        return reduce_from_tp(_project(x_local, self), self.group)


class VocabParallelEmbedding(nn.Module):
    """Embedding whose vocabulary rows are split across the TP group."""

    def __init__(self, vocab_size: int, hidden: int, *, tp: int, tp_rank: int, group: Any,
                 device: torch.device | None = None):
        super().__init__()
        if vocab_size % tp:
            raise ValueError(f"vocab_size={vocab_size} is not divisible by tp={tp}")
        per = vocab_size // tp
        self.start, self.end = tp_rank * per, (tp_rank + 1) * per
        self.group = group
        self.weight = nn.Parameter(torch.empty(per, hidden, device=device))

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        if self.group is None:
            return F.embedding(ids, self.weight)
        outside = (ids < self.start) | (ids >= self.end)
        local = (ids - self.start).masked_fill(outside, 0)
        out = F.embedding(local, self.weight).masked_fill(outside.unsqueeze(-1), 0.0)
        return reduce_from_tp(out, self.group)


# ------------------------------------------------------------------------------ cross-entropy


class _VocabParallelCE(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, logits: torch.Tensor, labels: torch.Tensor, start: int,  # type: ignore[override]
                group: Any) -> torch.Tensor:
        ctx.in_dtype = logits.dtype
        logits = logits.float()
        vl = logits.shape[-1]
        m = logits.max(dim=-1).values
        if group is not None:
            dist.all_reduce(m, op=dist.ReduceOp.MAX, group=group)
        z = logits - m.unsqueeze(-1)
        ez = z.exp()
        sumexp = ez.sum(dim=-1)
        outside = (labels < start) | (labels >= start + vl)
        idx = (labels - start).masked_fill(outside, 0)
        target = z.gather(-1, idx.unsqueeze(-1)).squeeze(-1).masked_fill(outside, 0.0)
        if group is not None:
            both = torch.stack([sumexp, target])
            dist.all_reduce(both, group=group)
            sumexp, target = both[0], both[1]
        ez.div_(sumexp.unsqueeze(-1))  # softmax of the local slice
        ctx.save_for_backward(ez, idx, outside)
        return sumexp.log() - target

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None, None, None]:  # type: ignore[override]
        softmax, idx, outside = ctx.saved_tensors
        g = softmax.clone()
        flat = g.view(-1, g.shape[-1])
        rows = torch.arange(flat.shape[0], device=g.device)
        flat[rows, idx.reshape(-1)] -= (~outside).reshape(-1).to(g.dtype)
        g.mul_(grad.unsqueeze(-1))
        return g.to(ctx.in_dtype), None, None, None


def vocab_parallel_cross_entropy(logits_local: torch.Tensor, labels: torch.Tensor, *, vocab_start: int,
                                 group: Any) -> torch.Tensor:
    """Per-token cross-entropy (fp32, shape of ``labels``) from this rank's vocabulary slice of the
    logits, ``logits_local[..., v]`` being vocabulary id ``vocab_start + v``."""
    return _VocabParallelCE.apply(logits_local, labels, vocab_start, group)
