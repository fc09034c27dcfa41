"""``hexiscale plan CLUSTER --model M --seq-len CONTEXT --lengths HISTOGRAM --step-tokens N``: the
strategy pool for mixed-length data (:func:`planner.varlen.propose.propose_pool`).

``HISTOGRAM`` is a ``hexiscale.lengths/1`` file (``hexiscale data lengths`` writes one from a token
file; ``planner/varlen/data/`` holds the measured code and web ones) or ``synthetic:NAME``
(``commoncrawl``, ``github``: :mod:`planner.varlen.synthetic`). Prints a table of the pool (per
strategy: its role, pipelines and their stages' TP degrees, the most tokens a micro-batch of it
holds next to the home layout's state), every strategy's plan, the search log and the estimated
step time of static training (the best single strategy), HotSPa-style length buckets and hot
switching; ``-o`` writes the pool (``hexiscale.pool/1``), which ``hexiscale train`` and
``hexiscale launch`` take as the plan.
"""

from __future__ import annotations

import argparse
import json
import math

from rich.table import Table

from hexiscale.cli.output import console, plan_table, styled
from planner.cluster import ClusterSpec
from planner.cost import ProfileSet
from planner.errors import SpecError
from planner.model import ModelSpec
from planner.varlen.histogram import LengthHistogram, load_histogram
from planner.varlen.pool import StrategyPool, strategy_costs
from planner.varlen.propose import propose_pool
from planner.varlen.synthetic import preset


def histogram(arg: str, context: int) -> LengthHistogram:
    if arg.startswith("synthetic:"):
        return preset(arg.split(":", 1)[1]).histogram(context)
    return load_histogram(arg)


def pool_table(pool: StrategyPool, cluster: ClusterSpec, profiles: ProfileSet) -> Table:
    """One row per strategy: role, pipelines (each stage's TP degree) and its micro-batch token cap."""
    table = Table(title=f"strategy pool: {len(pool.strategies)} strateg{'y' if len(pool.strategies) == 1 else 'ies'}"
                  f", context {pool.context:,}", title_justify="left")
    for col in ("strategy", "role", "pipelines", "stages of each pipeline", "micro-batch token cap"):
        table.add_column(col, justify="right" if col in ("pipelines", "micro-batch token cap") else "left")
    for k, (st, cost) in enumerate(zip(pool.strategies, strategy_costs(pool, cluster, profiles))):
        shapes = " | ".join(".".join(f"TP{s.tp}" for s in p.stages) for p in st.plan.pipelines)
        table.add_row(st.name, "home (master weights, optimizer)" if k == pool.home else "working",
                      str(len(st.plan.pipelines)), shapes, f"{min(cost.max_len, pool.context):,}")
    return table


def run(args: argparse.Namespace, cluster: ClusterSpec, model: ModelSpec, profiles: ProfileSet) -> int:
    if args.step_tokens is None or args.step_tokens < 1:
        raise SpecError("--step-tokens", "missing or < 1", "give the tokens of one step's global batch")
    hist = histogram(args.lengths, model.seq_len)
    prop = propose_pool(cluster, model, hist, args.step_tokens, time_limit_s=args.time_limit, seed=args.seed,
                        profiles=profiles)
    pool = prop.pool
    if args.output:
        pool.save(args.output)
    if args.json:
        print(json.dumps(pool.to_dict(), indent=1))
        return 0
    console.print(f"lengths: {hist.name} ({hist.sequences:,} sequences, {hist.fraction_below(8192):.1%} under 8K), "
                  f"context {model.seq_len:,}, {args.step_tokens:,} tokens per step", highlight=False)
    console.print(pool_table(pool, cluster, profiles))
    for k, st in enumerate(pool.strategies):
        home = " (home: master weights and optimizer)" if k == pool.home else ""
        console.print(styled("\n", (f"strategy {k}: {st.name}", "bold"), home))
        console.print(plan_table(st.plan, cluster))
    e = prop.estimate
    hand = "n/a (a bucket plan cannot hold the longest sequences)" if math.isnan(e["hand_buckets_s"]) \
        else f"{e['hand_buckets_s']:.3f} s"
    console.print(f"\nestimated step ({e['steps']} sampled steps): static {e['static_s']:.3f} s ({e['static']}), "
                  f"HotSPa buckets {hand}, hot switching {e['hot_switching_s']:.3f} s "
                  f"({e['static_s'] / e['hot_switching_s']:.2f}x static; switches {e['switch_s']:.3f} s, "
                  f"dispatch {e['solve_s'] * 1e3:.0f} ms per step)", highlight=False)
    if args.explain:
        console.print(styled("\n", ("search log", "bold")))
        for line in prop.log:
            console.print("  " + line, highlight=False, markup=False)
    if args.output:
        console.print(f"wrote {args.output}", highlight=False)
    return 0
