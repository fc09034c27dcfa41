"""Attention kernels that return the log-sum-exp, so that a query block's attention over several
key blocks can be computed block by block and merged exactly (:mod:`executor.parallel.cp_attention`).

A piece is ``(q, k, v, causal)`` with ``q [b, H, Lq, d]`` and ``k, v [b, H, Lk, d]`` (equal heads:
GQA is expanded by the caller). :meth:`PieceKernel.forward` gives the piece's output and its
log-sum-exp ``[b, H, Lq]`` (fp32); :meth:`PieceKernel.backward` takes the **merged** output and
log-sum-exp of the query block: the flash backward recomputes the probabilities as
``exp(s - lse)`` and the row term ``D = rowsum(dO * O)`` from what it is given, so with the merged
pair each piece yields its exact share of ``dq`` and the exact ``dk, dv`` of its keys (the ring
attention identity).

Kernels: torch's flash attention on CUDA (bf16/fp16) and its CPU flash kernel (any float dtype),
both as aten ops (the public SDPA call hides the log-sum-exp). CUDA in fp32 has no such kernel
here: :func:`kernel_for` returns ``None`` and the caller keeps its masked-SDPA path.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

aten = torch.ops.aten


@dataclass(frozen=True)
class PieceOut:
    out: torch.Tensor  # [b, H, Lq, d] in the input dtype
    lse: torch.Tensor  # [b, H, Lq] fp32
    aux: tuple[Any, ...]  # what the kernel's backward needs besides the tensors (flash's rng state)


class PieceKernel:
    name = "abstract"

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool) -> PieceOut:
        raise NotImplementedError

    def backward(self, dout: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor,
                 lse: torch.Tensor, aux: tuple[Any, ...], causal: bool) -> tuple[torch.Tensor, ...]:
        raise NotImplementedError


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

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool) -> PieceOut:
        out, lse, cq, ck, mq, mk, seed, offset, _ = aten._scaled_dot_product_cudnn_attention(
            q, k, v, None, True, 0.0, causal, False)
        lse = lse.reshape(q.shape[:-1]) if lse.numel() == q[..., 0].numel() else lse[..., :q.shape[-2], 0]
        return PieceOut(out, lse.float(), (cq, ck, mq, mk, seed, offset))

    def backward(self, dout: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor,
                 lse: torch.Tensor, aux: tuple[Any, ...], causal: bool) -> tuple[torch.Tensor, ...]:
        cq, ck, mq, mk, seed, offset = aux
        empty = torch.empty(0, device=q.device, dtype=q.dtype)
        return tuple(aten._scaled_dot_product_cudnn_attention_backward(
            dout, q, k, v, out, lse.unsqueeze(-1).contiguous(), seed, offset, empty, cq, ck, mq, mk, 0.0, causal))


KERNELS: dict[str, PieceKernel] = {k.name: k for k in (CpuFlash(), CudaFlash(), CudaCudnn())}
CUDA_DEFAULT = "cuda-flash"  # set by the 64K check on H100 (benchmarks/executor/cp_attention.py)


def kernel_for(q: torch.Tensor, name: str | None = None) -> PieceKernel | None:
    """The piece kernel for ``q``'s device and dtype (``name`` forces one), or ``None`` when there
    is none (CUDA fp32: the caller keeps its masked SDPA)."""
    if name is not None:
        return KERNELS[name]
    if q.device.type == "cpu":
        return KERNELS["cpu-flash"]
    if q.is_cuda and q.dtype in (torch.bfloat16, torch.float16):
        return KERNELS[CUDA_DEFAULT]
    return None
