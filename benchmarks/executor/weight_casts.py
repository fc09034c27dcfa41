"""What the bf16 copies of the fp32 weights and the fp32 gradient path cost a step, measured
before the change that would remove them is built (issue 16's next lever).

Today (``autocast``): every micro-batch's forward casts each fp32 weight to bf16; the weight
gradient comes out of the GEMM in bf16, is converted to fp32 and added into ``.grad``. Two
alternatives, timed on the same matmuls:

* ``cast-once``: one bf16 copy of every weight per step (``torch._foreach_copy_``); the weight
  gradient GEMM writes fp32 directly (``torch.mm(..., out_dtype=torch.float32)``), autograd
  still accumulates it into ``.grad`` (so gradient-sync hooks see what they see today). Since
  issue 33 this is the executor's own :class:`executor.model.cast_once.CastOnceLinear`.
* ``main-grad``: as ``cast-once``, but the GEMM accumulates into an fp32 main gradient in place
  (``torch.addmm(..., out=main_grad)``, Megatron's gradient-accumulation fusion): no ``.grad``
  for autograd to add, which is what moves the change into the gradient-sync and ZeRO-1 hooks.

Only the seven projections of each layer run (real shapes, chained inputs of the right widths),
forward and backward, ``--micro-batches`` per step, timed with CUDA events after warm-up steps.

    python -m benchmarks.executor.weight_casts --out $OUT            # one GPU, ~1 minute
    .venv/bin/python -m benchmarks.executor.weight_casts --cpu-smoke  # tiny, CPU
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from benchmarks.executor.run_meta import run_versions
from executor.model.cast_once import CastOnceLinear, fp32_wgrad_supported
from planner.model import PRESETS, ModelSpec

VARIANTS = ("autocast", "cast-once", "main-grad")


def _wgrad(dy: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """``dyᵀ·x`` as fp32 from bf16 operands (the GEMM writes fp32 on CUDA)."""
    if dy.is_cuda:
        return torch.mm(dy.t(), x, out_dtype=torch.float32)
    return torch.mm(dy.t().float(), x.float())


class _LowpLinear(torch.autograd.Function):
    """``x·w_lpᵀ`` whose weight gradient goes to the fp32 ``w`` (returned, or added in place into
    ``main`` when given)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, w: torch.Tensor, w_lp: torch.Tensor,  # type: ignore[override]
                main: torch.Tensor | None) -> torch.Tensor:
        ctx.save_for_backward(x, w_lp)
        ctx.main = main
        return x @ w_lp.t()

    @staticmethod
    def backward(ctx: Any, dy: torch.Tensor) -> tuple[Any, ...]:  # type: ignore[override]
        x, w_lp = ctx.saved_tensors
        dx = dy @ w_lp
        if ctx.main is None:
            return dx, _wgrad(dy, x), None, None
        if dy.is_cuda:
            torch.addmm(ctx.main, dy.t(), x, out_dtype=torch.float32, out=ctx.main)
        else:
            ctx.main.add_(_wgrad(dy, x))
        return dx, None, None, None


def _shapes(m: ModelSpec) -> list[tuple[str, int, int]]:
    """(input width key, in, out) of a layer's projections; input ``h`` or ``f``."""
    h, f, kv = m.hidden_size, m.ffn_hidden_size, m.kv_dim
    return [("h", h, h), ("h", h, kv), ("h", h, kv), ("h", h, h), ("h", h, f), ("h", h, f), ("f", f, h)]


