"""Selective recompute of the attention core as one autograd node.

``selective`` recompute keeps the core's inputs (q, k, v) and runs the core again in the backward
instead of keeping what it saves for its own backward. ``torch.utils.checkpoint`` (non-reentrant)
does that through saved-tensor hooks and frame bookkeeping, a host cost of ~50 us a forward and
~240 us a forward + backward per call on a CPU host (against 8 / 75 us for the plain core; 13 /
160 us this way), paid per layer and micro-batch. On 4x H200 an eager 1F1B stage of llama-1.3b at
micro-batch 1 ran ~1.8 ms a layer slower with it than without recompute (benchmarks/NOTES.md,
"Cost-model fidelity"): at that size the layer is launch-bound, so host time is step time. On 1x H100
(``benchmarks/executor/recompute_cost.py``, 2026-11-26) the selective forward of this node costs
what the plain forward costs (1.38 / 1.42 ms a layer at micro-batch 1 / 2, against 1.64 / 2.21
through the checkpoint), with gradients bit-equal to the checkpoint's.

The recomputed core is the same function on the same inputs (flash / cuDNN / math SDPA forwards
are deterministic), so its gradients are those of the core kept whole. Autocast is restored for
the recompute as the forward had it. Under ``torch.compile`` the checkpoint stays: Dynamo handles
it natively, and it cannot trace ``autograd.grad`` inside a backward.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch.utils.checkpoint import checkpoint

Core = Callable[..., torch.Tensor]


class _Recomputed(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, core: Core, extra: Any, q: torch.Tensor, k: torch.Tensor,  # type: ignore[override]
                v: torch.Tensor) -> torch.Tensor:
        ctx.core, ctx.extra = core, extra
        dev = q.device.type
        ctx.autocast = (dev, torch.is_autocast_enabled(dev), torch.get_autocast_dtype(dev))
        ctx.save_for_backward(q, k, v)
        return core(q, k, v, extra)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[Any, ...]:  # type: ignore[override]
        dev, enabled, dtype = ctx.autocast
        inputs = [t.detach().requires_grad_(need) for t, need in zip(ctx.saved_tensors, ctx.needs_input_grad[2:])]
        with torch.enable_grad(), torch.autocast(dev, dtype=dtype, enabled=enabled):
            out = ctx.core(*inputs, ctx.extra)
        wanted = [t for t in inputs if t.requires_grad]
        got = iter(torch.autograd.grad(out, wanted, grad) if wanted else ())
        return (None, None, *(next(got) if t.requires_grad else None for t in inputs))


def recomputed_core(core: Core, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, extra: Any) -> torch.Tensor:
    """``core(q, k, v, extra)`` whose backward runs it again from q, k, v (module docstring)."""
    if torch.compiler.is_compiling():
        return checkpoint(core, q, k, v, extra, use_reentrant=False)
    return _Recomputed.apply(core, extra, q, k, v)
