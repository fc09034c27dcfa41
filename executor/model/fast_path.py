"""Fast GPU paths for the executor's layers: attention backend choice, fused RMSNorm, layer compile.

Everything here computes the same function as the plain fp32 code the CPU oracle checks; only the
kernels differ. On CPU every function falls back to the portable implementation.

Attention
---------
``causal_attention(q, k, v, backends)`` takes ``q [b, Hq, s, d]``, ``k, v [b, Hkv, s, d]`` with
``Hq`` a multiple of ``Hkv`` (grouped-query attention: query head ``i`` reads KV head
``i // (Hq/Hkv)``) and returns ``softmax(q·kᵀ/√d + causal mask)·v`` as ``[b, Hq, s, d]``.

* If the optional ``flash-attn`` package is importable (it is never required), half-precision CUDA
  inputs go to its ``flash_attn_func`` (native GQA, ``[b, s, H, d]`` layout).
* Otherwise ``F.scaled_dot_product_attention`` runs inside ``sdpa_kernel(backends,
  set_priority=True)``: SDPA takes the first backend of the list whose constraints the inputs meet.
  :func:`attention_backends` orders them cuDNN, flash, memory-efficient, math on Hopper (sm90+,
  where cuDNN's fused attention is the fastest of PyTorch's), flash first on older GPUs, and drops
  cuDNN if a one-off forward+backward probe of it fails on this device (driver/library mismatch).
* KV heads are expanded to the query heads (a broadcast view, then one copy) only when
  ``Hq != Hkv`` and no GQA-capable kernel is in use.

RMSNorm
-------
``rms_norm(x, w, eps) = x / sqrt(mean(x², -1) + eps) · w`` through ``F.rms_norm`` (one fused kernel
on recent CUDA builds) with the weight cast to ``x``'s dtype, so the output keeps ``x``'s dtype.

Layer compile
-------------
``compile_blocks(stage)`` compiles each transformer block of a stage in place with
``torch.compile`` (``nn.Module.compile``, so parameter names do not change), and on a TP-1 last
stage its loss (final norm, LM head, cross-entropy over ``[tokens, vocab]`` logits, the largest
element-wise tensors of the model). Inductor fuses the element-wise work between the matrix
products (residual adds, RMSNorm, RoPE, SiLU·up, dtype casts, softmax) into a few kernels. Off
unless asked; a no-op on CPU unless ``force=True``.
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
import logging
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

log = logging.getLogger("hexiscale.executor")

try:  # torch >= 2.3
    from torch.nn.attention import SDPBackend, sdpa_kernel
except ImportError:  # pragma: no cover - very old torch
    SDPBackend = None  # type: ignore[assignment,misc]
    sdpa_kernel = None  # type: ignore[assignment]

Backends = tuple[Any, ...]


# ------------------------------------------------------------------------------ attention


def _load_flash_attn(name: str = "flash_attn_func") -> Callable[..., torch.Tensor] | None:
    """``flash_attn.<name>`` when the optional package is installed and importable."""
    if importlib.util.find_spec("flash_attn") is None:
        return None
    try:
        fn = getattr(importlib.import_module("flash_attn"), name)
    except Exception as exc:  # noqa: BLE001 - a broken optional install must not stop training
        log.warning("flash-attn is installed but does not import (%s); using SDPA", exc)
        return None
    return fn  # type: ignore[no-any-return]


# Resolved once at import (a constant, so compiled code sees a plain global, not a cached call).
FLASH_ATTN_FUNC = _load_flash_attn()


def _probe(device: torch.device, backend: Any, head_dim: int) -> bool:
    """Whether ``backend`` runs a small causal bf16 forward+backward on ``device``."""
    assert sdpa_kernel is not None
    try:
        gen = torch.Generator(device=device).manual_seed(0)
        q, k, v = (torch.randn(1, 2, 256, head_dim, device=device, dtype=torch.bfloat16, generator=gen)
                   .requires_grad_(True) for _ in range(3))
        with sdpa_kernel([backend]):
            out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        out.float().sum().backward()
        assert q.grad is not None
        return bool(torch.isfinite(q.grad).all().item())
    except Exception as exc:  # noqa: BLE001 - any failure means: do not use this backend here
        log.info("SDPA backend %s unusable on %s: %s", backend, device, exc)
        return False


@functools.cache
def attention_backends(device: torch.device, head_dim: int = 128) -> Backends:
    """SDPA backends in order of preference for ``device`` (empty on CPU: let SDPA choose).

    Call it once while building a model (it may run a probe kernel), not inside a compiled region.
    """
    device = torch.device(device)
    if device.type != "cuda" or SDPBackend is None or not torch.cuda.is_available():
        return ()
    if device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    major, _ = torch.cuda.get_device_capability(device)
    order = [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]
    cudnn = SDPBackend.CUDNN_ATTENTION
    if major >= 9 and _probe(device, cudnn, head_dim):
        order.insert(0, cudnn)
    return tuple(order)


def _sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, backends: Backends) -> torch.Tensor:
    if not backends or sdpa_kernel is None:
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)
    try:
        ctx = sdpa_kernel(list(backends), set_priority=True)
    except TypeError:  # torch without set_priority: the list still restricts, in torch's own order
        ctx = sdpa_kernel(list(backends))
    with ctx:
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)


def causal_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, backends: Backends = ()) -> torch.Tensor:
    """Causal (grouped-query) attention; see the module docstring for shapes and kernel choice."""
    hq, hkv = q.shape[1], k.shape[1]
    if hq % hkv:
        raise ValueError(f"{hq} query heads are not a multiple of {hkv} KV heads")
    if q.is_cuda and q.dtype in (torch.bfloat16, torch.float16):
        if FLASH_ATTN_FUNC is not None:
            out = FLASH_ATTN_FUNC(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), causal=True)
            return out.transpose(1, 2)
    rep = hq // hkv
    if rep > 1:
        b, g, s, d = k.shape
        k = k[:, :, None].expand(b, g, rep, s, d).reshape(b, hq, s, d)
        v = v[:, :, None].expand(b, g, rep, s, d).reshape(b, hq, s, d)
    return _sdpa(q, k, v, backends)


def attention_kernel_name(device: torch.device, head_dim: int = 128) -> str:
    """Human-readable name of the attention kernel half-precision inputs get on ``device``."""
    if torch.device(device).type == "cuda" and FLASH_ATTN_FUNC is not None:
        return "flash-attn package"
    order = attention_backends(torch.device(device), head_dim)
    return "sdpa:" + (order[0].name.lower() if order else "default")


# ------------------------------------------------------------------------------ norms


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """``x / sqrt(mean(x², -1) + eps) * weight`` in ``x``'s dtype (fused kernel where torch has one)."""
    return F.rms_norm(x, (x.shape[-1],), weight.to(x.dtype), eps)


