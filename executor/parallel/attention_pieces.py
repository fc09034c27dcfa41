"""Attention kernels that return the log-sum-exp, so that a query block's attention over several
key blocks can be computed block by block and merged exactly (:mod:`executor.parallel.cp_blockwise`).

A piece is ``(q, k, v, causal)`` with ``q [b, H, Lq, d]`` and ``k, v [b, H, Lk, d]`` (equal heads:
GQA is expanded by the caller). :meth:`PieceKernel.forward` gives the piece's output and its
log-sum-exp ``[b, H, Lq]`` (fp32); :meth:`PieceKernel.backward` takes the **merged** output and
log-sum-exp of the query block: the flash backward recomputes the probabilities as
``exp(s - lse)`` and the row term ``D = rowsum(dO * O)`` from what it is given, so with the merged
pair each piece yields its exact share of ``dq`` and the exact ``dk, dv`` of its keys (the ring
attention identity).

Kernels: cuDNN's and torch's flash attention on CUDA (bf16/fp16; cuDNN where a probe shows it
agrees with flash, :func:`cuda_kernel`) and the CPU flash kernel (any float dtype), all as aten ops
(the public SDPA call hides the log-sum-exp). CUDA in fp32 has no such kernel
here: :func:`kernel_for` returns ``None`` and the caller keeps its masked-SDPA path.
"""

from __future__ import annotations

import functools
import logging
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any

import torch

aten = torch.ops.aten
log = logging.getLogger("hexiscale.executor")


@dataclass(frozen=True)
class PieceOut:
    out: torch.Tensor  # [b, H, Lq, d] in the input dtype
    lse: torch.Tensor  # [b, H, Lq] fp32
    aux: tuple[Any, ...]  # what the kernel's backward needs besides the tensors (flash's rng state)


class PieceKernel(ABC):
    """One attention kernel's forward (with the log-sum-exp) and backward (module docstring)."""

    name: str

    @abstractmethod
    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool) -> PieceOut:
        """The piece's output and log-sum-exp."""

    @abstractmethod
    def backward(self, dout: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor,
                 lse: torch.Tensor, aux: tuple[Any, ...], causal: bool) -> tuple[torch.Tensor, ...]:
        """(dq, dk, dv) of the piece against the merged ``out`` and ``lse``."""


class CpuFlash(PieceKernel):
    name = "cpu-flash"

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool) -> PieceOut:
        out, lse = aten._scaled_dot_product_flash_attention_for_cpu(q, k, v, 0.0, causal)
        return PieceOut(out, lse.float(), ())

    def backward(self, dout: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor,
                 lse: torch.Tensor, aux: tuple[Any, ...], causal: bool) -> tuple[torch.Tensor, ...]:
        return tuple(aten._scaled_dot_product_flash_attention_for_cpu_backward(dout, q, k, v, out, lse, 0.0, causal))


class CudaFlash(PieceKernel):
    """torch's flash attention (FlashAttention-2) as its aten op pair."""

    name = "cuda-flash"

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool) -> PieceOut:
        out, lse, cq, ck, mq, mk, seed, offset, _ = aten._scaled_dot_product_flash_attention(q, k, v, 0.0, causal)
        return PieceOut(out, lse[..., :q.shape[-2]], (cq, ck, mq, mk, seed, offset))

    def backward(self, dout: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor,
                 lse: torch.Tensor, aux: tuple[Any, ...], causal: bool) -> tuple[torch.Tensor, ...]:
        cq, ck, mq, mk, seed, offset = aux
        return tuple(aten._scaled_dot_product_flash_attention_backward(
            dout, q, k, v, out, lse.contiguous(), cq, ck, mq, mk, 0.0, causal, seed, offset))


class CudaCudnn(PieceKernel):
    """cuDNN's fused attention (what the dense path runs on Hopper) as its aten op pair."""

    name = "cuda-cudnn"
    lse_dims = 3

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool) -> PieceOut:
        out, lse, cq, ck, mq, mk, seed, offset, _ = aten._scaled_dot_product_cudnn_attention(
            q, k, v, None, True, 0.0, causal, False)
        self.lse_dims = lse.dim()  # [b, H, Lq] or [b, H, Lq, 1], as this torch returns it
        return PieceOut(out, lse.reshape(q.shape[:-1]).float(), (cq, ck, mq, mk, seed, offset))

    def backward(self, dout: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor,
                 lse: torch.Tensor, aux: tuple[Any, ...], causal: bool) -> tuple[torch.Tensor, ...]:
        cq, ck, mq, mk, seed, offset = aux
        lse = lse.unsqueeze(-1).contiguous() if self.lse_dims == 4 else lse.contiguous()
        return tuple(aten._scaled_dot_product_cudnn_attention_backward(  # attn_bias None: undefined, no bias
            dout, q, k, v, out, lse, seed, offset, None, cq, ck, mq, mk, 0.0, causal))


KERNELS: dict[str, PieceKernel] = {k.name: k for k in (CpuFlash(), CudaFlash(), CudaCudnn())}


@functools.cache
def cuda_kernel(device: torch.device, head_dim: int) -> PieceKernel:
    """cuDNN where it runs a piece forward and backward and agrees with flash on this device
    (Hopper: about twice flash's speed at 64K, ``benchmarks/executor/cp_attention.py``), else flash."""
    if head_dim <= 256 and _agrees(KERNELS["cuda-cudnn"], KERNELS["cuda-flash"], device, head_dim):
        return KERNELS["cuda-cudnn"]
    return KERNELS["cuda-flash"]


def _agrees(trial: PieceKernel, ref: PieceKernel, device: torch.device, head_dim: int) -> bool:
    gen = torch.Generator(device=device).manual_seed(0)
    q, k, v, dout = (torch.randn(1, 2, n, head_dim, device=device, dtype=torch.bfloat16, generator=gen)
                     for n in (128, 384, 384, 128))
    try:
        for causal, keys in ((False, slice(0, 384)), (True, slice(256, 384))):
            got, want = trial.forward(q, k[..., keys, :], v[..., keys, :], causal), \
                ref.forward(q, k[..., keys, :], v[..., keys, :], causal)
            grads = trial.backward(dout, q, k[..., keys, :], v[..., keys, :], got.out, got.lse, got.aux, causal)
            ref_grads = ref.backward(dout, q, k[..., keys, :], v[..., keys, :], want.out, want.lse, want.aux, causal)
            pairs = [(got.out, want.out), (got.lse, want.lse), *zip(grads, ref_grads)]
            if not all(torch.allclose(a.float(), b.float(), atol=3e-2, rtol=3e-2) for a, b in pairs):
                log.info("cuDNN attention pieces disagree with flash on %s; CP uses flash", device)
                return False
        return True
    except Exception as exc:  # noqa: BLE001 - any failure means: do not use this kernel here
        log.info("cuDNN attention pieces unusable on %s (%s); CP uses flash", device, exc)
        return False


def kernel_for(q: torch.Tensor, name: str | None = None) -> PieceKernel | None:
    """The piece kernel for ``q``'s device and dtype (``name`` forces one), or ``None`` when there
    is none (CUDA fp32: the caller keeps its masked SDPA). Call it once per layer's attention:
    the CUDA choice is probed once per device (:func:`cuda_kernel`)."""
    if name is not None:
        return KERNELS[name]
    if q.device.type == "cpu":
        return KERNELS["cpu-flash"]
    if q.is_cuda and q.dtype in (torch.bfloat16, torch.float16):
        return cuda_kernel(q.device, q.shape[-1])
    return None
