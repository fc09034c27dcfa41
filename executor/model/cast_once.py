"""Cast-once weights: one low-precision copy of every linear weight per optimizer step.

Under ``torch.autocast`` every micro-batch's forward casts each fp32 weight to bf16 again, and
the weight gradient comes out of its GEMM in bf16, is converted to fp32 and added into ``.grad``.
Here (``benchmarks/executor/weight_casts.py``'s *cast-once* variant, measured there and end to end
at +0.6 % (micro-batch 4) to +1.8 % (micro-batch 2) on 1x H100):

* every linear keeps a ``weight_lp`` buffer (the autocast dtype), refreshed by
  :class:`WeightCopies` just before the first forward that uses it after the weights changed, so
  micro-batches 2..n of a step reuse the copy; under ZeRO-1 that is after the layer's parameter
  gate (the copy reads the all-gathered weights);
* :class:`CastOnceLinear` multiplies with that copy and returns the weight gradient in fp32
  straight from the GEMM (``torch.mm(..., out_dtype=float32)`` where the device has it; else the
  bf16 product converted, as autocast does). Autograd still accumulates it into ``.grad``, so the
  gradient-sync and ZeRO-1 hooks see what they see under autocast.
* Accumulation in the GEMM (:func:`hand_over_grads`): where a micro-batch's backward is the next
  one to run and a weight's ``.grad`` holds the earlier micro-batches' sum (a plain tensor, not a
  view of a gradient bucket), the stage hands that sum to the layer's forward (``grad_acc``) and
  clears ``.grad``; the backward returns ``grad_acc + dyᵀ·x`` from one GEMM
  (:func:`executor.model.fp32_addmm.addmm_fp32`: ``torch.addmm(..., out_dtype=float32)``, beta 1,
  through a custom op inside compiled regions, which torch 2.11 cannot trace otherwise) and
  autograd takes that tensor as ``.grad`` (nothing to add to) — the same sums in the same order,
  without the separate ``add_`` over every weight per micro-batch. An input of the autograd
  function, not a side effect, so compiled blocks trace it (one more graph: with and without
  ``grad_acc``). Not under full recompute (the recomputed forward would not see the handed-over
  sum) or zero-bubble ``W`` ops (their own GEMM).

When is a copy stale? The stamp of a layer's copies is the stage's *epoch* and each weight's
``(_version, data_ptr)``. In-place writes through autograd-visible ops (``copy_`` of a checkpoint
load or a layout switch) bump ``_version``; replacing ``.data`` moves ``data_ptr``; but fused
AdamW and the collectives write without bumping it, so the engine bumps the epoch after every
optimizer step (:meth:`WeightCopies.invalidate`, an optimizer step hook).

Outside autocast (CPU training, fp32) nothing here is used: the oracle runs the plain ``F.linear``.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any, Protocol

import torch
import torch.nn.functional as F

from executor.model.fp32_addmm import addmm_fp32


@functools.cache
def fp32_wgrad_supported(device: torch.device) -> bool:
    """Whether ``torch.mm(a, b, out_dtype=torch.float32)`` runs on ``device`` for bf16 operands
    (CUDA builds of recent torch; not CPU)."""
    try:
        a = torch.ones(2, 2, dtype=torch.bfloat16, device=device)
        return torch.mm(a, a, out_dtype=torch.float32).dtype == torch.float32
    except (TypeError, RuntimeError, NotImplementedError):
        return False


class CastOnceLinear(torch.autograd.Function):
    """``x · w_lpᵀ`` in ``w_lp``'s dtype; the gradient of ``w`` (fp32) comes from the GEMM in fp32
    when ``fp32_wgrad``, plus ``acc`` (the earlier micro-batches' sum) when given.
    ``w`` is passed only so autograd routes that gradient to it."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, w: torch.Tensor, w_lp: torch.Tensor,  # type: ignore[override]
                fp32_wgrad: bool, acc: torch.Tensor | None = None) -> torch.Tensor:
        x_lp = x.to(w_lp.dtype)
        ctx.save_for_backward(x_lp, w_lp, acc)
        ctx.x_dtype, ctx.w_dtype, ctx.fp32_wgrad = x.dtype, w.dtype, fp32_wgrad
        return F.linear(x_lp, w_lp)

    @staticmethod
    def backward(ctx: Any, dy: torch.Tensor) -> tuple[Any, ...]:  # type: ignore[override]
        x_lp, w_lp, acc = ctx.saved_tensors
        dy = dy.to(w_lp.dtype)
        dx = (dy @ w_lp).to(ctx.x_dtype) if ctx.needs_input_grad[0] else None
        dw = None
        if ctx.needs_input_grad[1]:
            dy2, x2 = dy.reshape(-1, dy.shape[-1]), x_lp.reshape(-1, x_lp.shape[-1])
            if ctx.fp32_wgrad and acc is not None:
                dw = addmm_fp32(acc, dy2.t(), x2)
            elif ctx.fp32_wgrad:
                dw = torch.mm(dy2.t(), x2, out_dtype=torch.float32)
            elif acc is not None:
                dw = acc + torch.mm(dy2.t(), x2)  # the bf16 product promoted in the add
            else:
                dw = torch.mm(dy2.t(), x2).to(ctx.w_dtype)
        return dx, dw, None, None, None