# ------------------------------------------------------------------------------ compile


_KEEP_EAGER: list[Callable[[], None]] = []  # see keep_eager_when_compiling
_compiling: list[bool] = []  # non-empty once compile_blocks ran in this process


def keep_eager_when_compiling(keep: Callable[[], None]) -> Callable[[], None]:
    """Register ``keep`` (it makes some of its module's functions graph breaks) to run when this
    process first compiles blocks, or now if it already has: for modules that import this one, which
    :func:`compile_blocks` cannot import back (an import cycle)."""
    _KEEP_EAGER.append(keep)
    if _compiling:
        keep()
    return keep


def compile_blocks(stage: nn.Module, *, force: bool = False, head: bool = True, mode: str | None = None,
                   backend: str = "inductor") -> int:
    """Compile every transformer block of ``stage`` (its ``layers`` ModuleDict) in place, and with
    ``head`` the last stage's loss (final norm, LM head, cross-entropy) when its TP degree is 1.

    Returns how many blocks were compiled: 0 on CPU unless ``force``. Blocks are identical
    modules, so Dynamo traces one graph and reuses it for the others (parameters are inputs).
    TP collectives and CP's K/V all-gather inside a block are graph breaks
    (:func:`executor.parallel.tp_layers.keep_collectives_eager`,
    :func:`executor.parallel.kv_gather.keep_kv_gather_eager`), and so is what modules that import this
    one registered (:func:`keep_eager_when_compiling`: CP's attention).
    ``backend``: torch.compile's (``aot_eager`` traces the same graphs without generating kernels,
    which is how the CPU tests check that the compiled region has no graph break).
    """
    layers = getattr(stage, "layers", None)
    if not isinstance(layers, nn.ModuleDict):
        raise TypeError("compile_blocks expects a stage module with a `layers` ModuleDict")
    params = list(stage.parameters())
    on_cpu = not params or params[0].device.type == "cpu"
    if on_cpu and not force:
        return 0
    from executor.parallel.kv_gather import keep_kv_gather_eager
    from executor.parallel.tp_layers import keep_collectives_eager

    keep_collectives_eager()
    keep_kv_gather_eager()
    _compiling.append(True)
    for keep in _KEEP_EAGER:
        keep()
    for block in layers.values():
        block.compile(mode=mode, dynamic=False, backend=backend)
    if head and getattr(stage, "last", False) and getattr(stage, "tp", 1) == 1:
        # the loss is a method, not a module: compile the bound method and shadow it on the instance
        # (head_loss where the stage has it: its loss() refreshes cast-once copies first, eagerly)
        name = "head_loss" if hasattr(stage, "head_loss") else "loss"
        loss_fn: Callable[..., torch.Tensor] = getattr(stage, name)
        object.__setattr__(stage, name, torch.compile(loss_fn, mode=mode, dynamic=False, backend=backend))
    return len(layers)


def synchronize(device: torch.device) -> None:
    """Wait for ``device``'s queued work (nothing to wait for on CPU)."""
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)
