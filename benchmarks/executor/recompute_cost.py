"""What selective recompute costs a layer: none, selective as one autograd node
(``executor.model.recompute_core``) and selective through ``torch.utils.checkpoint`` (what that node
replaced), timed in one process with the profiler's own layer measurement (eager, chained layers,
the engine's autocast) at the fidelity plans' shapes.

Fidelity run 3 (4x H200) measured a 1F1B stage with ``selective`` 18.8 % slower than the model said,
and its calibration rows put the selective forward at 1.76 ms against 0.90 ms without recompute at
micro-batch 1, though the forward recomputes nothing: the checkpoint's host bookkeeping. This
program shows whether the one-node form removes that, and checks on the device that both selective
forms give the same gradients (the recompute is the same function on the same inputs): bit for bit,
or no further apart than the checkpoint from itself where the attention backward is not deterministic.

    python -m benchmarks.executor.recompute_cost --out $OUT          # one GPU, about a minute
    python -m benchmarks.executor.recompute_cost --cpu-smoke         # tiny, CPU
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch
from torch.utils.checkpoint import checkpoint

from benchmarks.executor.run_meta import run_versions
from executor.model import llama as model_mod
from executor.model.llama import Block
from executor.profiler.compute import _rope, autocast, measure_layer, prepare
from planner.model import PRESETS

VARIANTS = ("none", "selective", "selective-checkpoint")


def _checkpointed(core: Callable[..., torch.Tensor], q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                  extra: Any) -> torch.Tensor:
    return checkpoint(core, q, k, v, extra, use_reentrant=False)


@contextmanager
def _variant(name: str) -> Iterator[str]:
    """The recompute mode to build the block with; ``selective-checkpoint`` swaps the model's
    recompute function for the checkpoint for the duration."""
    if name != "selective-checkpoint":
        yield name
        return
    kept = model_mod.recomputed_core
    model_mod.recomputed_core = _checkpointed
    try:
        yield "selective"
    finally:
        model_mod.recomputed_core = kept


def _gradients(name: str, spec: Any, micro_batch: int, seq_len: int, dtype: str,
               device: torch.device) -> list[torch.Tensor]:
    torch.manual_seed(0)
    with _variant(name) as mode:
        block = prepare(Block(spec, tp=1, group=None, recompute=mode, device=None), dtype, device)
        cos, sin = _rope(spec, seq_len, device)
        gen = torch.Generator(device=device).manual_seed(1)
        x = torch.randn(micro_batch, seq_len, spec.hidden_size, device=device, generator=gen, requires_grad=True)
        with autocast(dtype, device):
            y = block(x, cos, sin)
        y.backward(torch.ones_like(y))
    return [g for g in (x.grad, *(p.grad for p in block.parameters())) if g is not None]


def _max_rel(a: list[torch.Tensor], b: list[torch.Tensor]) -> float:
    return max(float((x - y).abs().max() / y.abs().max().clamp_min(1e-30)) for x, y in zip(a, b))


def compare_gradients(spec: Any, micro_batch: int, seq_len: int, dtype: str, device: torch.device) -> dict[str, Any]:
    """One block, the same weights and input: the one-node form's gradients against the checkpoint's,
    and the checkpoint's against itself run again (the attention backward's own run-to-run noise
    where its kernel is not deterministic). The forms agree when the first is no larger than the
    second (both 0: bit-equal)."""
    node = _gradients("selective", spec, micro_batch, seq_len, dtype, device)
    ck1 = _gradients("selective-checkpoint", spec, micro_batch, seq_len, dtype, device)
    ck2 = _gradients("selective-checkpoint", spec, micro_batch, seq_len, dtype, device)
    forms, noise = _max_rel(node, ck1), _max_rel(ck2, ck1)
    return {"forms_max_rel": forms, "noise_max_rel": noise, "agree": forms <= noise,
            "bit_equal": all(torch.equal(a, b) for a, b in zip(node, ck1))}


def run(model: str, seq_len: int, micro_batches: list[int], chain: int, dtype: str, device: torch.device,
        warmup: int, repeats: int) -> dict[str, Any]:
    spec = replace(PRESETS[model], seq_len=seq_len)
    rows = []
    for mb in micro_batches:
        for name in VARIANTS:
            with _variant(name) as mode:
                r = measure_layer(spec, micro_batch=mb, seq_len=seq_len, tp=1, recompute=mode, dtype=dtype,
                                  device=device, warmup=warmup, repeats=repeats, chain=chain)
            rows.append({"micro_batch": mb, "variant": name, "forward_ms": r["forward_s"] * 1e3,
                         "backward_ms": r["backward_s"] * 1e3,
                         "activation_mb": r.get("activation_bytes", 0) / 1e6})
    base = {r["micro_batch"]: r for r in rows if r["variant"] == "none"}
    for r in rows:
        b = base[r["micro_batch"]]
        r["vs_none"] = (r["forward_ms"] + r["backward_ms"]) / (b["forward_ms"] + b["backward_ms"])
    return {"model": model, "seq_len": seq_len, "chain": chain, "dtype": dtype, "rows": rows,
            "gradients": compare_gradients(spec, micro_batches[0], seq_len, dtype, device)}


def print_table(res: dict[str, Any]) -> None:
    g = res["gradients"]
    print(f"{res['model']}, seq {res['seq_len']}, {res['chain']} chained layers, {res['dtype']}; selective forms' "
          f"gradients: bit-equal {g['bit_equal']}, max rel difference {g['forms_max_rel']:.2e} against the "
          f"checkpoint's own run-to-run {g['noise_max_rel']:.2e} ({'agree' if g['agree'] else 'DIFFER'})")
    print("| micro-batch | variant | forward ms | backward ms | activation MB | (fwd+bwd) / none |")
    print("|---:|---|---:|---:|---:|---:|")
    for r in res["rows"]:
        print(f"| {r['micro_batch']} | {r['variant']} | {r['forward_ms']:.3f} | {r['backward_ms']:.3f} | "
              f"{r['activation_mb']:.1f} | {r['vs_none']:.3f} |")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--model", default="llama-1.3b")
    ap.add_argument("--seq-len", type=int, default=2048)
    ap.add_argument("--micro-batches", default="1,2,4")
    ap.add_argument("--chain", type=int, default=4)
    ap.add_argument("--out", default=None, help="folder for the JSON (none: print only)")
    ap.add_argument("--cpu-smoke", action="store_true", help="tiny model on the CPU")
    args = ap.parse_args(argv)
    if args.cpu_smoke:
        device, dtype, model, seq, mbs, warm, reps = torch.device("cpu"), "fp32", "tiny", 32, [1, 2], 1, 3
    else:
        if not torch.cuda.is_available():
            raise SystemExit("recompute_cost: no CUDA device; use --cpu-smoke on a CPU host")
        device, dtype, model, seq = torch.device("cuda"), "bf16", args.model, args.seq_len
        mbs, warm, reps = [int(m) for m in args.micro_batches.split(",")], 3, 20
    res = run(model, seq, mbs, args.chain, dtype, device, warm, reps)
    res["meta"] = run_versions(gpu=device.type == "cuda")
    print_table(res)
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        path = out / f"recompute_cost_{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}.json"
        path.write_text(json.dumps(res, indent=1))
        print(f"wrote {path}")
    return 0 if res["gradients"]["agree"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