class HasLowpWeight(Protocol):
    weight: torch.nn.Parameter
    weight_lp: torch.Tensor | None
    grad_acc: torch.Tensor | None
    fp32_wgrad: bool


def linear(x: torch.Tensor, layer: HasLowpWeight) -> torch.Tensor:
    """``layer``'s projection: through its cast-once copy while autocast runs and the copy is set
    (by :meth:`WeightCopies.refresh`), else plain ``F.linear`` (autocast casting as usual)."""
    lp = layer.weight_lp
    if lp is not None and torch.is_autocast_enabled(x.device.type):
        return CastOnceLinear.apply(x, layer.weight, lp, layer.fp32_wgrad, layer.grad_acc)
    return F.linear(x, layer.weight)


def hand_over_grads(layers: Sequence[HasLowpWeight]) -> None:
    """Move each weight's accumulated ``.grad`` into its layer's ``grad_acc`` for the next forward
    (module docstring), where it is a plain fp32 tensor of the weight's shape: a view (a slot of a
    gradient bucket, bound by :meth:`executor.parallel.grad_sync.GradSync.arm`) stays where it is.
    Call it only before a forward that goes through :func:`linear` with the copies set, whose
    backward is the next to run; :func:`drop_grad_acc` after that forward."""
    for m in layers:
        g = m.weight.grad
        if (m.weight_lp is not None and g is not None and g._base is None and g.dtype == torch.float32
                and g.shape == m.weight.shape and g.is_contiguous()):
            m.grad_acc, m.weight.grad = g, None


def drop_grad_acc(layers: Sequence[HasLowpWeight]) -> None:
    """Forget the handed-over sums (the forward's autograd graph holds them until its backward)."""
    for m in layers:
        m.grad_acc = None


class WeightCopies:
    """The stage's cast-once copies: per key (a layer, or the head), the stamp they were made at."""

    def __init__(self) -> None:
        self.epoch = 0
        self.copies_made = 0  # refreshes that copied (one per key and step when all is well)
        self._stamps: dict[str, tuple[Any, ...]] = {}

    def invalidate(self, *_: Any) -> None:
        """The weights changed where ``_version`` does not show it (an optimizer step)."""
        self.epoch += 1

    def refresh(self, key: str, layers: Sequence[HasLowpWeight], dtype: torch.dtype) -> None:
        """Make ``layers``' copies current in ``dtype`` (a no-op when nothing changed since)."""
        ws: list[torch.Tensor] = [m.weight for m in layers]
        stamp = (self.epoch, dtype, tuple((w._version, w.data_ptr()) for w in ws))
        if self._stamps.get(key) == stamp:
            return
        lps: list[torch.Tensor] = []
        with torch.no_grad():
            for m, w in zip(layers, ws):
                lp = m.weight_lp
                if lp is None or lp.dtype != dtype or lp.shape != w.shape:
                    lp = m.weight_lp = torch.empty_like(w, dtype=dtype)
                    m.fp32_wgrad = w.dtype == torch.float32 and fp32_wgrad_supported(w.device)
                lps.append(lp)
            torch._foreach_copy_(lps, ws)
        self._stamps[key] = stamp
        self.copies_made += 1

    def drop(self, layers: Sequence[HasLowpWeight]) -> None:
        """Forget the copies (the layers go back to autocast's casts)."""
        self._stamps.clear()
        for m in layers:
            m.weight_lp = None
