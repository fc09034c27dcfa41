"""Our executor against torchtitan and Megatron-Core: same model, sequence, batch, precision, FLOPs.

Usage (on a 4-GPU machine, from the repository root, with the peers' wheels importable)::

    python -m benchmarks.executor.peers --out $OUT                 # every config below, in order
    python -m benchmarks.executor.peers --configs ours-1,titan-1 --out $OUT
    .venv/bin/python -m benchmarks.executor.peers --cpu-smoke       # ours only, tiny, gloo

Configurations (each in fresh processes, one per GPU, NCCL; the same random tokens for all):

* ``*-1``: one GPU, ``llama-1.3b`` (``--model-1``), seq 4096, 8 samples per step in micro-batches of 2.
* ``*-4``: four GPUs, ``llama2-7b`` (``--model-4``), seq 4096, 16 samples per step.
* ``ours``: our executor, compiled blocks; on 4 GPUs the planner's plan (``hexiscale plan --compile``:
  the memory model counts compiled blocks' activations) for a 4-GPU cluster file of this machine's
  GPU type written by this program, memory capped at 85 % of the card.
* ``titan``: torchtitan (see :mod:`peer_titan`); ``titan-4`` FSDP2 over 4, ``titan-4-tp2`` FSDP2 x TP2.
* ``mcore``: Megatron-Core (see :mod:`peer_mcore`); ``mcore-4-tpX-ppY`` with DP the rest.
* ``-mbZ``: micro-batches of Z samples instead of the default (``--micro-batch-1/4``); a peer's
  best homogeneous config is the fastest of those measured (more memory per micro-batch, fewer
  FSDP gathers or pipeline steps). Ours takes the planner's micro-batches on 4 GPUs.
* ours only, last: ``-base`` runs without the issue-33 paths (the unchunked cross-entropy with
  its fp32 logits, :mod:`executor.model.chunked_loss`; autocast's weight cast per micro-batch,
  :mod:`executor.model.cast_once`), ``-noce`` / ``-nocast`` without one of them, so one run compares
  them: ``ours-1,ours-1-base,titan-1``. Configs that differ only in this suffix share one plan.

Every system: bf16 compute over fp32 master weights, fp32 gradient reduction, AdamW
(betas 0.9/0.95, weight decay 0.1), clipping at 1.0, no activation recompute unless a config says
so. FLOPs/token ``6·N + 12·L·h·s`` (:meth:`planner.model.ModelSpec.model_flops_per_token`), MFU
against 989 TFLOP/s; tokens/s from the median step time after warm-up steps (compilation happens
there). A config that fails is reported as such and the run goes on.

The residual stream: ours keeps it fp32 unless ``--residual bf16`` (the plan's
``options.residual_dtype``: bf16 inside each stage, as Megatron-Core computes by default and
torchtitan does under FSDP2's bf16 parameters; torchtitan on one GPU runs AMP, an fp32 residual).
``benchmarks/executor/residual_quality.py`` compares the two on real text.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime as dt
import json
import platform
import re
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

from benchmarks.executor import mfu  # also sets the NCCL multicast variables (read when NCCL starts)
from benchmarks.executor.device_gaps import format_gaps  # noqa: E402
from executor.job.spawn import free_port, spawn  # noqa: E402
from planner.model import PRESETS, ModelSpec  # noqa: E402
from planner.plan import Plan, load_plan  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
DEFAULT = ("ours-1,ours-1-base,titan-1,mcore-1,ours-4,ours-4-base,titan-4-mb2,titan-4-tp2-mb2,mcore-4-tp1-pp1,"
           "mcore-4-tp2-pp1-mb2,mcore-4-tp1-pp2")
MEMORY_CAP = 0.85


@dataclass(frozen=True)
class Job:
    system: str  # ours | titan | mcore
    gpus: int
    tp: int
    pp: int
    model: ModelSpec
    batch: int  # samples per step, all ranks together
    micro_batch: int
    steps: int
    warmup: int
    cuda: bool
    plan_path: str = ""  # ours: the plan (made by the driver)
    fixed_micro: int = 0  # ours on 4 GPUs: micro-batches of this many samples instead of the planner's
    profile: str = ""  # a file for one extra, profiled step's kernel table (rank 0), or none
    residual: str = "fp32"  # ours: the plan's options.residual_dtype (fp32, or the compute dtype)
    chunked_loss: bool = True  # ours: executor.model.chunked_loss (False: the unchunked cross-entropy)
    cast_once: bool = True  # ours: executor.model.cast_once (False: autocast's cast per micro-batch)


# ours' config suffix -> (chunked_loss, cast_once)
PATHS = {"": (True, True), "base": (False, False), "noce": (False, True), "nocast": (True, False)}
_CONFIG = re.compile(r"(ours|titan|mcore)-(\d+)(?:-tp(\d+))?(?:-pp(\d+))?(?:-mb(\d+))?(?:-(base|noce|nocast))?")


def parse_config(name: str) -> tuple[str, int, int, int, int]:
    """``system-gpus[-tpX][-ppY][-mbZ]`` -> (system, gpus, tp, pp, micro-batch or 0 for the default)."""
    m = _CONFIG.fullmatch(name)
    if not m:
        raise ValueError(f"config {name!r}: expected ours|titan|mcore-GPUS[-tpX][-ppY][-mbZ][-base|-noce|-nocast]")
    if m[6] and m[1] != "ours":
        raise ValueError(f"config {name!r}: -{m[6]} switches our executor's paths: use it on an ours-... config")
    return m[1], int(m[2]), int(m[3] or 1), int(m[4] or 1), int(m[5] or 0)


def ours_paths(name: str) -> tuple[bool, bool]:
    """``(chunked_loss, cast_once)`` of a config name (both on without a suffix)."""
    m = _CONFIG.fullmatch(name)
    return PATHS[(m[6] if m else None) or ""]


# ------------------------------------------------------------------------------ our plans


def cluster_yaml(gpu_key: str, memory_gib: float) -> str:
    devices = "".join(f'  "n:{i}": {{memory_gib: {memory_gib:.0f}}}\n' for i in range(4))
    link = "{kind: nvlink, bandwidth_GBps: 450, latency_us: 10}"
    return (f"name: {gpu_key}-x4\nnodes:\n  - {{name: n, gpu: {gpu_key}, gpus: 4, intra_link: {link}}}\n"
            f"inter_node: {link}\ndevices:\n{devices}")


def plan_for(job: Job, out: Path) -> Path:
    """Our plan for ``job``: one stage on one GPU, or the planner's plan for 4 GPUs of this type."""
    path = out / f"peers_plan_{job.gpus}gpu.json"
    if job.gpus == 1:
        plan = mfu.build_plan("1gpu", mfu.Setup(model=job.model, batch=job.batch, micro_batch=job.micro_batch,
                                                steps=0, warmup=0, cuda=job.cuda, compile=True, profile=(), out=""))
        from planner.plan import save_plan

        if job.cuda:
            plan = dataclasses.replace(plan, options=dataclasses.replace(plan.options, residual_dtype=job.residual))
        save_plan(plan, path)
        return path
    name = torch.cuda.get_device_name(0) if job.cuda else "cpu"
    key = "h200-measured" if "H200" in name else "h100-sxm-measured"
    cap = MEMORY_CAP * torch.cuda.get_device_properties(0).total_memory / 2**30 if job.cuda else 8
    cluster = out / "peers_cluster.yaml"
    cluster.write_text(cluster_yaml(key, cap))
    cmd = [sys.executable, "-m", "hexiscale", "plan", str(cluster), "--model", job.model.name, "--global-batch",
           str(job.batch), "--seq-len", str(job.model.seq_len), "-o", str(path)]
    if job.cuda:  # ours compiles its blocks on GPUs: the planner counts compiled activations (options.compile)
        cmd += ["--compile", "--residual-dtype", job.residual]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)
    print(proc.stdout[-3000:], proc.stderr[-2000:], flush=True)
    if proc.returncode != 0:
        raise RuntimeError(f"hexiscale plan failed (exit {proc.returncode})")
    if job.fixed_micro:  # the planner's layout, other micro-batches (what the cost model chose against)
        from planner.plan import save_plan

        plan = load_plan(path)
        pipes = tuple(dataclasses.replace(p, micro_batches=p.batch_size // job.fixed_micro) for p in plan.pipelines)
        path = out / f"peers_plan_{job.gpus}gpu_mb{job.fixed_micro}.json"
        save_plan(dataclasses.replace(plan, pipelines=pipes), path)
    return path


# ------------------------------------------------------------------------------ workers


def _loop(job: Job, device: torch.device, rank: int) -> Any:
    s = mfu.Setup(model=job.model, batch=job.batch, micro_batch=job.micro_batch, steps=job.steps,
                  warmup=job.warmup, cuda=job.cuda, compile=False, profile=(), out="")

    def run(step: Any) -> dict[str, Any]:
        if job.cuda:
            torch.cuda.reset_peak_memory_stats(device)
        losses, times = mfu._timed_loop(step, s, device)  # noqa: SLF001 - the shared timing loop
        out = {"losses": losses, "times": times, "peak_mem_gib": mfu._memory(device)}  # noqa: SLF001
        if job.profile:  # every rank steps (the step communicates); rank 0 keeps the table
            out["profile"] = mfu._profile(step, device, Path(job.profile) if rank == 0 else None)  # noqa: SLF001
        return out

    return run


def _rows(job: Job, rank: int, world: int) -> torch.Tensor:
    """This rank's samples: the global batch split over data-parallel groups (TP/PP peers share)."""
    tokens = mfu.batch_tokens(job.model, job.batch)
    dp = world // (job.tp * job.pp)
    if job.system == "mcore":  # Megatron's rank order: TP fastest, then DP, then PP
        dp_rank = (rank // job.tp) % dp
    else:  # torchtitan's mesh: [dp_shard, tp], TP fastest
        dp_rank = rank // job.tp
    share = job.batch // dp
    return tokens[dp_rank * share:(dp_rank + 1) * share].contiguous()


def _ours(job: Job, rank: int, device: torch.device) -> dict[str, Any]:
    from executor.model import fast_path
    from executor.parallel.groups import ProcessGroups
    from executor.train.engine import Engine
    from executor.train.optim import OptimConfig
    from planner.layout import build_topology

    plan: Plan = load_plan(job.plan_path)
    topo = build_topology(plan)
    engine = Engine(plan, topo, ProcessGroups.create(topo), device=device,
                    optim=OptimConfig(lr=3e-4, warmup_steps=2, fused=True if job.cuda else None), seed=0)
    engine.module.chunked_loss, engine.module.cast_once = job.chunked_loss, job.cast_once
    compiled = fast_path.compile_blocks(engine.module) if job.cuda else 0
    pipe = plan.pipelines[engine.stage.pipeline]
    offset = sum(p.batch_size for p in plan.pipelines[:engine.stage.pipeline])
    rows = mfu.batch_tokens(plan.model, plan.global_batch_size)[offset:offset + pipe.batch_size].contiguous()
    if job.cuda:
        rows = rows.pin_memory()
    out = _loop(job, device, rank)(lambda: engine.train_step(rows).loss)
    out.update({"compiled_blocks": compiled, "attention": fast_path.attention_kernel_name(device, plan.model.head_dim),
                "paths": {"chunked_loss": job.chunked_loss, "cast_once": job.cast_once,
                          "weight_copies_made": engine.module.weight_copies.copies_made},
                "config": {"plan": [[{"devices": list(st.devices), "layers": list(st.layers)} for st in p.stages]
                                    + [{"batch": p.batch_size, "micro_batches": p.micro_batches}]
                                    for p in plan.pipelines], "options": dataclasses.asdict(plan.options)}})
    return out


def _worker(rank: int, world: int, job: Job, port: int, result_dir: str) -> None:
    try:
        device = torch.device("cuda", rank) if job.cuda else torch.device("cpu")
        if job.cuda:
            torch.cuda.set_device(rank)
        dist.init_process_group("nccl" if job.cuda else "gloo", init_method=f"tcp://127.0.0.1:{port}",
                                rank=rank, world_size=world, device_id=device if job.cuda else None)
        try:
            if job.system == "ours":
                res = _ours(job, rank, device)
            elif job.system == "titan":
                from benchmarks.executor.peer_titan import titan_worker

                res = titan_worker(job.model, rank=rank, world=world, tp=job.tp, rows=_rows(job, rank, world),
                                   micro_batch=job.micro_batch, compile=job.cuda, ac="none", device=device,
                                   loop=_loop(job, device, rank))
            else:
                from benchmarks.executor.peer_mcore import mcore_worker

                res = mcore_worker(job.model, tp=job.tp, pp=job.pp, rows=_rows(job, rank, world),
                                   micro_batch=job.micro_batch, device=device, loop=_loop(job, device, rank))
        finally:
            dist.destroy_process_group()
    except Exception:  # noqa: BLE001 - reported in the results table, the run goes on
        res = {"error": traceback.format_exc()[-2500:]}
    Path(result_dir, f"rank{rank}.json").write_text(json.dumps(res, default=str))


def run_job(name: str, job: Job, timeout_s: float) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        codes = spawn(_worker, job.gpus, (job.gpus, job, free_port(), tmp), timeout=timeout_s, check=False)
        ranks = []
        for r in range(job.gpus):
            f = Path(tmp, f"rank{r}.json")
            ranks.append(json.loads(f.read_text()) if f.exists() else {"error": f"no result (exit {codes[r]})"})
    errors = [r["error"] for r in ranks if "error" in r]
    if errors:
        return {"config": name, "gpus": job.gpus, "error": errors[0]}
    return summarize(name, job, ranks)


def summarize(name: str, job: Job, ranks: list[dict[str, Any]]) -> dict[str, Any]:
    m = job.model
    tokens = job.batch * m.seq_len
    step_times = [max(r["times"][i] for r in ranks) for i in range(len(ranks[0]["times"]))]
    t = statistics.median(step_times)
    tflops = tokens / t * m.model_flops_per_token() / job.gpus / 1e12
    losses = next((r["losses"] for r in ranks if r["losses"][0] != 0.0), ranks[0]["losses"])
    return {"config": name, "system": job.system, "gpus": job.gpus, "model": m.name, "global_batch": job.batch,
            "micro_batch": job.micro_batch, "tokens_per_step": tokens, "step_time_s": round(t, 4),
            "step_times_s": [round(x, 4) for x in step_times], "tokens_per_s": round(tokens / t, 1),
            "tflops_per_gpu": round(tflops, 1), "mfu": round(tflops / mfu.H100_PEAK_TFLOPS, 4),
            "peak_mem_gib": [round(r["peak_mem_gib"], 2) for r in ranks], "loss_first": round(losses[0], 4),
            "loss_last": round(losses[-1], 4), "attention": ranks[0].get("attention"),
            "setup": ranks[0].get("config"), "profile": ranks[0].get("profile"), "paths": ranks[0].get("paths"),
            "versions": {k: ranks[0][k] for k in ("torchtitan", "megatron_core") if k in ranks[0]}}


def ratios(results: list[dict[str, Any]]) -> dict[str, float]:
    """Ours over each peer's best config, per GPU count; and each ours config over its ``-base``
    twin (the issue-33 paths against the old ones, same run)."""
    out: dict[str, float] = {}
    ok = [r for r in results if "error" not in r]
    by_name = {r.get("config"): r for r in ok}
    for name, r in by_name.items():
        base = by_name.get(f"{name}-base")
        if r.get("system") == "ours" and base is not None:
            out[f"{name}_over_{name}-base"] = round(r["tokens_per_s"] / base["tokens_per_s"], 3)
    for gpus in sorted({r["gpus"] for r in ok}):
        best = {}
        for r in ok:
            if r["gpus"] == gpus and r["tokens_per_s"] > best.get(r["system"], {}).get("tokens_per_s", 0):
                best[r["system"]] = r
        if "ours" in best:
            for peer in ("titan", "mcore"):
                if peer in best:
                    out[f"ours_over_{peer}_{gpus}gpu"] = round(best["ours"]["tokens_per_s"]
                                                               / best[peer]["tokens_per_s"], 3)
    return out


def print_table(results: list[dict[str, Any]], extra: dict[str, float]) -> None:
    print(f"\n{'config':<18}{'gpus':>5}{'tok/s':>10}{'TFLOP/s/gpu':>13}{'MFU':>8}{'peak GiB':>22}{'step s':>9}"
          f"{'loss0->N':>17}")
    for r in results:
        if "error" in r:
            print(f"{r['config']:<18}{r['gpus']:>5}  ERROR: {r['error'].strip().splitlines()[-1][:100]}")
            continue
        mem = "/".join(f"{x:.1f}" for x in r["peak_mem_gib"])
        print(f"{r['config']:<18}{r['gpus']:>5}{r['tokens_per_s']:>10.0f}{r['tflops_per_gpu']:>13.1f}"
              f"{100 * r['mfu']:>7.1f}%{mem:>22}{r['step_time_s']:>9.3f}"
              f"{r['loss_first']:>8.3f}->{r['loss_last']:<7.3f}")
    for k, v in extra.items():
        print(f"  {k}: {v}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--configs", default=DEFAULT,
                    help="comma list of ours|titan|mcore-GPUS[-tpX][-ppY][-mbZ], ours-... also [-base|-noce|-nocast]")
    ap.add_argument("--model-1", default="llama-1.3b")
    ap.add_argument("--model-4", default="llama2-7b")
    ap.add_argument("--batch-1", type=int, default=8)
    ap.add_argument("--batch-4", type=int, default=16)
    ap.add_argument("--micro-batch-1", type=int, default=2)
    ap.add_argument("--micro-batch-4", type=int, default=1)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--timeout", type=float, default=240.0, help="seconds per config")
    ap.add_argument("--out", default="benchmarks/results")
    ap.add_argument("--profile", default="", help="comma list of configs to profile one extra step of")
    ap.add_argument("--cpu-smoke", action="store_true", help="ours only, tiny model, gloo")
    ap.add_argument("--residual", default="fp32", choices=("fp32", "bf16"),
                    help="ours: the residual stream's dtype (plan options.residual_dtype)")
    args = ap.parse_args(argv)
    configs = [c.strip() for c in args.configs.split(",") if c.strip()]
    try:
        parsed = {c: parse_config(c) for c in configs}
    except ValueError as e:
        ap.error(str(e))
    cuda = torch.cuda.is_available() and not args.cpu_smoke
    if not cuda and not args.cpu_smoke:
        ap.error("no CUDA device: use --cpu-smoke")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    stamp = dt.datetime.now(dt.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    json_path = out / f"executor_peers_{'cpu-smoke' if args.cpu_smoke else 'gpu'}_{stamp}.json"
    meta = {"benchmark": "executor_peers", "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
            "gpu": torch.cuda.get_device_name(0) if cuda else "cpu", "gpu_count": torch.cuda.device_count(),
            "torch": torch.__version__, "cuda": torch.version.cuda, "python": sys.version.split()[0],
            "host": platform.node(), "flops_formula": "6*N + 12*L*h*s (planner.model)",
            "peak_tflops_per_gpu": mfu.H100_PEAK_TFLOPS, "timed_steps": args.steps, "warmup_steps": args.warmup,
            "ours_residual_dtype": args.residual}
    results: list[dict[str, Any]] = []
    plans: dict[tuple[Any, ...], str] = {}
    for name, (system, gpus, tp, pp, mb) in parsed.items():
        if args.cpu_smoke and system != "ours":
            continue
        model = PRESETS[args.model_1 if gpus == 1 else args.model_4]
        batch, micro = (args.batch_1, args.micro_batch_1) if gpus == 1 else (args.batch_4, args.micro_batch_4)
        chunked_loss, cast_once = ours_paths(name)
        job = Job(system, gpus, tp, pp, model, batch, mb or micro, args.steps, args.warmup, cuda,
                  fixed_micro=mb if system == "ours" and gpus > 1 else 0, residual=args.residual,
                  chunked_loss=chunked_loss, cast_once=cast_once,
                  profile=str(out / f"profile_peers_{name}.txt") if name in args.profile.split(",") else "")
        if args.cpu_smoke:
            job = replace(job, model=replace(PRESETS["tiny"], num_layers=4), batch=4 * gpus, micro_batch=2,
                          steps=2, warmup=1)
        t0 = time.monotonic()
        print(f"[{name}] running ...", flush=True)
        try:
            if system == "ours":  # one plan for the configs that differ only in their paths
                key = (gpus, job.fixed_micro, job.residual, job.model.name, job.batch, job.micro_batch)
                plans[key] = plans.get(key) or str(plan_for(job, out))
                job = replace(job, plan_path=plans[key])
            res = run_job(name, job, args.timeout)
        except Exception:  # noqa: BLE001 - recorded, the run goes on
            res = {"config": name, "gpus": gpus, "error": traceback.format_exc()[-2500:]}
        res["wall_s"] = round(time.monotonic() - t0, 1)
        results.append(res)
        status = res["error"] if "error" in res else f"{res['tokens_per_s']:.0f} tok/s, MFU {100 * res['mfu']:.1f}%"
        print(f"[{name}] {status} ({res['wall_s']} s)", flush=True)
        json_path.write_text(json.dumps({**meta, "results": results, "ratios": ratios(results)}, indent=1))
    for r in results:
        if r.get("profile"):
            print(f"\nprofile of {r['config']} (one step, rank 0): ms by category {r['profile']['category_ms']}")
            for kname, ms in r["profile"]["top_kernels_ms"]:
                print(f"  {ms:>9.2f} ms  {kname}")
            if r["profile"].get("device_gaps"):
                print(format_gaps(r["profile"]["device_gaps"]))
    print_table(results, ratios(results))
    print(f"\nwrote {json_path}")
    return 1 if any("error" in r for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
