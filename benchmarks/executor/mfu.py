"""Executor throughput and MFU on GPUs, against a Hugging Face baseline measured in the same run.

Usage (on a GPU machine, from the repository root)::

    python -m benchmarks.executor.mfu --configs hf,1gpu,1gpu-compile --out $OUT
    python -m benchmarks.executor.mfu --configs hf,1gpu,tp2,pp2,dp2,asym --compile --out $OUT
    .venv/bin/python -m benchmarks.executor.mfu --cpu-smoke          # tiny shapes, gloo, CPU

Every configuration runs in fresh processes (one per GPU, NCCL), trains the same model on the same
random token batch, and reports tokens/s, TFLOP/s per GPU, MFU and peak memory.

FLOPs per token (the same for every system, :meth:`planner.model.ModelSpec.model_flops_per_token`)::

    F = 6·N + 12·L·h·s        N = parameters in matrix multiplies (all but the embedding table)

MFU = tokens/s · F / (GPUs · peak), peak = 989 TFLOP/s (H100 SXM bf16 dense, no sparsity).
Tokens/s uses the median step time of the timed steps (after warm-up steps that include any
compilation). Recompute is not counted as useful work.

Configurations (``--batch B`` samples per pipeline, ``--micro-batch m`` samples per micro-batch):

* ``hf``: transformers ``LlamaForCausalLM`` (SDPA attention), fp32 weights, bf16 autocast, fused
  AdamW, gradient accumulation over the same micro-batches, the same clipping — 1 GPU.
* ``1gpu`` / ``1gpu-compile``: the executor ``Engine`` on a one-stage plan, eager / compiled blocks.
* ``tp2``: one pipeline, one stage of TP 2. ``pp2``: one pipeline, stages of 12 + 12 layers, 1F1B,
  micro-batches of 1. ``dp2``: two pipelines of one GPU (global batch 2B). ``asym``: an asymmetric
  stage split, 13 + 11 layers (the LM head's work on the last stage balances the extra layer).
  With ``--compile`` these compile their blocks too; a compiled config that fails is re-run
  eagerly and marked so (``compile_error``).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import statistics
import sys
import tempfile
import time
import traceback
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

# Keep NVLink multicast off (the device machines require it), also in spawned workers.
os.environ["NCCL_NVLS_ENABLE"] = "0"
os.environ["TORCH_SYMM_MEM_DISABLE_MULTICAST"] = "1"
os.environ["NVSHMEM_DISABLE_NVLS"] = "1"

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

from benchmarks.executor.device_gaps import format_gaps, gaps_of_file  # noqa: E402
from executor.job.spawn import free_port, spawn  # noqa: E402
from planner.model import PRESETS, ModelSpec  # noqa: E402
from planner.plan import Pipeline, Plan, PlanOptions, Stage  # noqa: E402

H100_PEAK_TFLOPS = 989.0
CONFIGS = ("hf", "1gpu", "1gpu-compile", "tp2", "pp2", "dp2", "asym")


@dataclass(frozen=True)
class Setup:
    model: ModelSpec
    batch: int  # samples per pipeline
    micro_batch: int
    steps: int
    warmup: int
    cuda: bool
    compile: bool  # compile blocks (and a TP-1 loss head) in the 2-GPU configs
    profile: tuple[str, ...]  # configs to profile one extra step of
    out: str  # directory for profile tables


# ------------------------------------------------------------------------------ plans


def _pipe(batch: int, micro: int, stages: list[tuple[list[str], tuple[int, int]]]) -> Pipeline:
    return Pipeline(batch_size=batch, micro_batches=micro,
                    stages=tuple(Stage(tuple(d), len(d), rng) for d, rng in stages))


def build_plan(config: str, s: Setup) -> Plan:
    """The plan of ``config`` (see the module docstring)."""
    m, b = s.model, s.batch
    n = m.num_layers
    micro = max(1, b // s.micro_batch)
    if config in ("1gpu", "1gpu-compile"):
        pipes = [_pipe(b, micro, [(["g:0"], (0, n))])]
    elif config == "tp2":
        pipes = [_pipe(b, micro, [(["g:0", "g:1"], (0, n))])]
    elif config in ("pp2", "asym"):
        cut = n // 2 if config == "pp2" else n // 2 + max(1, n // 24)
        pipes = [_pipe(b, b, [(["g:0"], (0, cut)), (["g:1"], (cut, n))])]
    elif config == "dp2":
        pipes = [_pipe(b, micro, [(["g:0"], (0, n))]), _pipe(b, micro, [(["g:1"], (0, n))])]
    else:
        raise ValueError(f"no plan for config {config!r}")
    return Plan(model=m, global_batch_size=sum(p.batch_size for p in pipes), pipelines=tuple(pipes),
                options=PlanOptions(recompute="none", zero=0, dtype="bf16" if s.cuda else "fp32"))


def compiles(config: str, s: Setup) -> bool:
    """Whether ``config`` runs with compiled blocks under ``s``."""
    return config == "1gpu-compile" or (s.compile and config not in ("hf", "1gpu"))


def world_of(config: str) -> int:
    return 1 if config in ("hf", "1gpu", "1gpu-compile") else 2


def batch_tokens(model: ModelSpec, rows: int, seed: int = 1234) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(0, model.vocab_size, (rows, model.seq_len + 1), generator=gen)


# ------------------------------------------------------------------------------ timing helpers


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _timed_loop(step: Any, s: Setup, device: torch.device) -> tuple[list[float], list[float]]:
    """Run warm-up then timed steps; returns (losses, step times in s)."""
    losses, times = [], []
    for i in range(s.warmup + s.steps):
        _sync(device)
        t0 = time.perf_counter()
        losses.append(step())  # returns a host float: the step's only host sync
        _sync(device)
        if i >= s.warmup:
            times.append(time.perf_counter() - t0)
    return losses, times


def _profile(step: Any, device: torch.device, path: Path | None) -> dict[str, Any]:
    """One step under torch.profiler: top kernels by device time and a category breakdown (the
    table goes to ``path`` unless None). Every rank of a job must run it: the step communicates."""
    from torch.profiler import ProfilerActivity, profile

    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with profile(activities=acts) as prof:
        step()
        _sync(device)
    gaps = None
    if path is not None and device.type == "cuda":  # where the GPU waited (benchmarks.executor.device_gaps)
        trace = path.with_suffix(".trace.json")
        prof.export_chrome_trace(str(trace))
        gaps = gaps_of_file(trace)
        path.with_suffix(".gaps.txt").write_text(format_gaps(gaps) + "\n")
        trace.unlink()
    table = ""
    for sort in (("self_device_time_total", "self_cuda_time_total") if device.type == "cuda" else ("cpu_time_total",)):
        try:
            table = prof.key_averages().table(sort_by=sort, row_limit=30)
            break
        except (KeyError, AttributeError, ValueError):
            continue
    if path is not None:
        path.write_text(table)
    cats = {"gemm": 0.0, "attention": 0.0, "nccl": 0.0, "optimizer": 0.0, "other": 0.0}
    agg: dict[str, float] = {}
    for row in prof.key_averages():
        # Device kernels are the rows with device time and no CPU time of their own; the CPU ops
        # that launch them repeat that device time (skipped: no double count), and so do the
        # user ranges ("Optimizer.step#...") and the launch-queue marker "Command Buffer Full".
        us = float(getattr(row, "self_device_time_total", 0.0) or getattr(row, "self_cuda_time_total", 0.0) or 0.0)
        # "nccl:all_reduce"-style rows are ranges that repeat their ncclDevKernel's time
        if us <= 0.0 or row.self_cpu_time_total > 0 or "#" in row.key or row.key.startswith(
                ("Command Buffer", "ProfilerStep", "nccl:")):
            continue
        low = row.key.lower()
        if "nccl" in low:
            cat = "nccl"
        elif any(k in low for k in ("flash", "fmha", "cudnn", "attention", "attn", "sdpa")):
            cat = "attention"
        elif any(k in low for k in ("gemm", "xmma", "cutlass", "nvjet", "sm90_", "cublas")):
            cat = "gemm"
        elif "adam" in low or "multi_tensor" in low:
            cat = "optimizer"
        else:
            cat = "other"
        cats[cat] += us
        agg[row.key] = agg.get(row.key, 0.0) + us
    total = sum(cats.values()) or 1.0
    return {"table_file": path.name if path else None, "device_gaps": gaps,
            "category_ms": {k: round(v / 1e3, 2) for k, v in cats.items()},
            "category_share": {k: round(v / total, 3) for k, v in cats.items()},
            "top_kernels_ms": [(n[:90], round(us / 1e3, 2)) for n, us in
                               sorted(agg.items(), key=lambda kv: -kv[1])[:15]]}


def _memory(device: torch.device) -> float:
    return torch.cuda.max_memory_allocated(device) / 2**30 if device.type == "cuda" else 0.0


# ------------------------------------------------------------------------------ workers


def _hf_worker(s: Setup) -> dict[str, Any]:
    import torch.nn.functional as F
    import transformers
    from transformers import LlamaConfig, LlamaForCausalLM

    device = torch.device("cuda", 0) if s.cuda else torch.device("cpu")
    m = s.model
    cfg = LlamaConfig(vocab_size=m.vocab_size, hidden_size=m.hidden_size, intermediate_size=m.ffn_hidden_size,
                      num_hidden_layers=m.num_layers, num_attention_heads=m.num_heads,
                      num_key_value_heads=m.num_kv_heads, max_position_embeddings=m.seq_len,
                      rms_norm_eps=m.norm_eps, rope_theta=m.rope_theta, tie_word_embeddings=False,
                      attention_bias=False, mlp_bias=False, use_cache=False)
    cfg._attn_implementation = "sdpa"
    torch.manual_seed(0)
    with device:
        model = LlamaForCausalLM(cfg)
    model.train()
    params = list(model.parameters())
    opt = torch.optim.AdamW(params, lr=3e-4, betas=(0.9, 0.95), weight_decay=0.1, fused=s.cuda or None)
    tokens = batch_tokens(m, s.batch)
    if s.cuda:
        tokens = tokens.pin_memory()
    scale = 1.0 / (s.batch * m.seq_len)

    def step() -> float:
        opt.zero_grad(set_to_none=True)
        dev_tokens = tokens.to(device, non_blocking=True)
        total = torch.zeros((), device=device)
        for row in range(0, s.batch, s.micro_batch):
            chunk = dev_tokens[row:row + s.micro_batch]
            with torch.autocast(device.type, dtype=torch.bfloat16, enabled=s.cuda):
                logits = model(input_ids=chunk[:, :-1], use_cache=False).logits
                loss = F.cross_entropy(logits.float().flatten(0, 1), chunk[:, 1:].flatten(), reduction="sum") * scale
            loss.backward()
            total += loss.detach()
        torch.nn.utils.clip_grad_norm_(params, 1.0, foreach=True)
        opt.step()
        return float(total.item())

    losses, times = _timed_loop(step, s, device)
    out = {"losses": losses, "times": times, "peak_mem_gib": _memory(device),
           "transformers": transformers.__version__, "attention": "hf sdpa (torch default order)"}
    if "hf" in s.profile:
        out["profile"] = _profile(step, device, Path(s.out) / "profile_hf.txt")
    return out


def _engine_worker(config: str, s: Setup, rank: int) -> dict[str, Any]:
    from executor.model import fast_path
    from executor.parallel.groups import ProcessGroups
    from executor.train.engine import Engine
    from executor.train.optim import OptimConfig
    from planner.layout import build_topology

    device = torch.device("cuda", rank) if s.cuda else torch.device("cpu")
    plan = build_plan(config, s)
    topo = build_topology(plan)
    groups = ProcessGroups.create(topo)
    engine = Engine(plan, topo, groups, device=device,
                    optim=OptimConfig(lr=3e-4, warmup_steps=2, fused=True if s.cuda else None), seed=0)
    compiled = fast_path.compile_blocks(engine.module) if compiles(config, s) else 0
    pipe = plan.pipelines[engine.stage.pipeline]
    offset = sum(p.batch_size for p in plan.pipelines[:engine.stage.pipeline])
    rows = batch_tokens(plan.model, plan.global_batch_size)[offset:offset + pipe.batch_size].contiguous()
    if s.cuda:
        rows = rows.pin_memory()

    def step() -> float:
        return engine.train_step(rows).loss

    losses, times = _timed_loop(step, s, device)
    out: dict[str, Any] = {"losses": losses, "times": times, "peak_mem_gib": _memory(device),
                           "compiled_blocks": compiled,
                           "attention": fast_path.attention_kernel_name(device, plan.model.head_dim)}
    if config in s.profile:  # all ranks step; rank 0 keeps the table
        out["profile"] = _profile(step, device, Path(s.out) / f"profile_{config}.txt" if rank == 0 else None)
    return out


def _worker(rank: int, world: int, config: str, s: Setup, port: int, result_dir: str) -> None:
    try:
        if s.cuda:
            torch.cuda.set_device(rank)
        if config == "hf":
            res = _hf_worker(s)
        else:
            dist.init_process_group("nccl" if s.cuda else "gloo", init_method=f"tcp://127.0.0.1:{port}",
                                    rank=rank, world_size=world,
                                    device_id=torch.device("cuda", rank) if s.cuda else None)
            try:
                res = _engine_worker(config, s, rank)
            finally:
                dist.destroy_process_group()
    except Exception:  # noqa: BLE001 - reported in the results table, the run goes on
        res = {"error": traceback.format_exc()[-2000:]}
    Path(result_dir, f"rank{rank}.json").write_text(json.dumps(res))


def run_config(config: str, s: Setup, timeout_s: float) -> dict[str, Any]:
    """Run ``config`` in fresh processes; merge the ranks' results."""
    world = 1 if config == "hf" else world_of(config)
    with tempfile.TemporaryDirectory() as tmp:
        codes = spawn(_worker, world, (world, config, s, free_port(), tmp), timeout=timeout_s, check=False)
        ranks = []
        for r in range(world):
            f = Path(tmp, f"rank{r}.json")
            ranks.append(json.loads(f.read_text()) if f.exists() else {"error": "no result (crashed or hung)"})
    hung = [r for r, c in enumerate(codes) if c is None]
    if hung:
        ranks = [{"error": f"ranks {hung} stopped: past {timeout_s:.0f} s, or after another rank crashed "
                  f"(exit codes {codes})"}]
    errors = [r["error"] for r in ranks if "error" in r]
    if errors and config != "1gpu-compile" and compiles(config, s):
        # a compiled multi-GPU config that fails is measured again eagerly, and says so
        print(f"[{config}] compiled run failed, running it eagerly:\n{errors[0]}", flush=True)
        res = run_config(config, replace(s, compile=False), timeout_s)
        res["compile_error"] = errors[0][-600:]
        return res
    if errors:
        return {"config": config, "gpus": world, "error": errors[0]}
    return summarize(config, s, world, ranks)


