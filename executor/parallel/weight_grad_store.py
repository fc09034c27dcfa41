"""Split backward for zero-bubble schedules: input gradients now, weight-gradient GEMMs later.

A ``B`` op of ZB-H1 (:mod:`planner.schedules.zb_h1`) must produce only what the previous stage
waits for — the input gradient — and a later ``W`` op the weight gradients. As Megatron's and
ZB's ``WeightGradStore`` do, the linear layers (:mod:`executor.parallel.tp_layers`: every TP linear and the
LM head, which hold nearly all the weight FLOPs) run :func:`store_linear`, whose backward computes
``dx = dy · W`` and queues ``(W, x, dy)`` under the micro-batch of the active
:meth:`WeightGradStore.deferring` instead of the GEMM ``dW = dyᵀ · x`` (only schedules with ``W``
ops install a store; the others run plain ``F.linear``). :meth:`WeightGradStore.run` (the ``W``
op) does the queued GEMMs of one micro-batch and hands each sum to autograd as a leaf gradient
(``torch.autograd.backward`` on the weight): it accumulates into ``.grad`` exactly as the
normal path does (in place into a bound gradient bucket) and fires the same post-accumulate-grad
hook once per micro-batch, so the cross-pipeline reduction and ZeRO-1 (:mod:`executor.parallel.grad_sync`)
see what they see without a split. Those hooks may now launch a bucket's reduction from a ``W``
op; the ``W`` runs inside ``torch.autograd.backward`` like a ``B``, so the launches still come from
one thread at a time and in the one global issue order that module's docstring argues with.

Norm scales and the embedding keep their (small) weight gradients in ``B``. The queued ``x`` and
``dy`` are what the linear saved anyway; a micro-batch holds them until its ``W`` (the registry's
memory rule charges activations until ``W``).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn


@dataclass
class _Deferred:
    weight: nn.Parameter
    x: torch.Tensor  # [..., in] the forward's input in the compute dtype
    dy: torch.Tensor  # [..., out] the output gradient in the compute dtype


class WeightGradStore:
    """Weight-gradient GEMMs queued per micro-batch by the ``B`` ops, run by the ``W`` ops."""

    def __init__(self) -> None:
        self._queues: dict[int, list[_Deferred]] = {}
        self._key: int | None = None
        self._inline = False

    @contextlib.contextmanager
    def inline(self) -> Iterator[None]:
        """While active, the linears take their plain path (:attr:`defers` is False): the forward and
        backward of a micro-batch whose ``W`` the schedule fuses into its ``B``
        (:func:`planner.schedules.inline_w.inline_w`) compute the weight gradients inline."""
        self._inline = True
        try:
            yield
        finally:
            self._inline = False

    @property
    def defers(self) -> bool:
        """Whether the linears go through :func:`store_linear` now (outside :meth:`inline`)."""
        return not self._inline

    @contextlib.contextmanager
    def deferring(self, key: int) -> Iterator[None]:
        """While active, :func:`store_linear`'s backward queues its weight gradient under ``key``."""
        if self._key is not None:
            raise RuntimeError(f"weight gradients of micro-batch {self._key} are already being deferred")
        self._key = key
        self._queues.setdefault(key, [])
        try:
            yield
        finally:
            self._key = None

    @property
    def active(self) -> bool:
        return self._key is not None

    def put(self, weight: nn.Parameter, x: torch.Tensor, dy: torch.Tensor) -> None:
        assert self._key is not None
        self._queues[self._key].append(_Deferred(weight, x, dy))

    def pending(self) -> list[int]:
        """Keys whose weight gradients are queued and not run yet."""
        return list(self._queues)

    def run(self, key: int) -> None:
        """The ``W`` op of micro-batch ``key``: per weight, in the order the ``B`` queued them (the
        backward's: latest layers first), the sum of its queued GEMMs (as autograd sums a weight's
        uses) handed to autograd, which accumulates it into ``.grad`` and fires the post-accumulate
        hook. One weight at a time, so the gradient-sync hooks see the weights become final in
        their issue order (:func:`planner.flat_buckets.reduce_order`) and launch each bucket while the rest
        of the ``W`` runs; one backward over every weight let autograd accumulate them in an order
        of its own (earliest layers first), which held every bucket until the whole ``W`` was done
        (tests/executor/test_grad_overlap_order.py)."""
        by_weight: dict[int, list[_Deferred]] = {}
        for d in self._queues.pop(key):
            by_weight.setdefault(id(d.weight), []).append(d)
        for ds in by_weight.values():
            with torch.no_grad():
                g = weight_grad(ds[0].x, ds[0].dy).to(ds[0].weight.dtype)
                for d in ds[1:]:
                    g = g + weight_grad(d.x, d.dy).to(d.weight.dtype)
            torch.autograd.backward([ds[0].weight], [g])


