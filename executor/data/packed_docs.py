"""Documents packed back to back into one micro-batch row, and attention that never crosses them.

A packed micro-batch is one row of ``T = Σ_d s_d`` tokens: document ``d`` contributes its ``s_d``
inputs (``doc[:-1]``) and labels (``doc[1:]``), so no label ever predicts the first token of the
next document. :class:`DocSpans` holds the lengths ``s_d``; from them:

* **positions** restart at 0 in every document (RoPE sees each document as if it were alone);
* **attention** is block-diagonal causal: token ``i`` of document ``d`` attends to tokens
  ``0..i`` of ``d`` only. Packed, masked training is therefore the same function as training every
  document on its own (the oracle in ``tests/executor/test_exec_packed.py`` checks it).

Kernels (:func:`packed_attention`, ``q [1, Hq, T, d]``, ``k, v [1, Hkv, T, d]``):

* half-precision CUDA inputs: the ``flash-attn`` package's ``flash_attn_varlen_func`` when it is
  installed (never required), else PyTorch's own ``torch.nn.attention.varlen.varlen_attn`` (Flash
  backend, ``cu_seqlens`` in, native GQA) where this torch has it — both run only the ``Σ s_d²/2``
  useful score blocks;
* other CUDA inputs (fp32, or a torch without the varlen API): causal SDPA on each document's slice
  (exact FLOPs, one launch per document);
* on CPU: SDPA with the dense ``[T, T]`` boolean mask (exact, O(T²) memory), one document alone
  being plain causal attention.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F

from executor.model import fast_path


@dataclass(frozen=True)
class DocSpans:
    """Lengths (input tokens) of the documents packed into one row, in order."""

    lengths: tuple[int, ...]
    _cache: dict[tuple[str, str], torch.Tensor] = field(default_factory=dict, compare=False, repr=False)

    def __post_init__(self) -> None:
        if not self.lengths or min(self.lengths) < 1:
            raise ValueError(f"a packed row needs documents of >= 1 token, got {self.lengths}")

    @property
    def total(self) -> int:
        return sum(self.lengths)

    @property
    def max_len(self) -> int:
        return max(self.lengths)

    def _cached(self, kind: str, device: torch.device, build: Callable[[], torch.Tensor]) -> torch.Tensor:
        """``build()`` on ``device``, once. To a GPU from pinned memory without blocking: a plain copy
        waits for every kernel queued before it, and a packed micro-batch makes two (positions, then
        document boundaries in the first layer), so the host lost its lead on the GPU each time
        (on 4x H100, 2026-11-27, packed plans ran 13-21 % over their prediction, ~24 % over the same
        tokens unpacked, whose inputs are copied without blocking)."""
        key = (kind, str(device))
        if key not in self._cache:
            t = build()
            on_gpu = torch.device(device).type == "cuda"
            self._cache[key] = t.pin_memory().to(device, non_blocking=True) if on_gpu else t.to(device)
        return self._cache[key]

    def positions(self, device: torch.device) -> torch.Tensor:
        """Position of every token inside its own document, LongTensor ``[T]``."""
        return self._cached("pos", device, lambda: torch.cat([torch.arange(n) for n in self.lengths]))

    def cu_seqlens(self, device: torch.device) -> torch.Tensor:
        """Document boundaries ``[0, s_0, s_0 + s_1, ..., T]`` (int32, what varlen kernels take)."""
        lens = torch.tensor((0, *self.lengths), dtype=torch.int64)
        return self._cached("cu", device, lambda: lens.cumsum(0).to(torch.int32))

    def mask(self, device: torch.device) -> torch.Tensor:
        """Boolean ``[T, T]``: True where query ``i`` may attend to key ``j`` (same document, j <= i)."""
        return self._cached("mask", device, lambda: self.mask_rows(0, self.total, torch.device("cpu")))

    def mask_rows(self, start: int, stop: int, device: torch.device) -> torch.Tensor:
        """Rows ``[start, stop)`` of :meth:`mask` over keys ``[0, stop)`` (what a context-parallel
        query chunk needs, :mod:`executor.parallel.context_parallel`), built on ``device``."""
        doc = self._cached("doc", device, lambda: torch.repeat_interleave(torch.arange(len(self.lengths)),
                                                                          torch.tensor(self.lengths)))
        q, k = torch.arange(start, stop, device=device), torch.arange(stop, device=device)
        return (q[:, None] >= k[None, :]) & (doc[start:stop, None] == doc[None, :stop])


@functools.cache
def torch_varlen() -> Callable[..., Any] | None:
    """PyTorch's ``varlen_attn`` where this torch has it (imported on first use on a GPU: the
    module registers a custom op, which CPU jobs do not need), as ``fn(q, k, v, cu, max_len)``:
    causal, grouped-query. Two signatures exist: the newer ``window_size=(-1, 0), enable_gqa=``
    keywords, and the first one (``is_causal``, key/value heads equal to the query heads)."""
    try:
        from torch.nn.attention.varlen import varlen_attn
    except ImportError:  # torch without the varlen API
        return None
    params = inspect.signature(varlen_attn).parameters
    if "window_size" in params and "enable_gqa" in params:
        def newer(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu: torch.Tensor, n: int) -> Any:
            return varlen_attn(q, k, v, cu, cu, n, n, window_size=(-1, 0), enable_gqa=k.shape[1] != q.shape[1])
        return newer
    if "is_causal" in params:
        def first(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu: torch.Tensor, n: int) -> Any:
            rep = q.shape[1] // k.shape[1]
            if rep > 1:  # [T, Hkv, d] -> [T, Hq, d]
                k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
            return varlen_attn(q, k, v, cu, cu, n, n, is_causal=True)  # type: ignore[call-arg]
        return first
    return None


FLASH_VARLEN_FUNC = fast_path._load_flash_attn("flash_attn_varlen_func")


def varlen_kernel_name(q: torch.Tensor) -> str:
    """Which kernel :func:`packed_attention` uses for inputs like ``q`` (for logs and benchmarks)."""
    if q.is_cuda and q.dtype in (torch.bfloat16, torch.float16):
        if FLASH_VARLEN_FUNC is not None:
            return "flash-attn varlen"
        if torch_varlen() is not None:
            return "torch varlen_attn"
    if q.is_cuda:
        return "sdpa per document"
    return "sdpa + document mask"


def _expand_kv(k: torch.Tensor, v: torch.Tensor, heads: int) -> tuple[torch.Tensor, torch.Tensor]:
    b, g, s, d = k.shape
    rep = heads // g
    if rep == 1:
        return k, v
    return (k[:, :, None].expand(b, g, rep, s, d).reshape(b, heads, s, d),
            v[:, :, None].expand(b, g, rep, s, d).reshape(b, heads, s, d))


def packed_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, docs: DocSpans,
                     backends: Sequence[Any] = ()) -> torch.Tensor:
    """Block-diagonal causal (grouped-query) attention over the documents of one packed row."""
    if q.shape[0] != 1 or q.shape[2] != docs.total:
        raise ValueError(f"a packed row is [1, heads, {docs.total}, d], got q {list(q.shape)}")
    if len(docs.lengths) == 1:
        return fast_path.causal_attention(q, k, v, tuple(backends))
    kernel = varlen_kernel_name(q)
    if kernel == "sdpa per document":  # causal SDPA on each document's slice: no T x T mask on a GPU
        parts = zip(*(t.split(list(docs.lengths), dim=2) for t in (q, k, v)))
        return torch.cat([fast_path.causal_attention(a, b, c, tuple(backends)) for a, b, c in parts], dim=2)
    if kernel != "sdpa + document mask":
        cu = docs.cu_seqlens(q.device)
        qt, kt, vt = (t[0].transpose(0, 1) for t in (q, k, v))  # [T, heads, d]
        if FLASH_VARLEN_FUNC is not None:
            out = FLASH_VARLEN_FUNC(qt, kt, vt, cu, cu, docs.max_len, docs.max_len, causal=True)
        else:
            fn = torch_varlen()
            assert fn is not None
            out = fn(qt, kt, vt, cu, docs.max_len)
        return out.transpose(0, 1)[None]
    k, v = _expand_kv(k, v, q.shape[1])
    return F.scaled_dot_product_attention(q, k, v, attn_mask=docs.mask(q.device))