def summarize(config: str, s: Setup, world: int, ranks: list[dict[str, Any]]) -> dict[str, Any]:
    m = s.model
    pipelines = 2 if config == "dp2" else 1
    tokens = s.batch * pipelines * m.seq_len
    # a step ends when the slowest rank ends: take the max over ranks of each step's time
    step_times = [max(r["times"][i] for r in ranks) for i in range(len(ranks[0]["times"]))]
    t = statistics.median(step_times)
    tps = tokens / t
    fpt = m.model_flops_per_token()
    tflops = tps * fpt / world / 1e12
    r0 = ranks[0]
    losses = next((r["losses"] for r in ranks if r["losses"][0] != 0.0), r0["losses"])
    out = {"config": config, "gpus": world, "global_batch": s.batch * pipelines, "micro_batch": s.micro_batch,
           "tokens_per_step": tokens, "step_time_s": round(t, 4), "step_times_s": [round(x, 4) for x in step_times],
           "tokens_per_s": round(tps, 1), "tflops_per_gpu": round(tflops, 1),
           "mfu": round(tflops / H100_PEAK_TFLOPS, 4), "peak_mem_gib": [round(r["peak_mem_gib"], 2) for r in ranks],
           "loss_first": round(losses[0], 4), "loss_last": round(losses[-1], 4),
           "attention": r0.get("attention"), "compiled_blocks": r0.get("compiled_blocks", 0)}
    if "transformers" in r0:
        out["transformers"] = r0["transformers"]
    if "profile" in r0:
        out["profile"] = r0["profile"]
    if config != "hf":
        plan = build_plan(config, s)
        out["plan"] = [[{"devices": list(st.devices), "layers": list(st.layers)} for st in p.stages]
                       + [{"batch": p.batch_size, "micro_batches": p.micro_batches}] for p in plan.pipelines]
    return out


