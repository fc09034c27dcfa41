"""Start-up check that the BLAS library's matrix products are right on this GPU, and the fix when not.

Why: on an H100 limited by MPS to 55-85 % of its SMs (72-112 of 132), cuBLAS 13.1 (CUDA 13.0, torch
2.11) picks persistent nvjet kernels with 8-CTA thread-block clusters (``CLUSTER_SHAPE_2x4x1`` /
``4x2x1``; 2-CTA ones at 132 SMs) that leave whole output tiles unwritten: a bf16 ``x @ Wᵀ`` of
llama-1.3b's shapes came back with up to a third of its elements never written, so training read
uninitialised memory and stopped at step 1 with a NaN loss or gradient norm (issue 29; every SDPA
backend alike, since the projections around attention were the culprit). At 50 % (66 SMs) and at
90-100 % the heuristics choose other kernels and the products are right.

What this module does, once per process and dtype: run the stage's own products (forward ``x·Wᵀ``,
input gradient ``dY·W`` and weight gradient ``dYᵀ·x`` of every distinct linear shape, at the plan's
micro-batch token count and a few others, since the kernel choice depends on ``M``) into outputs
poisoned with NaN, and check each with Freivalds' test (``C·r`` against ``A·(B·r)`` in float64 for a Gaussian ``r``,
matrix-vector products only, so a different kind of kernel), which any wrong or unwritten element
fails. If a product fails, the matrix products go through cuBLASLt with a smaller SM-count target
(``CUBLASLT_MATMUL_DESC_SM_COUNT_TARGET``, torch's SM carve-out), which changes the heuristic's
choice, trying targets downwards until every product passes; if none does, training is refused
with one line rather than run on wrong arithmetic.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import torch

from planner.model import ModelSpec

log = logging.getLogger("hexiscale.executor")

# bf16 products of O(1) inputs: Freivalds' relative residual stays near 1e-3; garbage is O(1)
TOLERANCE = 3e-2
EXTRA_TOKENS = (512, 2048, 8192)


class GemmCheckError(RuntimeError):
    """No BLAS setting on this device gives right matrix products."""


@dataclass(frozen=True)
class GemmCheck:
    """What the check found: the device's SM count, the SM-count target it had to set (None: the
    library's default was right) and the products the default got wrong."""

    sms: int
    target: int | None
    failed: tuple[str, ...]


