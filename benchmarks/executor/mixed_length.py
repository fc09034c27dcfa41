"""Mixed-length training on one 4-GPU host: hot switching against the best static plan and HotSPa's
hand strategies, on the code, web-like and uniform length distributions.

    python -m benchmarks.executor.mixed_length                 # the GPU machine (4 GPUs, NCCL)
    python -m benchmarks.executor.mixed_length --cpu-smoke     # tiny shapes on 4 gloo ranks (CI)

For every distribution (``benchmarks/results/lengths/<code|web>-<K>k.json``, measured by
``benchmarks.planner.length_distributions``; ``uniform``: every sequence at the context):

* **hot** — the pool :func:`planner.varlen.propose.propose_pool` proposes (per-bucket plans from the
  planner's search, asymmetric ones included), cost-based assignment, hot switching;
* **static** — the best single strategy of the same proposal (the planner's plan for the data, no
  switching: one plan, dispatch and packing only);
* **hand** — HotSPa's hand strategies: ``<DP, TP, PP>`` = <4,1,1> for sequences up to context/4,
  <2,2,1> up to context/2, <1,4,1> above, home <4,1,1>, length thresholds.

Each runs ``--warmup`` + ``--steps`` steps of ``--step-tokens`` tokens (synthetic tokens with the
distribution's lengths; the same sequences for every method), layouts computed one step ahead
on rank 0 (:mod:`executor.step_prefetch`). Reported per method: tokens/s, seconds per step, switch
seconds per step, dispatch + packing seconds per step (and its share of the step), the time the
trainer waited for it, peak memory, and the cost model's estimate. Writes JSON (device, versions,
date) and prints the table of ``benchmarks/README.md``. Targets (issue 15): hot >= 1.3x static on
the long-tailed sets, >= 0.98x on uniform; dispatch + packing <= 5 % of a step.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
LENGTHS = ROOT / "benchmarks" / "results" / "lengths"
CLUSTER = ROOT / "examples" / "clusters" / "h100x4.yaml"


def histogram(dist: str, context: int, smoke: bool):  # type: ignore[no-untyped-def]
    """The distribution's histogram at ``context`` (smoke: the 16K one scaled down to it)."""
    from planner.varlen.histogram import LengthHistogram, load_histogram

    if dist == "uniform":
        return LengthHistogram.from_lengths([context], "uniform", context=context,
                                            source="every sequence at the context")
    if not smoke:
        return load_histogram(LENGTHS / f"{dist}-{context // 1024}k.json")
    base = load_histogram(LENGTHS / f"{dist}-16k.json")
    rng = np.random.Generator(np.random.PCG64(0))
    scaled = [max(1, round(s * context / 16384)) for s in base.sample(4000, rng)]
    return LengthHistogram.from_lengths(scaled, f"{dist}-scaled", context=context, source=f"{base.name} scaled")


def hand_plans(model, devices: list[str]):  # type: ignore[no-untyped-def]
    """HotSPa's <4,1,1>, <2,2,1>, <1,4,1> on four devices (ZeRO-1 where there are pipelines)."""
    from planner.plan import Pipeline, Plan, PlanOptions, Stage

    L = model.num_layers

    def plan(dp: int, tp: int) -> Plan:
        pipes = tuple(Pipeline(1, 1, (Stage(tuple(devices[i * tp:(i + 1) * tp]), tp, (0, L)),)) for i in range(dp))
        return Plan(model, dp, pipes, PlanOptions(zero=1 if dp > 1 else 0))
    return [plan(4, 1), plan(2, 2), plan(1, 4)]