def run_variant(variant: str, m: ModelSpec, layers: int, tokens: int, micro: int, steps: int, warmup: int,
                device: torch.device) -> dict[str, Any]:
    """Per-step time (ms) of ``variant`` over ``layers`` layers' projections."""
    gen = torch.Generator(device=device).manual_seed(0)  # drawn on the device: 7B weights take minutes on a CPU
    shapes = _shapes(m) * layers
    ws = [(torch.randn(o, i, generator=gen, device=device) * 0.02).requires_grad_(True) for _, i, o in shapes]
    lps = [torch.empty_like(w, dtype=torch.bfloat16) for w in ws]
    mains = [torch.zeros_like(w) for w in ws] if variant == "main-grad" else [None] * len(ws)
    fp32 = fp32_wgrad_supported(device)
    xin = {k: torch.randn(tokens, n, generator=gen, device=device).to(torch.bfloat16).requires_grad_(True)
           for k, n in (("h", m.hidden_size), ("f", m.ffn_hidden_size))}
    dys = {o: torch.randn(tokens, o, generator=gen, device=device).to(torch.bfloat16) for _, _, o in shapes}

    def micro_batch() -> None:
        outs = []
        if variant == "autocast":
            with torch.autocast(device.type, dtype=torch.bfloat16):
                outs = [F.linear(xin[k], w) for (k, _, _), w in zip(shapes, ws)]
        elif variant == "cast-once":  # the executor's own projection (executor.model.cast_once)
            outs = [CastOnceLinear.apply(xin[k], w, lp, fp32) for (k, _, _), w, lp in zip(shapes, ws, lps)]
        else:
            outs = [_LowpLinear.apply(xin[k], w, lp, mg) for (k, _, _), w, lp, mg in zip(shapes, ws, lps, mains)]
        torch.autograd.backward(outs, [dys[o.shape[-1]] for o in outs])

    def step() -> None:
        for w in ws:
            w.grad = None
        for g in mains:
            if g is not None:
                g.zero_()
        if variant != "autocast":
            with torch.no_grad():
                torch._foreach_copy_(lps, ws)  # the once-per-step bf16 copies
        for _ in range(micro):
            micro_batch()

    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    times = []
    for i in range(warmup + steps):
        sync()
        t0 = time.perf_counter()
        step()
        sync()
        if i >= warmup:
            times.append(1e3 * (time.perf_counter() - t0))
    grads = [g if g is not None else w.grad for w, g in zip(ws, mains)]
    return {"variant": variant, "ms": statistics.median(times), "times_ms": times,
            "grad_norm": float(torch.stack([g.float().norm() for g in grads]).norm())}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="llama-1.3b")
    ap.add_argument("--micro-batch", type=int, default=4, help="samples per micro-batch")
    ap.add_argument("--micro-batches", type=int, default=2, help="micro-batches per step")
    ap.add_argument("--layers", type=int, default=0, help="layers to run (0: the model's)")
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--out", default="benchmarks/results")
    ap.add_argument("--cpu-smoke", action="store_true")
    args = ap.parse_args(argv)
    cuda = torch.cuda.is_available() and not args.cpu_smoke
    if not cuda and not args.cpu_smoke:
        ap.error("no CUDA device: use --cpu-smoke")
    m = PRESETS["tiny" if args.cpu_smoke else args.model]
    layers = 2 if args.cpu_smoke else (args.layers or m.num_layers)
    tokens = (1 if args.cpu_smoke else args.micro_batch) * m.seq_len
    steps, warmup = (2, 1) if args.cpu_smoke else (args.steps, args.warmup)
    device = torch.device("cuda", 0) if cuda else torch.device("cpu")
    rows = []
    for v in VARIANTS:
        try:
            rows.append(run_variant(v, m, layers, tokens, args.micro_batches, steps, warmup, device))
        except Exception as exc:  # noqa: BLE001 - recorded: an op this torch lacks is a finding too
            rows.append({"variant": v, "error": f"{type(exc).__name__}: {exc}"[:300]})
        if cuda:
            torch.cuda.empty_cache()
    base = rows[0].get("ms")
    print(f"{m.name}: {layers} layers' projections, {args.micro_batches} micro-batches of {tokens} tokens a step")
    for r in rows:
        if "error" in r:
            print(f"  {r['variant']:<10} ERROR {r['error']}")
        else:
            print(f"  {r['variant']:<10} {r['ms']:8.2f} ms/step  ({r['ms'] - base:+.2f} ms against autocast)"
                  f"  grad norm {r['grad_norm']:.6g}")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    meta = {"benchmark": "weight_casts", **run_versions(cuda), "model": m.name, "layers": layers,
            "tokens_per_micro_batch": tokens, "micro_batches": args.micro_batches}
    stamp = meta["date"].replace("-", "").replace(":", "")
    path = out / f"weight_casts_{'cpu-smoke' if args.cpu_smoke else 'gpu'}_{m.name}_{stamp}.json"
    path.write_text(json.dumps({**meta, "results": rows}, indent=1))
    print(f"wrote {path}")
    return 1 if any("error" in r for r in rows[:1]) else 0


if __name__ == "__main__":
    raise SystemExit(main())
