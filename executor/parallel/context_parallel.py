"""Context parallelism inside a stage: the causal load-balanced sequence split and attention over
the CP group by an all-gather of K and V (GQA keeps them small).

Layout (:mod:`planner.cp_layout`): the sequence of ``S`` tokens is cut into ``2·cp`` chunks of
``L``; CP rank ``r`` holds chunks ``r`` and ``2·cp-1-r`` of the activations, labels and RoPE
positions. Attention of local chunk ``c`` needs the keys ``[0, (c+1)·L)``:

1. K and V (after RoPE, at global positions) are all-gathered over the stage's CP group and put in
   global order (:mod:`executor.parallel.kv_gather`); its backward sums every rank's gradient of the
   gathered K/V and gives each rank its own chunks (a reduce-scatter);
2. each local query chunk attends to that prefix with the causal mask aligned lower-right (query
   ``i`` of chunk ``c`` sees keys ``<= c·L + i``): exactly the rows of dense causal attention. On
   CPU and CUDA bf16/fp16 that runs block by block, merged by log-sum-exp, in one autograd node
   that keeps only the rank's own K/V (:mod:`executor.parallel.cp_blockwise`); CUDA fp32 keeps one
   masked SDPA call per chunk over the gathered K/V (:func:`masked_cp_attention`). A packed row
   (documents back to back, :mod:`executor.data.packed_docs`) is split the same way; its
   queries also keep to their own document (:func:`cp_packed_attention`), and RoPE takes each
   token's position inside its document.

The loss of a CP rank is the sum over its tokens scaled by ``1 / global_tokens``; CP ranks of a
stage hold the same weight shards and their gradients are SUM-reduced with the pipelines'
(:func:`planner.layout.build_topology` adds them as owners), so the step equals the dense one.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from executor.data.packed_docs import DocSpans
from executor.model import fast_path
from executor.parallel.attention_pieces import kernel_for
from executor.parallel.cp_blockwise import blockwise_cp_attention, expand_kv
from executor.parallel.kv_gather import gather_kv
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


def _sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: Any, backends: fast_path.Backends) -> torch.Tensor:
    if not backends or fast_path.sdpa_kernel is None:
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    with fast_path.sdpa_kernel(list(backends)):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)


def masked_local(q: torch.Tensor, kv: torch.Tensor, cp: int, cp_rank: int, backends: fast_path.Backends,
                 mask_rows: Callable[[int, int], Any]) -> torch.Tensor:
    """Local query chunk ``c`` (``q [b, Hq, 2L, d]``: chunks ``cp_rank`` and ``2·cp-1-cp_rank``) over
    the gathered, expanded keys ``kv [2, b, Hq, S, d]`` ``[0, (c+1)·L)`` under ``mask_rows(c·L, (c+1)·L)``."""
    n = q.shape[-2] // 2
    outs = []
    for half, c in enumerate((cp_rank, 2 * cp - 1 - cp_rank)):
        end = (c + 1) * n
        outs.append(_sdpa(q[..., half * n:(half + 1) * n, :], kv[0, ..., :end, :], kv[1, ..., :end, :],
                          mask_rows(c * n, end), backends))
    return torch.cat(outs, dim=-2)


def _attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cp: CPContext, backends: fast_path.Backends,
            mask_rows: Callable[[int, int], Any]) -> torch.Tensor:
    kv = expand_kv(gather_kv(torch.stack([k, v]), cp.cp, cp.group), q.shape[1])
    return masked_local(q, kv, cp.cp, cp.cp_rank, backends, mask_rows)


def cp_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cp: CPContext,
                 backends: fast_path.Backends = ()) -> torch.Tensor:
    """Causal GQA attention of the local queries ``q [b, Hq, 2L, d]`` over the whole sequence, from
    the local ``k, v [b, Hkv, 2L, d]``: block by block with flash kernels merged by log-sum-exp
    (:mod:`executor.parallel.cp_blockwise`) where a kernel exists for ``q`` (CPU; CUDA bf16/fp16),
    else one masked SDPA call per local chunk, causal aligned lower-right (module docstring)."""
    return _attention(q, k, v, cp, backends)


def _cp_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cp: CPContext,
                  backends: fast_path.Backends = ()) -> torch.Tensor:
    kernel = kernel_for(q)
    if kernel is not None:
        return blockwise_cp_attention(q, k, v, cp.cp, cp.cp_rank, cp.group, kernel)
    return masked_cp_attention(q, k, v, cp, backends)


def masked_cp_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cp: CPContext,
                        backends: fast_path.Backends = ()) -> torch.Tensor:
    """:func:`cp_attention` as one SDPA call per local chunk under the lower-right causal mask
    (CUDA fp32, and the baseline of ``benchmarks/executor/cp_attention.py``)."""
    from torch.nn.attention.bias import causal_lower_right

    return _attend(q, k, v, cp, backends, lambda start, end: causal_lower_right(end - start, end))


def cp_packed_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, docs: DocSpans, cp: CPContext,
                        backends: fast_path.Backends = ()) -> torch.Tensor:
    """:func:`cp_attention` for a packed row (``docs``: the whole row's documents): each query also
    keeps to its own document — its rows of the row's document mask, built for those rows only
    (``DocSpans.mask_rows``: L x (c+1)·L booleans; exact, not yet a varlen kernel)."""
    return _packed_attention(q, k, v, docs, cp, backends)


def _cp_packed_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, docs: DocSpans, cp: CPContext,
                         backends: fast_path.Backends = ()) -> torch.Tensor:
    return _attend(q, k, v, cp, backends, lambda start, end: docs.mask_rows(start, end, q.device))


# Both attentions run eager inside compiled blocks (a graph break, as the K/V all-gather): under
# Inductor on CUDA (torch 2.11, H100) the lower-right causal bias's efficient-attention backward
# failed its fake-kernel check, while CPU's aot_eager passed (tests/executor/test_exec_nccl4.py).
_attention, _packed_attention = _cp_attention, _cp_packed_attention  # see keep_cp_attention_eager


@fast_path.keep_eager_when_compiling
def keep_cp_attention_eager() -> None:
    """Make both CP attentions graph breaks under ``torch.compile`` (comment above), only in a process
    that compiles (registered with :func:`executor.model.fast_path.keep_eager_when_compiling`): decorating them at
    import imported the compiler stack (~1.3 s) into every process that imports this module."""
    global _attention, _packed_attention
    if _attention is _cp_attention:
        _attention = torch.compiler.disable(_cp_attention)
        _packed_attention = torch.compiler.disable(_cp_packed_attention)