def attention_bench(m: ModelSpec, b: int) -> dict[str, Any]:
    """Median fwd+bwd time of causal SDPA per backend at ``[b, heads, seq, head_dim]`` bf16."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    dev = torch.device("cuda", 0)
    shape = (b, m.num_heads, m.seq_len, m.head_dim)
    q, k, v = (torch.randn(shape, device=dev, dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
    grad = torch.randn(shape, device=dev, dtype=torch.bfloat16)
    flops = 12.0 * b * m.seq_len ** 2 * m.hidden_size  # fwd 4·b·s²·h + bwd 8·b·s²·h (no causal halving)
    out: dict[str, Any] = {}
    for backend in (SDPBackend.CUDNN_ATTENTION, SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION):
        try:
            times = []
            for i in range(8):
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                with sdpa_kernel([backend]):
                    o = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
                o.backward(grad)
                end.record()
                torch.cuda.synchronize(dev)
                if i >= 2:
                    times.append(start.elapsed_time(end))
            ms = statistics.median(times)
            out[backend.name.lower()] = {"ms": round(ms, 3), "tflops": round(flops / ms / 1e9, 1)}
        except Exception as exc:  # noqa: BLE001 - a backend that cannot run is reported, not fatal
            out[backend.name.lower()] = {"error": str(exc).splitlines()[0][:120]}
        q.grad = k.grad = v.grad = None
    return out


# ------------------------------------------------------------------------------ report


def derived(results: list[dict[str, Any]]) -> dict[str, float]:
    by = {r["config"]: r for r in results if "error" not in r}
    out: dict[str, float] = {}
    if "hf" in by:
        for c in ("1gpu", "1gpu-compile"):
            if c in by:
                out[f"{c}_over_hf"] = round(by[c]["tokens_per_s"] / by["hf"]["tokens_per_s"], 3)
    one = max((by[c]["tokens_per_s"] for c in ("1gpu", "1gpu-compile") if c in by), default=0.0)
    one_cfg = "1gpu-compile" if by.get("1gpu-compile", {}).get("tokens_per_s", -1) == one else "1gpu"
    for c in ("dp2", "tp2", "pp2", "asym"):
        if c in by and one:
            # scaling efficiency: per-GPU throughput against the best 1-GPU run of this invocation
            out[f"{c}_scaling_vs_{one_cfg}"] = round(by[c]["tokens_per_s"] / (2 * one), 3)
    return out


def print_table(results: list[dict[str, Any]], extra: dict[str, float]) -> None:
    print(f"\n{'config':<14}{'gpus':>5}{'tok/s':>11}{'TFLOP/s/gpu':>13}{'MFU':>8}{'peak GiB':>14}"
          f"{'step s':>9}{'loss0->N':>17}  attention")
    for r in results:
        if "error" in r:
            print(f"{r['config']:<14}{r['gpus']:>5}  ERROR: {r['error'].strip().splitlines()[-1][:90]}")
            continue
        mem = "/".join(f"{x:.1f}" for x in r["peak_mem_gib"])
        print(f"{r['config']:<14}{r['gpus']:>5}{r['tokens_per_s']:>11.0f}{r['tflops_per_gpu']:>13.1f}"
              f"{100 * r['mfu']:>7.1f}%{mem:>14}{r['step_time_s']:>9.3f}"
              f"{r['loss_first']:>8.3f}->{r['loss_last']:<7.3f}  {r['attention']}"
              f"{', compiled' if r['compiled_blocks'] else ''}")
    for k, v in extra.items():
        print(f"  {k}: {v}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--configs", default="hf,1gpu,1gpu-compile", help=f"comma list of {', '.join(CONFIGS)}")
    ap.add_argument("--model", default="llama-1.3b", help="preset name (planner.model.PRESETS)")
    ap.add_argument("--batch", type=int, default=8, help="samples per pipeline per step")
    ap.add_argument("--micro-batch", type=int, default=2, help="samples per micro-batch")
    ap.add_argument("--steps", type=int, default=5, help="timed steps")
    ap.add_argument("--warmup", type=int, default=2, help="untimed steps first (compilation happens here)")
    ap.add_argument("--compile", action="store_true", help="compile blocks in the 2-GPU configs (tp 1 stages)")
    ap.add_argument("--profile", default="", help="comma list of configs to profile one extra step of")
    ap.add_argument("--attention-bench", action="store_true",
                    help="also time causal SDPA forward+backward per backend at the model's shape")
    ap.add_argument("--timeout", type=float, default=300.0, help="seconds per config before it is killed")
    ap.add_argument("--out", default="benchmarks/results", help="directory for the JSON and profile tables")
    ap.add_argument("--tag", default="", help="suffix of the JSON file name")
    ap.add_argument("--cpu-smoke", action="store_true", help="tiny model on CPU (gloo) to check the script")
    args = ap.parse_args(argv)

    configs = [c.strip() for c in args.configs.split(",") if c.strip()]
    bad = [c for c in configs if c not in CONFIGS]
    if bad:
        ap.error(f"unknown configs {bad}; choose from {', '.join(CONFIGS)}")
    cuda = torch.cuda.is_available() and not args.cpu_smoke
    model = PRESETS[args.model]
    if args.cpu_smoke:
        model = replace(PRESETS["tiny"], num_layers=4)
        args.batch, args.micro_batch, args.steps, args.warmup = 4, 2, 2, 1
    elif not cuda:
        ap.error("no CUDA device: use --cpu-smoke")
    if cuda and torch.cuda.device_count() < max(world_of(c) for c in configs):
        ap.error(f"configs {configs} need {max(world_of(c) for c in configs)} GPUs, "
                 f"found {torch.cuda.device_count()}")
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    s = Setup(model=model, batch=args.batch, micro_batch=args.micro_batch, steps=args.steps, warmup=args.warmup,
              cuda=cuda, compile=args.compile,
              profile=tuple(c for c in args.profile.split(",") if c), out=str(out_dir))
    meta = {
        "benchmark": "executor_mfu", "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "gpu": torch.cuda.get_device_name(0) if cuda else platform.processor() or "cpu",
        "gpu_count": torch.cuda.device_count() if cuda else 0, "torch": torch.__version__,
        "cuda": torch.version.cuda, "python": sys.version.split()[0], "host": platform.node(),
        "model": model.to_dict(), "seq_len": model.seq_len, "batch_per_pipeline": s.batch,
        "micro_batch": s.micro_batch, "timed_steps": s.steps, "warmup_steps": s.warmup,
        "flops_per_token": model.model_flops_per_token(), "flops_formula": "6*N + 12*L*h*s (planner.model)",
        "peak_tflops_per_gpu": H100_PEAK_TFLOPS, "precision": "bf16 autocast, fp32 master weights/grads/Adam",
    }
    stamp = dt.datetime.now(dt.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    json_path = out_dir / f"executor_mfu_{'cpu-smoke' if args.cpu_smoke else 'gpu'}{args.tag}_{stamp}.json"
    results: list[dict[str, Any]] = []
    for config in configs:
        t0 = time.monotonic()
        print(f"[{config}] running ...", flush=True)
        res = run_config(config, s, args.timeout)
        res["wall_s"] = round(time.monotonic() - t0, 1)
        results.append(res)
        status = "error" if "error" in res else f"{res['tokens_per_s']:.0f} tok/s, MFU {100 * res['mfu']:.1f}%"
        print(f"[{config}] {status} ({res['wall_s']} s)", flush=True)
        if "error" in res:
            print(res["error"], flush=True)
        json_path.write_text(json.dumps({**meta, "results": results, "derived": derived(results)}, indent=1))
    extra = derived(results)
    attn = attention_bench(model, s.micro_batch) if args.attention_bench and cuda else {}
    if attn:
        json_path.write_text(json.dumps({**meta, "results": results, "derived": extra, "attention_bench": attn},
                                        indent=1))
    for r in results:
        if "profile" in r:
            p = r["profile"]
            print(f"\nprofile of {r['config']} (one step): ms by category {p['category_ms']}")
            for name, ms in p["top_kernels_ms"]:
                print(f"  {ms:>9.2f} ms  {name}")
    if attn:
        print("\ncausal SDPA fwd+bwd at the model's shape (ms; TFLOP/s counted as 12·b·s²·h, the formula's term):")
        for name, v in attn.items():
            print(f"  {name:<20} {v}")
    print_table(results, extra)
    print(f"\nwrote {json_path}")
    return 1 if any("error" in r for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
