"""Mixed-length training on one 4-GPU host: hot switching against the best static plan and HotSPa's
hand strategies, on the code, web-like and uniform length distributions, at 16K and 32K contexts.

    # on the 4-GPU machine (NCCL; about 4-5 minutes, --budget-s caps it):
    NCCL_NVLS_ENABLE=0 python -m benchmarks.executor.mixed_length --out benchmarks/results
    # CI / a laptop: tiny model on 4 gloo ranks, seconds; measures nothing
    python -m benchmarks.executor.mixed_length --smoke --out /tmp/ml

For every context and distribution (``planner/varlen/data/<code|web>-<K>k.json``, measured by
``benchmarks.planner.length_distributions``, read as package data; ``uniform``: every sequence at the context):

* **hot** — the pool :func:`planner.varlen.propose.propose_pool` proposes (per-bucket plans from the
  planner's search, asymmetric ones included), cost-based assignment, hot switching within a step;
* **static** — the best single strategy of the same proposal (the planner's plan for the data, no
  switching: dispatch and packing only). Where the pool *is* that one strategy, ``hot`` is not run
  again: its row repeats the static measurement and says so;
* **hand** — HotSPa's hand strategies: ``<DP, TP, PP>`` = <4,1,1> for sequences up to context/4,
  <2,2,1> up to context/2, <1,4,1> above (16K/8K/4K buckets at 16K), home <4,1,1>, length thresholds.

Each method runs ``--warmup`` + ``--steps`` steps of ``--step-tokens`` tokens (synthetic tokens
with the distribution's lengths, the same sequences for every method) in one job of a
:class:`~tests.support.dist_testing.DistPool` of 4 ranks (rank ``r`` on GPU ``r``, as
``hetero_e2e``), layouts computed one step ahead on rank 0 (:mod:`executor.data.step_prefetch`);
working weights travel in bf16. Reported per method: tokens/s, seconds per step, switch seconds per
step, dispatch + packing seconds per step and its share of the step, how long training waited for
it, peak memory per GPU and the cost model's estimate of the same steps as laid out (the
proposal's own estimate is in the JSON as ``model_estimate_s``; for ``hand`` it is of the
planner's bucket plans, not HotSPa's). A method that fails (e.g. out of memory) is
reported as such and the others go on; a method that would start after ``--budget-s`` seconds is
skipped (said in the table). The JSON (device, versions, date) is rewritten after every method.
Targets (issue 15): hot >= 1.3x static on the long-tailed sets, >= 0.98x on uniform; dispatch +
packing <= 5 % of a step.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.executor.mixed_length_job import run_job

ROOT = Path(__file__).resolve().parents[2]
CLUSTER = ROOT / "examples" / "clusters" / "h100x4.yaml"
HAND = ("<4,1,1>", "<2,2,1>", "<1,4,1>")


def histogram(dist: str, context: int, smoke: bool):  # type: ignore[no-untyped-def]
    """The distribution's histogram at ``context`` (smoke: the 16K one scaled down to it)."""
    from planner.varlen.histogram import LengthHistogram
    from planner.varlen.measured import measured_histogram

    if dist == "uniform":
        return LengthHistogram.from_lengths([context], "uniform", context=context,
                                            source="every sequence at the context")
    if not smoke:
        return measured_histogram(f"{dist}-{context // 1024}k")
    base = measured_histogram(f"{dist}-16k")
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
    """{method: (pool, costs, assign, estimate_s, log)} for one context and distribution."""
    from planner.varlen.pool import Strategy, StrategyPool, strategy_costs
    from planner.varlen.propose import propose_pool

    prop = propose_pool(cluster, model, hist, args.step_tokens, time_limit_s=args.time_limit, profiles=profiles,
                        min_bucket=32 if args.smoke else 512)
    out: dict[str, Any] = {}
    static = StrategyPool(prop.pool.context, (prop.candidates[prop.static],), 0)
    out["static"] = (static, strategy_costs(static, cluster, profiles), "cost", prop.estimate["static_s"],
                     [f"static: {prop.candidates[prop.static].name}"])
    c = model.seq_len
    plans = hand_plans(model, [d.id for d in cluster.devices])
    hand = StrategyPool(c, tuple(Strategy(n, p) for n, p in zip(HAND, plans)), 0)
    costs = [replace(cost, bucket=b) for cost, b in zip(strategy_costs(hand, cluster, profiles), (c // 4, c // 2, c))]
    out["hand"] = (hand, costs, "threshold", prop.estimate["hand_buckets_s"], ["HotSPa <4,1,1> / <2,2,1> / <1,4,1>"])
    pool = prop.pool
    out["hot"] = (pool, strategy_costs(pool, cluster, profiles), "cost", prop.estimate["hot_switching_s"], prop.log)
    return out


def _label(context: int) -> str:
    return f"{context // 1024}K" if context % 1024 == 0 else str(context)


def _same(a, b) -> bool:  # type: ignore[no-untyped-def]
    return [s.name for s in a.strategies] == [s.name for s in b.strategies]


def _environment(smoke: bool) -> dict[str, Any]:
    import torch

    env: dict[str, Any] = {"date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "torch": torch.__version__,
                           "python": sys.version.split()[0], "host": os.uname().nodename}
    if not smoke:
        env.update(gpu=torch.cuda.get_device_name(0), devices=torch.cuda.device_count(),
                   cuda=torch.version.cuda, nccl=".".join(map(str, torch.cuda.nccl.version())))
    return env


def _line(key: str, r: dict[str, Any]) -> str:
    if "tokens_per_s" not in r:
        return f"{key:22s} {r.get('error') or r.get('skipped')}"
    return (f"{key:22s} {r['tokens_per_s']:>10,.0f} tok/s  {r['step_s']:.3f} s/step  switch {r['switch_s']:.3f} s  "
            f"dispatch {r['solve_s'] * 1e3:.1f} ms ({r['solve_s'] / r['step_s']:.1%})  wait {r['wait_s'] * 1e3:.1f} ms"
            f"  setup {r.get('setup_s', 0):.1f} s  {' + '.join(r['strategies'])}")


def table(runs: dict[str, dict[str, Any]]) -> str:
    """The results as a markdown table, one row per method."""
    rows = ["| context | lengths | method | strategies | tokens/s | s/step | vs static | switch s/step "
            "| dispatch ms (% of step) | estimated s/step | peak GiB |", "|---" * 11 + "|"]
    for key, r in runs.items():
        ctx, dist, method = key.split("/")
        strategies = " + ".join(r.get("strategies", []))
        if "tokens_per_s" not in r:
            rows.append(f"| {ctx} | {dist} | {method} | {strategies} | {r.get('error') or r.get('skipped')} "
                        "| | | | | | |")
            continue
        base = runs.get(f"{ctx}/{dist}/static", {})
        ratio = r["tokens_per_s"] / base["tokens_per_s"] if "tokens_per_s" in base else math.nan
        same = " (= static)" if r.get("same_as") else ""
        peak = max(r["peak_gib"]) if r.get("peak_gib") else math.nan
        rows.append(f"| {ctx} | {dist} | {method}{same} | {strategies} | {r['tokens_per_s']:,.0f} | {r['step_s']:.3f} "
                    f"| {ratio:.2f}x | {r['switch_s']:.3f} | {r['solve_s'] * 1e3:.1f} "
                    f"({r['solve_s'] / r['step_s']:.1%}) | {r['estimate_step_s']:.3f} | {peak:.1f} |")
    return "\n".join(rows)


def _args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--model", default="llama-1.3b")
    ap.add_argument("--contexts", type=int, nargs="+", default=[16384, 32768])
    ap.add_argument("--step-tokens", type=int, default=131072, dest="step_tokens")
    ap.add_argument("--steps", type=int, default=3, help="timed steps per method")
    ap.add_argument("--warmup", type=int, default=1, help="untimed steps per method first")
    ap.add_argument("--dists", nargs="+", default=["code", "web", "uniform"])
    ap.add_argument("--methods", nargs="+", default=["static", "hand", "hot"])
    ap.add_argument("--time-limit", type=float, default=10.0, dest="time_limit", help="planner seconds per proposal")
    ap.add_argument("--budget-s", type=float, default=280.0, dest="budget_s",
                    help="start no method after this many seconds minus the longest method so far "
                    "(the first always runs)")
    ap.add_argument("--no-wire-bf16", action="store_false", dest="wire_bf16",
                    help="send working weights in fp32 (default on GPUs: bf16, as HotSPa)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default="benchmarks/results")
    ap.add_argument("--smoke", "--cpu-smoke", action="store_true", dest="smoke",
                    help="tiny model, 4 gloo ranks, 2 steps per method: checks the program, measures nothing")
    args = ap.parse_args(argv)
    if args.smoke:
        args.model, args.contexts, args.step_tokens, args.steps, args.warmup = "tiny-8l", [256], 1024, 2, 0
        args.time_limit = min(args.time_limit, 5.0)
    return args


def main(argv: list[str] | None = None) -> int:
    args = _args(argv)
    t_start = time.perf_counter()
    if not args.smoke:  # the device machines need NVLink multicast off, in the ranks too
        os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
        os.environ.setdefault("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1")
    from planner.calibration.local import resolve_profiles
    from planner.cluster import load_cluster
    from planner.hf_config import resolve_model
    from tests.support.dist_testing import DistPool, DistributedError

    cluster = load_cluster(CLUSTER)
    profiles = resolve_profiles(cluster).profiles
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    tag = "cpu-smoke" if args.smoke else "gpu"
    path = out_dir / f"mixed_length_{tag}_{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}.json"
    results: dict[str, Any] = {"model": args.model, "contexts": args.contexts, "step_tokens": args.step_tokens,
                               "steps": args.steps, "warmup": args.warmup, "budget_s": args.budget_s, "runs": {}}
    runs: dict[str, dict[str, Any]] = results["runs"]
    longest = 0.0
    with DistPool(4, backend="gloo" if args.smoke else "nccl", timeout=300 if args.smoke else 180,
                  preload=("executor.switch.hot_switch",)) as dpool:
        for dist_name in args.dists:
            for ctx in args.contexts:
                model = resolve_model(args.model, ctx)
                hist = histogram(dist_name, ctx, args.smoke)
                todo = methods(args, model, hist, cluster, profiles)
                for method, (pool, costs, assign, est, log) in todo.items():
                    if method not in args.methods:
                        continue
                    key = f"{_label(ctx)}/{dist_name}/{method}"
                    info = {"strategies": [s.name for s in pool.strategies], "home": pool.home,
                            "model_estimate_s": est, "log": log}
                    static_key = f"{_label(ctx)}/{dist_name}/static"
                    if method == "hot" and static_key in runs and _same(pool, todo["static"][0]):
                        runs[key] = {**runs[static_key], **info, "same_as": "static"}
                    elif longest > 0 and time.perf_counter() - t_start + longest > args.budget_s:
                        runs[key] = {**info, "skipped": f"skipped: past --budget-s {args.budget_s:.0f}"}
                    else:
                        t0 = time.perf_counter()
                        try:
                            res = dpool.run(run_job, pool.to_dict(), costs, assign, hist.to_dict(), args.step_tokens,
                                            args.steps, args.warmup, args.seed, args.wire_bf16)[0]
                            runs[key] = {**res, **info}
                        except (DistributedError, TimeoutError) as exc:
                            lines = [ln for ln in str(exc).splitlines() if ln.strip()]
                            runs[key] = {**info, "error": f"failed: {lines[-1][:160] if lines else type(exc).__name__}"}
                        runs[key]["wall_s"] = time.perf_counter() - t0
                        longest = max(longest, runs[key]["wall_s"])
                    print(_line(key, runs[key]), flush=True)
                    results["environment"] = results.get("environment") or _environment(args.smoke)
                    results["wall_s"] = time.perf_counter() - t_start
                    path.write_text(json.dumps(results, indent=1, default=str) + "\n")
    print("\n" + table(runs))
    print(f"\n{results['environment']}\nwall {time.perf_counter() - t_start:.0f} s; wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