def weight_grad(x: torch.Tensor, dy: torch.Tensor) -> torch.Tensor:
    """``dW = dyᵀ · x`` over all leading dimensions (the GEMM of ``F.linear``'s weight gradient)."""
    return dy.reshape(-1, dy.shape[-1]).t().mm(x.reshape(-1, x.shape[-1]))


class _StoreLinear(torch.autograd.Function):
    """``F.linear(x, weight)`` (no bias) whose weight gradient goes to a :class:`WeightGradStore`.
    Under autocast both operands are cast to the autocast dtype, as ``F.linear`` is (the weight: its
    cast-once copy where the stage keeps one, bit-equal to the cast).

    The weight reaches the function detached (in a tuple autograd does not look into): with an
    autograd edge to it, its ``AccumulateGrad`` would run in ``B`` with no gradient and still fire
    the post-accumulate hook, counting the micro-batch twice (checked, torch 2.13)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, holder: tuple[nn.Parameter, torch.Tensor | None],  # type: ignore[override]
                store: WeightGradStore) -> torch.Tensor:
        weight, lowp = holder
        dev = x.device.type
        dt = torch.get_autocast_dtype(dev) if torch.is_autocast_enabled(dev) else None
        xc = x if dt is None else x.to(dt)
        if dt is None:
            wc = weight.detach()
        elif lowp is not None and lowp.dtype == dt:
            wc = lowp  # the stage's cast-once copy: saved by reference, not one copy per micro-batch
        else:
            wc = weight.detach().to(dt)
        with torch.autocast(dev, enabled=False):
            y = F.linear(xc, wc)
        ctx.save_for_backward(xc, wc)
        ctx.weight, ctx.store, ctx.x_dtype = weight, store, x.dtype
        return y

    @staticmethod
    def backward(ctx: Any, dy: torch.Tensor) -> tuple[torch.Tensor | None, None, None]:  # type: ignore[override]
        xc, wc = ctx.saved_tensors
        dy = dy.to(wc.dtype)
        dx = dy.matmul(wc).to(ctx.x_dtype) if ctx.needs_input_grad[0] else None
        if ctx.weight.requires_grad:
            if not ctx.store.active:
                raise RuntimeError("a backward through linears with a WeightGradStore must run inside "
                                   "store.deferring(micro_batch)")
            ctx.store.put(ctx.weight, xc, dy)
        return dx, None, None


def store_linear(x: torch.Tensor, weight: nn.Parameter, store: WeightGradStore | None,
                 lowp: torch.Tensor | None = None) -> torch.Tensor:
    """``F.linear(x, weight)``; with a ``store``, through :class:`_StoreLinear`, whose backward (to run
    inside :meth:`WeightGradStore.deferring`) leaves ``dW`` to :meth:`WeightGradStore.run`. ``lowp``:
    the layer's cast-once copy of ``weight`` (:mod:`executor.model.cast_once`), used under autocast
    instead of a cast per call, so that every micro-batch in flight saves that one copy as 1F1B's do."""
    if store is None:
        return F.linear(x, weight)
    if torch.is_grad_enabled() and weight.requires_grad and not x.requires_grad:
        x = x.detach().requires_grad_()  # so that backward reaches the function (its only edge is x)
    return _StoreLinear.apply(x, (weight, lowp), store)


def install(module: nn.Module, store: WeightGradStore | None) -> int:
    """Give every linear of ``module`` that has a ``wgrad_store`` slot this ``store`` (None: plain
    ``F.linear`` again); returns how many."""
    n = 0
    for sub in module.modules():
        if hasattr(sub, "wgrad_store"):
            sub.wgrad_store = store  # type: ignore[assignment]
            n += 1
    return n