def methods(args: argparse.Namespace, model, hist, cluster, profiles) -> dict[str, Any]:  # type: ignore[no-untyped-def]
    """{method: (plans, home, costs, assign, estimate_s)} for one distribution."""
    from planner.varlen.pool import Strategy, StrategyPool, strategy_costs
    from planner.varlen.propose import propose_pool

    prop = propose_pool(cluster, model, hist, args.step_tokens, time_limit_s=args.time_limit, profiles=profiles,
                        min_bucket=32 if args.cpu_smoke else 512)
    out: dict[str, Any] = {}
    pool = prop.pool
    out["hot"] = (pool, strategy_costs(pool, cluster, profiles), "cost", prop.estimate["hot_switching_s"], prop.log)
    static = StrategyPool(pool.context, (prop.candidates[prop.static],), 0)
    out["static"] = (static, strategy_costs(static, cluster, profiles), "cost", prop.estimate["static_s"],
                     [f"static: {prop.candidates[prop.static].name}"])
    c = model.seq_len
    names = ("<4,1,1>", "<2,2,1>", "<1,4,1>")
    plans = hand_plans(model, [d.id for d in cluster.devices])
    hand = StrategyPool(c, tuple(Strategy(n, p) for n, p in zip(names, plans)), 0)
    costs = [replace(cost, bucket=b) for cost, b in zip(strategy_costs(hand, cluster, profiles), (c // 4, c // 2, c))]
    out["hand"] = (hand, costs, "threshold", prop.estimate["hand_buckets_s"], ["HotSPa <4,1,1> / <2,2,1> / <1,4,1>"])
    return out


def run_job(pool_dict: dict[str, Any], costs: list[Any], assign: str, hist_dict: dict[str, Any], step_tokens: int,
            steps: int, warmup: int, seed: int, wire_bf16: bool) -> dict[str, Any] | None:
    """On every rank: ``warmup + steps`` hot-switching steps of ``pool`` (one strategy = static)."""
    import torch
    import torch.distributed as dist

    from executor.doc_source import SyntheticDocs
    from executor.fast_path import synchronize
    from executor.hot_switch import HotSwitchEngine, switch_groups
    from executor.optim import OptimConfig
    from executor.step_prefetch import LayoutStream
    from planner.varlen.histogram import histogram_from_dict
    from planner.varlen.pool import pool_from_dict

    pool = pool_from_dict(pool_dict)
    plans = [s.plan for s in pool.strategies]
    rank = dist.get_rank()
    cuda = dist.get_backend() == "nccl"
    device = torch.device("cuda", torch.cuda.current_device()) if cuda else torch.device("cpu")
    groups = switch_groups(plans, pool.home)
    eng = HotSwitchEngine(plans, pool.home, groups, device=device, seed=seed,
                          optim=OptimConfig(lr=1e-4, min_lr=1e-5, warmup_steps=2, total_steps=max(2, steps + warmup)),
                          wire_dtype=torch.bfloat16 if (cuda and wire_bf16) else None)
    source = SyntheticDocs(histogram_from_dict(hist_dict), pool.context, pool.model.vocab_size, seed=seed)
    stream = LayoutStream(source, costs, step_tokens=step_tokens, group=groups.layouts, assign=assign, seed=seed)
    rows = []
    if cuda:
        torch.cuda.reset_peak_memory_stats(device)
    for k in range(warmup + steps):
        plan = stream.next()
        synchronize(device)
        t0 = time.perf_counter()
        st = eng.train_step(plan.docs, plan.layout, global_tokens=plan.docs.label_tokens, timed=True)
        synchronize(device)
        rows.append({"step": k, "s": time.perf_counter() - t0, "tokens": plan.docs.label_tokens,
                     "sequences": len(plan.docs), "phases": len(plan.layout.phases), "switch_s": st.switch_s,
                     "solve_s": plan.solve_s, "wait_s": plan.wait_s, "loss": st.step.loss,
                     "estimate_s": plan.layout.time_s})
    peak = torch.cuda.max_memory_allocated(device) / 2**30 if cuda else float("nan")
    peaks = [torch.tensor([peak], device=device)]
    if dist.get_world_size() > 1:
        gathered = [torch.zeros(1, device=device) for _ in range(dist.get_world_size())]
        dist.all_gather(gathered, peaks[0])
        peaks = gathered
    del eng
    groups.close()
    if rank != 0:
        return None
    timed = rows[warmup:]
    tot_s = sum(r["s"] for r in timed)
    return {"steps": rows, "tokens_per_s": sum(r["tokens"] for r in timed) / tot_s, "step_s": tot_s / len(timed),
            "switch_s": float(np.mean([r["switch_s"] for r in timed])), "solve_s": float(np.mean([r["solve_s"]
                                                                                                  for r in timed])),
            "wait_s": float(np.mean([r["wait_s"] for r in timed])), "peak_gib": [float(p.item()) for p in peaks],
            "estimate_step_s": float(np.mean([r["estimate_s"] for r in timed]))}


def _environment(smoke: bool) -> dict[str, Any]:
    import torch

    env: dict[str, Any] = {"date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "torch": torch.__version__,
                           "python": sys.version.split()[0]}
    if not smoke:
        env.update(gpu=torch.cuda.get_device_name(0), devices=torch.cuda.device_count(),
                   nccl=".".join(map(str, torch.cuda.nccl.version())))
    return env


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="llama-1.3b")
    ap.add_argument("--context", type=int, default=32768)
    ap.add_argument("--step-tokens", type=int, default=131072, dest="step_tokens")
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--dists", nargs="+", default=["code", "web", "uniform"])
    ap.add_argument("--methods", nargs="+", default=["static", "hand", "hot"])
    ap.add_argument("--time-limit", type=float, default=20.0, dest="time_limit", help="planner seconds per proposal")
    ap.add_argument("--no-wire-bf16", action="store_false", dest="wire_bf16",
                    help="send working weights in fp32 (default on GPUs: bf16, as HotSPa)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default="benchmarks/results")
    ap.add_argument("--cpu-smoke", action="store_true", dest="cpu_smoke",
                    help="tiny model, 4 gloo ranks, 2 steps: checks the program, measures nothing")
    args = ap.parse_args(argv)
    if args.cpu_smoke:
        args.model, args.context, args.step_tokens, args.steps, args.warmup = "tiny-8l", 256, 1024, 2, 0
        args.time_limit = min(args.time_limit, 5.0)
    from planner.calibration.local import resolve_profiles
    from planner.cluster import load_cluster
    from planner.model import resolve_model
    from planner.varlen.pool import StrategyPool
    from tests.support.dist_testing import DistPool

    model = resolve_model(args.model, args.context)
    cluster = load_cluster(CLUSTER)
    profiles = resolve_profiles(cluster).profiles
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    results: dict[str, Any] = {"environment": _environment(args.cpu_smoke), "model": args.model,
                               "context": args.context, "step_tokens": args.step_tokens, "steps": args.steps,
                               "warmup": args.warmup, "runs": {}}
    backend = "gloo" if args.cpu_smoke else "nccl"
    with DistPool(4, backend=backend, timeout=1800, preload=("executor.hot_switch",)) as dpool:
        for dist_name in args.dists:
            hist = histogram(dist_name, args.context, args.cpu_smoke)
            for method, (pool, costs, assign, est, log) in methods(args, model, hist, cluster, profiles).items():
                if method not in args.methods:
                    continue
                assert isinstance(pool, StrategyPool)
                res = dpool.run(run_job, pool.to_dict(), costs, assign, hist.to_dict(), args.step_tokens, args.steps,
                                args.warmup, args.seed, args.wire_bf16)[0]
                res.update(strategies=[s.name for s in pool.strategies], home=pool.home, model_estimate_s=est, log=log)
                results["runs"][f"{dist_name}/{method}"] = res
                print(f"{dist_name:8s} {method:6s} {res['tokens_per_s']:>12,.0f} tok/s  {res['step_s']:.3f} s/step  "
                      f"switch {res['switch_s']:.3f} s  dispatch {res['solve_s'] * 1e3:.1f} ms  "
                      f"({res['solve_s'] / res['step_s']:.1%})  wait {res['wait_s'] * 1e3:.1f} ms  "
                      f"{res['strategies']}", flush=True)
    print("\n| distribution | method | strategies | tokens/s | s/step | vs static | switch s/step | dispatch ms "
          "(% of step) | estimated s/step |\n|---|---|---|---|---|---|---|---|---|")
    for key, r in results["runs"].items():
        dist_name, method = key.split("/")
        base = results["runs"].get(f"{dist_name}/static")
        ratio = r["tokens_per_s"] / base["tokens_per_s"] if base else math.nan
        strategies = " + ".join(r["strategies"])
        print(f"| {dist_name} | {method} | {strategies} | {r['tokens_per_s']:,.0f} | {r['step_s']:.3f} "
              f"| {ratio:.2f}x | {r['switch_s']:.3f} | {r['solve_s'] * 1e3:.1f} "
              f"({r['solve_s'] / r['step_s']:.1%}) | {r['model_estimate_s']:.3f} |")
    tag = "cpu-smoke" if args.cpu_smoke else "gpu"
    path = out_dir / f"mixed_length_{tag}_{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}.json"
    path.write_text(json.dumps(results, indent=1, default=str) + "\n")
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
