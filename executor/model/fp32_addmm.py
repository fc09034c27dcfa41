"""``acc + a·b`` from one GEMM in fp32 (``torch.addmm(acc, a, b, out_dtype=torch.float32)``, cuBLAS's
``beta = 1`` epilogue), callable both eagerly and inside a compiled region.

Why not ``torch.addmm`` under compile as well: while Dynamo traces it, fake tensors run torch's
Python decomposition of ``aten.addmm``, which in torch 2.11 binds the ``.dtype`` overload's
``out_dtype`` to ``beta`` and fails (``unsupported operand type(s) for *: 'torch.dtype' and
'FakeTensor'``; fixed by 2.13). Inside a compiled region the product therefore goes through a
custom op whose fake implementation gives only the result's shape and dtype: the decomposition
never runs, and the GEMM still adds ``acc`` in its epilogue (Inductor calls a GEMM as an external
kernel either way). Eagerly it is the plain call, without the custom op's Python dispatch.
"""

from __future__ import annotations

import torch


@torch.library.custom_op("hexiscale::addmm_fp32", mutates_args=())
def _addmm_fp32_op(acc: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return torch.addmm(acc, a, b, out_dtype=torch.float32)


@_addmm_fp32_op.register_fake
def _(acc: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return a.new_empty((a.shape[0], b.shape[1]), dtype=torch.float32)


def addmm_fp32(acc: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``acc + a·b`` (``acc`` fp32, ``a`` and ``b`` low precision) in fp32 from one GEMM (module docstring)."""
    if torch.compiler.is_compiling():
        return _addmm_fp32_op(acc, a, b)
    return torch.addmm(acc, a, b, out_dtype=torch.float32)
