"""Activation memory per layer, eager vs compiled blocks, against the planner's formula (issue 19).

On 4x H200 (llama2-7b, seq 4096, DP4 ZeRO-1, compiled blocks) ``max_memory_allocated`` grew by
17.9 GiB per extra sample of the micro-batch; the memory model says 29.6 GiB. Its per-layer terms
(:func:`planner.cost.memory.layer_activation_bytes` and the autocast weight copies,
:func:`planner.cost.memory.weight_copy_bytes`) were derived for the eager path. This program
measures, on one device in about a minute, what each path keeps for the backward.

It builds a middle stage of ``--layers`` blocks of ``--model`` with the executor's own module
(:class:`executor.model.llama.StageModule`: no embedding, no head, TP 1), fp32 parameters (the master
weights) and the forward under the engine's autocast (:func:`executor.profiler.compute.prepare`,
:func:`~executor.profiler.compute.autocast`); its input is the fp32 residual stream ``[b, s, h]``.
For each mode (eager, then the same blocks compiled by :func:`executor.model.fast_path.compile_blocks`)
and each micro-batch size ``b``: one warm-up forward + backward (compilation, cuBLAS workspaces,
the parameters' gradients), then one measured pass on CUDA::

    kept  = memory_allocated after the forward - before it
            (parameters, their gradients, the input and the output gradient allocated before)
    per layer   = (kept - output bytes + input bytes) / layers
    peak  = (max_memory_allocated during forward + backward - before) / layers

``per layer`` is what one layer keeps for its backward with its own input (the planner's
convention; layer 0's input is allocated before the forward, the stage output is no layer's),
beside ``layer_activation_bytes + weight_copy_bytes(layers=1)``. With two or more micro-batch sizes a
least-squares line ``fixed + b · per_sample`` splits what does not grow with the micro-batch (the
weight casts, the RoPE table casts) from the activations; ``per_sample × num_layers`` of the model
is the figure to set beside the 17.9 (measured) and 29.6 GiB (modelled).

In both modes :mod:`benchmarks.executor.saved_tensors` also counts what autograd saves (each
storage once; compiled blocks save through their compiled autograd function, which the hooks see
too) and lists layer 0's saved storages, the largest first: the data a formula is fitted to. On CPU,
where there is no ``memory_allocated``, that count is the measurement; compiled blocks run there
only when ``--modes`` names them (``compile_blocks(force=True)``, about a minute of compiling).

On CPU (torch 2.13, llama2-7b shapes at seq 256) the eager count equals the formula to the byte,
in fp32 and under CPU bf16 autocast (weight copies included); compiled blocks keep the weight
copies and 0.615 of the activations per sample under bf16 autocast (0.774 in fp32):
benchmarks/NOTES.md, "Activation memory".

    # on the GPU machine (one device, about a minute, most of it compiling; llama2-7b, seq 4096, 2 layers;
    # the JSON is rewritten after every row, so a run cut short keeps the eager rows):
    PYTHONPATH=. python -m benchmarks.executor.activation_memory --micro-batch 1,2 --out $OUT
    # CPU smoke (tiny model, fp32; tests/executor/test_bench_activation_memory.py):
    python -m benchmarks.executor.activation_memory --cpu-smoke --out /tmp/actmem
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

from benchmarks.executor.run_meta import run_versions
from benchmarks.executor.saved_tensors import breakdown, bytes_by_kind, forward_by_layer, record_saved
from executor.model import fast_path
from executor.model.llama import StageModule
from executor.profiler.compute import autocast, prepare
from planner.cost.memory import layer_activation_bytes, weight_copy_bytes
from planner.cost.params import DEFAULT_PARAMS, CostParams
from planner.model import PRESETS, ModelSpec

MIB = float(1 << 20)
GIB = float(1 << 30)


def planner_params(device: torch.device) -> CostParams:
    """Default CostParams, with the RMSNorm the executor runs on ``device`` (fused on CUDA only)."""
    return replace(DEFAULT_PARAMS, fused_rms_norm=device.type == "cuda")


def predicted(model: ModelSpec, micro_batch: int, dtype: str, params: CostParams = DEFAULT_PARAMS) -> dict[str, float]:
    """The planner's bytes per layer per micro-batch (TP 1, no recompute)."""
    act = layer_activation_bytes(model, micro_batch, 1, dtype, "none", model.seq_len, params)
    cast = weight_copy_bytes(model, layers=1, tp=1, last=False, dtype=dtype, params=params)
    return {"activation": act, "weight_cast": cast, "total": act + cast}


