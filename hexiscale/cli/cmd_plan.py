"""``hexiscale plan CLUSTER --model NAME|config.json --global-batch-size N``: search the best plan.

Prints the plan table, the cost model's estimate (step time, tokens/s, MFU, breakdown,
bottleneck) and the seed-style flags of the plan (up to ``SEED_FLAGS_CHARS`` characters, else their
length; ``--seed-flags`` prints them whatever their length: on an 8,192-GPU cluster they run to
100 KB); ``-o`` writes the plan (estimate, the calibration of each GPU type and of each node used embedded);
``--explain`` adds the search log (structures, settings, local-search steps, finalists) and the
estimate's per-stage tables; ``--plot DIR`` writes the plan map and the simulated step as PNGs.
The search is :func:`planner.search.planner.search`. With ``--lengths HISTOGRAM --step-tokens N``
it proposes a strategy pool for mixed-length data instead (:mod:`hexiscale.cli.plan_lengths`).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from typing import TYPE_CHECKING

from hexiscale.cli.flag_names import GLOBAL_BATCH, add_global_batch, typed
from hexiscale.cli.output import console, plan_table, styled
from hexiscale.cli.pictures import PLAN_MAP, SIMULATED, write_pictures
from hexiscale.cli.writing import check_writable, writing
from planner.cluster import load_cluster
from planner.cost import estimate
from planner.errors import SpecError
from planner.hf_config import resolve_model
from planner.plan import MAX_GLOBAL_BATCH, plan_to_dict, save_plan
from planner.ranges import check_int, check_number
from planner.seed_flags import plan_to_flags

if TYPE_CHECKING:
    from planner.search.planner import SearchProgress

SEED_FLAGS_CHARS = 4000


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser("plan", help="search the best plan for a model on a cluster")
    p.add_argument("cluster", help="cluster file (YAML)")
    p.add_argument("--model", required=True, help="model preset name or a Hugging Face config.json")
    add_global_batch(p, "samples per step, the total over every pipeline")
    p.add_argument("--seq-len", type=int, dest="seq_len", help="sequence length (default: the model's)")
    p.add_argument("-o", "--output", help="write the plan (with its estimate) to this JSON file")
    p.add_argument("--objective", default="throughput", choices=("throughput",), help="what to optimise")
    p.add_argument("--time-limit", type=float, default=30.0, dest="time_limit",
                   help="wall seconds for the whole command (default 30; it usually ends sooner): past it the "
                   "best plan found so far is returned, with a note")
    p.add_argument("--seed", type=int, default=0, help="seed of the partitioner and the local search")
    p.add_argument("--explain", action="store_true", help="print the search log and per-stage estimate")
    p.add_argument("--json", action="store_true", help="print the plan as JSON instead of tables")
    p.add_argument("--seed-flags", action="store_true", dest="seed_flags",
                   help=f"print the seed-style flags whatever their length (default: up to {SEED_FLAGS_CHARS:,} "
                   "characters)")
    p.add_argument("--plot", metavar="DIR", help=f"write {PLAN_MAP} and {SIMULATED} (the simulated step) to DIR")
    p.add_argument("--lengths", help="mixed-length data: a length histogram (hexiscale.lengths/1 JSON) or "
                   "synthetic:NAME; proposes a strategy pool per length bucket (-o writes the pool)")
    p.add_argument("--step-tokens", type=int, dest="step_tokens", help="with --lengths: tokens per step")
    p.add_argument("--compile", action="store_true",
                   help="the plan's blocks run compiled (options.compile; `hexiscale train` compiles them on "
                   "CUDA): the memory model counts the compiled path's smaller activations")
    p.add_argument("--residual-dtype", default="fp32", choices=("fp32", "bf16"), dest="residual_dtype",
                   help="the residual stream inside each stage (options.residual_dtype): fp32 (default), or bf16 "
                   "like Megatron (less norm traffic and activation memory; stage boundaries stay fp32)")
    p.add_argument("--elastic", action="store_true",
                   help="a plan for an elastic job (hexiscale launch --elastic): only schedules whose layout can "
                   "switch while training (1f1b, gpipe, zb-h1: one layer range per stage), as the job's own "
                   "re-plans")
    p.set_defaults(func=run)


def print_progress(note: SearchProgress) -> None:
    """A line on stderr every few seconds of a long search (stdout stays the plan, or pure JSON)."""
    best = f"best {note.best_s:.4f} s/step so far" if math.isfinite(note.best_s) else "nothing fits yet"
    print(f"hexiscale plan: searching, {note.elapsed_s:.0f} s, {note.evaluations} candidates costed, {best}",
          file=sys.stderr, flush=True)


def run(args: argparse.Namespace) -> int:
    started = time.perf_counter()  # --time-limit is wall time for the whole command
    from planner.search.config import elastic_config
    from planner.search.planner import PlannerConfig, search

    flag = typed(args, "global_batch", GLOBAL_BATCH)
    if args.global_batch is None and not args.lengths:
        raise SpecError(flag, "missing", "give the samples per step (or --lengths and --step-tokens)")
    if args.global_batch is not None:
        check_int(flag, args.global_batch, 1, MAX_GLOBAL_BATCH, "pass the samples per step, e.g. 256")
    check_number("--time-limit", args.time_limit, 0.0, 86400.0, above=True, unit=" seconds")
    check_int("--seed", args.seed, 0, 2**32 - 1, "pass a non-negative seed")
    from planner.calibration.local import resolve_profiles
    from planner.calibration.priced_by import used_by

    cluster = load_cluster(args.cluster)
    model = resolve_model(args.model, args.seq_len)
    resolved = resolve_profiles(cluster)
    resolved.say(sys.stderr if args.json else sys.stdout)
    if args.lengths:
        if args.compile:
            raise SpecError("--compile", "a strategy pool runs eager (hexiscale train refuses --compile with "
                            "one)", "drop --compile or plan one batch shape without --lengths")
        if args.residual_dtype != "fp32":
            raise SpecError("--residual-dtype", "a strategy pool is planned with the fp32 residual",
                            "drop --residual-dtype or plan one batch shape without --lengths")
        from hexiscale.cli import plan_lengths

        return plan_lengths.run(args, cluster, model, resolved.profiles)
    config = PlannerConfig(time_limit_s=args.time_limit, seed=args.seed, objective=args.objective,
                           compile=args.compile, residual_dtype=args.residual_dtype)
    if args.elastic:
        config = elastic_config(config)
    if args.output:
        check_writable(args.output, "-o")  # before a search of up to --time-limit seconds
    result = search(cluster, model, args.global_batch, config=config, profiles=resolved.profiles,
                    progress=print_progress, clock=time.perf_counter, started=started)
    plan, est = result.plan, result.estimate
    if result.cut_short:
        print(f"note: the time limit ({args.time_limit:g} s) cut the search short; this is the best plan found "
              "so far (a longer --time-limit may find a faster one)", file=sys.stderr if args.json else sys.stdout,
              flush=True)
    priced = used_by(resolved.priced_by, cluster, plan.devices)
    plan = plan.with_estimate({**(plan.estimate or {}), "priced_by": priced})
    if args.output:
        with writing("-o", args.output):
            save_plan(plan, args.output)
    if args.json:
        print(json.dumps(plan_to_dict(plan), indent=2))
        return 0
    console.print(plan_table(plan, cluster))
    b = est.bottleneck
    console.print(styled("estimate: step time ", (f"{est.step_time_s:.3f} s", "bold"),
                         f", {est.tokens_per_s:,.0f} tokens/s, MFU {est.mfu * 100:.1f} %, HFU {est.hfu * 100:.1f} %; "
                         f"bottleneck: pipeline {b['pipeline']} stage {b['stage']} ({b['term']})"))
    terms = ", ".join(f"{k} {v:.3f}" for k, v in est.breakdown.items())
    console.print(f"breakdown (s, slowest pipeline's bottleneck stage): {terms}", highlight=False)
    if result.idle:
        console.print(result.idle, highlight=False, soft_wrap=True)
    peak = max(est.memory_gib.values())
    console.print(f"peak memory {peak:.1f} GiB; searched {result.evaluations} candidates in "
                  f"{result.elapsed_s:.2f} s{' (time limit reached)' if result.cut_short else ''}", highlight=False)
    try:
        line = plan_to_flags(plan, cluster).as_command_line()
        if len(line) <= SEED_FLAGS_CHARS or args.seed_flags:
            console.print("seed-style flags: " + line, highlight=False, soft_wrap=True)
        else:
            console.print(f"seed-style flags: {len(line):,} characters (--seed-flags prints them; -o writes the "
                          "plan, which the executor takes with --plan)", highlight=False)
    except SpecError as exc:
        console.print(f"seed-style flags: not expressible ({exc})", highlight=False, soft_wrap=True)
    if args.output:
        console.print(f"wrote {args.output}", highlight=False)
    if args.plot:
        steps = estimate(plan, cluster, timeline=True).timeline
        write_pictures(args.plot, plan, cluster, steps, SIMULATED, f"cluster {cluster.name}")
    if args.explain:
        console.print(styled("\n", ("search log", "bold")))
        for line in result.log:
            console.print("  " + line)
        try:
            from hexiscale.cli import cmd_estimate
        except ImportError:  # the estimate command is optional here
            return 0
        cmd_estimate.render(plan, cluster, est, title="estimate of the chosen plan")
    return 0