def linear_shapes(model: ModelSpec, tp: int, *, first: bool, last: bool) -> tuple[tuple[int, int], ...]:
    """Distinct ``(out_features, in_features)`` of one stage's local linears (TP shards)."""
    h, d = model.hidden_size, model.head_dim
    shapes = {(model.num_heads * d // tp, h), (model.num_kv_heads * d // tp, h), (h, model.num_heads * d // tp),
              (model.ffn_hidden_size // tp, h), (h, model.ffn_hidden_size // tp)}
    if last:
        shapes.add((model.vocab_size // tp, h))
    return tuple(sorted(shapes))


def stage_shapes(model: ModelSpec, stages: Iterable[Any]) -> tuple[tuple[int, int], ...]:
    """The union of :func:`linear_shapes` over ``stages`` (topology stages: ``tp``, ``is_first``,
    ``is_last``): a strategy pool's layouts are checked as one set, so the SM-count target chosen
    is right for every layout's products, not only the last one checked."""
    return tuple(sorted({s for st in stages
                         for s in linear_shapes(model, st.tp, first=st.is_first, last=st.is_last)}))


def _matvec(a: torch.Tensor, v: torch.Tensor, rows: int = 1024) -> torch.Tensor:
    """``a @ v`` in float64, ``rows`` rows of ``a`` at a time (bounded memory)."""
    return torch.cat([a[i:i + rows].double() @ v for i in range(0, a.shape[0], rows)])


def _freivalds_ok(c: torch.Tensor, a: torch.Tensor, b: torch.Tensor, gen: torch.Generator) -> bool:
    """``c == a @ b`` within bf16 rounding, every element weighed by a Gaussian draw (random signs
    would miss a tile shifted by a constant whenever its column signs cancel)."""
    if not bool(torch.isfinite(c).all()):
        return False
    r = torch.randn(b.shape[1], 1, generator=gen, device=c.device, dtype=torch.float64)
    want = _matvec(a, _matvec(b, r))
    got = _matvec(c, r)
    return float((got - want).norm()) <= TOLERANCE * float(want.norm()) + 1e-6


def failing_products(device: torch.device, dtype: torch.dtype, shapes: Iterable[tuple[int, int]],
                     tokens: Iterable[int]) -> list[str]:
    """The products (``M{tokens}.{out}x{in}.{fwd|dx|dw}``) that come back wrong on ``device``."""
    gen = torch.Generator(device=device).manual_seed(0)
    bad = []
    for m in sorted(set(tokens)):
        for n_out, n_in in shapes:
            x = torch.randn(m, n_in, device=device, dtype=dtype, generator=gen)
            w = torch.randn(n_out, n_in, device=device, dtype=dtype, generator=gen)
            dy = torch.randn(m, n_out, device=device, dtype=dtype, generator=gen)
            for name, (a, b) in {"fwd": (x, w.t()), "dx": (dy, w), "dw": (dy.t(), x)}.items():
                out = torch.full((a.shape[0], b.shape[1]), float("nan"), device=device, dtype=dtype)
                torch.mm(a, b, out=out)
                if not _freivalds_ok(out, a, b, gen):
                    bad.append(f"M{m}.{n_out}x{n_in}.{name}")
    return bad


def _set_target(sms: int, target: int | None) -> None:
    if target is None:
        torch.backends.cuda.preferred_blas_library("default")
        torch._C._set_sm_carveout_experimental(None)  # type: ignore[attr-defined]
    else:
        torch.backends.cuda.preferred_blas_library("cublaslt")
        torch._C._set_sm_carveout_experimental(sms - target)  # type: ignore[attr-defined]


def targets_below(sms: int) -> list[int]:
    """SM-count targets to try, largest first: every 8 SMs down to half the device."""
    return list(range(sms - 8, max(sms // 2, 1) - 1, -8)) + ([sms // 2] if (sms - sms // 2) % 8 else [])


@functools.cache
def ensure_right_products(device: torch.device, dtype: torch.dtype, shapes: tuple[tuple[int, int], ...],
                          tokens: tuple[int, ...]) -> GemmCheck:
    """Check the products once per (device, dtype, shapes, tokens); fix or refuse (module docstring)."""
    sms = torch.cuda.get_device_properties(device).multi_processor_count
    every = tuple(sorted(set(tokens) | set(EXTRA_TOKENS)))
    found = settle(sms, lambda: failing_products(device, dtype, shapes, every), _set_target)
    torch.cuda.empty_cache()  # the check's operands (a few GiB for a large vocabulary) go back to the device
    if found.target is not None:
        log.warning("cuBLAS %s matrix products on this GPU (%d SMs: an MPS share?) came back wrong (%s); "
                    "they run through cuBLASLt targeting %d SMs instead, which checks right",
                    str(dtype).removeprefix("torch."), sms, ", ".join(found.failed[:3]), found.target)
    return found


def settle(sms: int, check: Callable[[], list[str]], set_target: Callable[[int, int | None], None]) -> GemmCheck:
    """The library default if ``check`` finds nothing wrong; else the largest SM-count target of
    :func:`targets_below` under which it finds nothing; else :class:`GemmCheckError`."""
    failed = check()
    if not failed:
        return GemmCheck(sms, None, ())
    if not hasattr(torch._C, "_set_sm_carveout_experimental"):
        raise GemmCheckError(_refusal(sms, failed, "this torch cannot set cuBLASLt's SM-count target"))
    for target in targets_below(sms):
        set_target(sms, target)
        if not check():
            return GemmCheck(sms, target, tuple(failed))
    set_target(sms, None)
    raise GemmCheckError(_refusal(sms, failed, f"no SM-count target from {sms - 8} down to {sms // 2} fixed them"))


def _refusal(sms: int, failed: list[str], why: str) -> str:
    return (f"the GPU's matrix products come back wrong at {sms} SMs ({', '.join(failed[:3])}"
            f"{', ...' if len(failed) > 3 else ''}) and {why}: run it with all of its SMs or another "
            "MPS share (CUDA_MPS_ACTIVE_THREAD_PERCENTAGE 50 or 90-100 on an H100), or another torch/CUDA")