def _inputs(model: ModelSpec, b: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    x = torch.randn(b, model.seq_len, model.hidden_size, device=device, requires_grad=True)  # fp32 residual
    return x, torch.randn_like(x)


def _pass(stage: StageModule, x: torch.Tensor, dy: torch.Tensor, dtype: str) -> None:
    with autocast(dtype, x.device):
        out = stage(x)
    out.backward(dy)


def measure_allocated(stage: StageModule, model: ModelSpec, b: int, dtype: str, layers: int) -> dict[str, Any]:
    """CUDA: bytes kept by the forward and the peak of forward + backward, per layer (module docstring)."""
    x, dy = _inputs(model, b, torch.device("cuda", torch.cuda.current_device()))
    t0 = time.perf_counter()
    _pass(stage, x, dy, dtype)  # warm-up: compilation, workspaces, .grad of parameters and input
    torch.cuda.synchronize()
    warmup_s = time.perf_counter() - t0
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    with autocast(dtype, x.device):
        out = stage(x)
    torch.cuda.synchronize()
    kept = torch.cuda.memory_allocated() - base
    out_bytes, in_bytes = out.numel() * out.element_size(), x.numel() * x.element_size()
    out.backward(dy)
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated() - base
    del out
    left = torch.cuda.memory_allocated() - base
    return {"method": "allocated", "per_layer": (kept - out_bytes + in_bytes) / layers, "kept": kept,
            "peak_per_layer": peak / layers, "left_after_backward": left, "warmup_s": warmup_s}


def measure_saved(stage: StageModule, model: ModelSpec, b: int, dtype: str, device: torch.device,
                  compiled: bool) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """What autograd saves, per layer (each storage once), and layer 0's breakdown."""
    x, _ = _inputs(model, b, device)
    with record_saved(stage, name_ops=not compiled) as rec, autocast(dtype, device):
        out = forward_by_layer(stage, x, rec)
    del out
    saved = rec.saved
    keys = list(stage.layers.keys())
    kinds = [bytes_by_kind(saved, k) for k in keys]
    act = sum(k["activation"] for k in kinds) / len(keys)
    cast = sum(k["weight-cast"] for k in kinds) / len(keys)
    row = {"method": "saved-hooks", "per_layer": act + cast, "activation": act, "weight_cast": cast,
           "per_layer_each": [k["activation"] + k["weight-cast"] for k in kinds]}
    return row, breakdown(saved, keys[0])


def line(points: list[tuple[float, float]]) -> tuple[float, float]:
    """Least-squares ``y = fixed + slope · x``: (fixed, slope)."""
    n = len(points)
    mx, my = sum(p[0] for p in points) / n, sum(p[1] for p in points) / n
    slope = sum((x - mx) * (y - my) for x, y in points) / sum((x - mx) ** 2 for x, _ in points)
    return my - slope * mx, slope


def fits(rows: list[dict[str, Any]], num_layers: int) -> list[dict[str, Any]]:
    """Per (mode, method) with two or more micro-batch sizes: measured and planner lines per layer."""
    out = []
    for key in dict.fromkeys((r["mode"], r["method"]) for r in rows):
        sel = [r for r in rows if (r["mode"], r["method"]) == key]
        if len({r["micro_batch"] for r in sel}) < 2:
            continue
        fixed, slope = line([(r["micro_batch"], r["per_layer"]) for r in sel])
        pfixed, pslope = line([(r["micro_batch"], r["predicted"]["total"]) for r in sel])
        out.append({"mode": key[0], "method": key[1], "fixed_per_layer": fixed, "per_sample_per_layer": slope,
                    "planner_fixed_per_layer": pfixed, "planner_per_sample_per_layer": pslope,
                    "per_sample_ratio": slope / pslope, "per_sample_all_layers": slope * num_layers,
                    "planner_per_sample_all_layers": pslope * num_layers, "num_layers": num_layers})
    return out


def _mib(v: float | None) -> str:
    return "-" if v is None else f"{v / MIB:,.4g}"


def print_rows(rows: list[dict[str, Any]]) -> None:
    print("\n| mode | measured by | micro-batch | kept per layer MiB | planner act + cast MiB | ratio "
          "| peak fwd+bwd per layer MiB | left after bwd MiB |")
    print("|---|---|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        p = r["predicted"]
        print(f"| {r['mode']} | {r['method']} | {r['micro_batch']} | {_mib(r['per_layer'])} | "
              f"{_mib(p['activation'])} + {_mib(p['weight_cast'])} | {r['ratio']:.3f} | "
              f"{_mib(r.get('peak_per_layer'))} | {_mib(r.get('left_after_backward'))} |")


def print_fits(lines: list[dict[str, Any]]) -> None:
    if not lines:
        return
    print("\nper layer = fixed + micro-batch x per sample (least squares over the micro-batch sizes)")
    print("| mode | measured by | fixed MiB (measured / planner) | per sample MiB (measured / planner) | ratio "
          "| per sample x num_layers GiB (measured / planner) |")
    print("|---|---|---:|---:|---:|---:|")
    for f in lines:
        print(f"| {f['mode']} | {f['method']} | {_mib(f['fixed_per_layer'])} / {_mib(f['planner_fixed_per_layer'])} | "
              f"{_mib(f['per_sample_per_layer'])} / {_mib(f['planner_per_sample_per_layer'])} | "
              f"{f['per_sample_ratio']:.3f} | {f['per_sample_all_layers'] / GIB:.2f} / "
              f"{f['planner_per_sample_all_layers'] / GIB:.2f} (x{f['num_layers']}) |")


def print_breakdown(mode: str, entries: list[dict[str, Any]], tokens: int, hidden: int, top: int,
                    formula: float) -> None:
    total = sum(e["bytes"] for e in entries)
    print(f"\nwhat {mode} layer 0 saves for its backward, one row per storage ({tokens} tokens): "
          f"{total / MIB:,.4g} MiB, the planner {formula / MIB:,.4g} MiB (x{total / formula:.4f})")
    print("| saved by | kind | first saved as | dtype | MiB | B/token | B/token/h |")
    print("|---|---|---|---|---:|---:|---:|")
    new = [e for e in entries if e["kind"] != "weight"]
    for e in new[:top]:
        per_tok = e["bytes"] / tokens
        print(f"| {e['saved_by']} | {e['kind']} | {e['shape']} | {e['dtype']} | {_mib(e['bytes'])} | "
              f"{per_tok:,.1f} | {per_tok / hidden:.3f} |")
    if len(new) > top:
        rest = sum(e["bytes"] for e in new[top:])
        print(f"| ({len(new) - top} more) | | | | {_mib(rest)} | {rest / tokens:,.1f} | |")
    print(f"(and {len(entries) - len(new)} parameter or buffer storages, saved as they are: no new bytes)")


def _positive_ints(text: str) -> list[int]:
    vals = [int(v) for v in text.split(",") if v.strip()]
    if not vals or min(vals) < 1:
        raise ValueError(text)
    return vals


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--model", default="llama2-7b", help=f"preset: {', '.join(PRESETS)}")
    ap.add_argument("--seq-len", type=int, default=4096)
    ap.add_argument("--micro-batch", default="1,2", help="comma list of micro-batch sizes (samples)")
    ap.add_argument("--layers", type=int, default=2, help="transformer blocks in the stage")
    ap.add_argument("--dtype", default="bf16", choices=("bf16", "fp32"), help="the plan's options.dtype")
    ap.add_argument("--modes", default=None,
                    help="comma list of eager, compiled (default: both on CUDA, eager on CPU; compiled on CPU "
                         "forces compile_blocks, about a minute of compiling)")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--top", type=int, default=24, help="rows of the saved-tensor breakdowns")
    ap.add_argument("--cpu-smoke", action="store_true", help="tiny model, 2 layers, fp32 on CPU: checks the program")
    ap.add_argument("--out", default="benchmarks/results")
    args = ap.parse_args(argv)
    if args.cpu_smoke:
        args.model, args.seq_len, args.layers, args.dtype, args.device = "tiny", 32, 2, "fp32", "cpu"
    try:
        mbs = _positive_ints(args.micro_batch)
    except ValueError:
        print(f"error: --micro-batch {args.micro_batch!r} is not a comma list of positive integers", file=sys.stderr)
        return 2
    device = torch.device(args.device)
    gpu = device.type == "cuda"
    modes = [m for m in (args.modes or ("eager,compiled" if gpu else "eager")).split(",") if m]
    problems = [msg for bad, msg in (
        (args.model not in PRESETS, f"--model {args.model!r} is not one of {', '.join(PRESETS)}"),
        (args.layers < 1 or args.seq_len < 1, "--layers and --seq-len must be >= 1"),
        (not modes or any(m not in ("eager", "compiled") for m in modes), "--modes takes eager and/or compiled"),
        (not gpu and args.dtype != "fp32", "on CPU the engine computes in fp32: pass --dtype fp32"),
    ) if bad]
    if problems:
        print(f"error: {problems[0]}", file=sys.stderr)
        return 2
    if gpu:
        device = torch.device("cuda", torch.cuda.current_device() if device.index is None else device.index)
        torch.cuda.set_device(device)
    model = replace(PRESETS[args.model], seq_len=args.seq_len)
    stage = prepare(StageModule(model, layers=(0, args.layers), first=False, last=False, tp=1, tp_rank=0,
                                group=None, device=device), args.dtype, device)

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    path = out / f"activation_memory_{'cpu_smoke' if args.cpu_smoke else device.type}_{stamp}.json"
    meta = dict(run_versions(gpu), device=torch.cuda.get_device_name(device) if gpu else "cpu",
                cuda=torch.version.cuda, attention=fast_path.attention_kernel_name(device, model.head_dim),
                model=model.to_dict(), seq_len=model.seq_len, layers=args.layers, micro_batches=mbs,
                dtype=args.dtype, modes=modes, planner_numerics={k: getattr(planner_params(device), k) for k in (
                    "fp32_residual", "autocast_weight_copies", "expand_kv_heads", "fused_rms_norm")},
                argv=sys.argv[1:] if argv is None else argv)
    rows: list[dict[str, Any]] = []
    result: dict[str, Any] = dict(meta, rows=rows, fits=[], breakdowns={})

    def save() -> None:  # after every row: a run cut short still leaves what it measured
        result["fits"] = fits(rows, PRESETS[args.model].num_layers)
        path.write_text(json.dumps(result, indent=1) + "\n")

    for mode in modes:
        compiled = mode == "compiled"
        if compiled:
            fast_path.compile_blocks(stage, head=False, force=True)
        for b in mbs:
            pred = predicted(model, b, args.dtype, planner_params(device))
            found = [measure_allocated(stage, model, b, args.dtype, args.layers)] if gpu else []
            if compiled and not gpu:  # the warm-up measure_allocated does on CUDA: compilation
                _pass(stage, *_inputs(model, b, device), args.dtype)
            saved_row, entries = measure_saved(stage, model, b, args.dtype, device, compiled)
            found.append(saved_row)
            if mode not in result["breakdowns"]:
                result["breakdowns"][mode] = {"micro_batch": b, "layer": 0, "entries": entries}
                print_breakdown(mode, entries, b * model.seq_len, model.hidden_size, args.top, pred["total"])
            for row in found:
                rows.append(dict(row, mode=mode, micro_batch=b, predicted=pred, ratio=row["per_layer"] / pred["total"]))
                save()
            for p in stage.parameters():  # the next micro-batch size starts without this one's gradients
                p.grad = None
    save()
    print_rows(rows)
    print_fits(result["fits"])
    print(f"\n{meta['device']}, torch {meta['torch']}, attention {meta['attention']}; JSON {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
