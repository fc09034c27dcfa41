"""``hexiscale data lengths|packing``: a variable-length corpus as the mixed-length trainer sees it.

    hexiscale data lengths PATH --context C [-o HIST.json] [--vocab-size V]
        The documents of a token file cut to sequences of at most C inputs
        (:class:`executor.data.doc_source.TokenFileDocs`), their length histogram (``hexiscale.lengths/1``,
        what ``hexiscale plan --lengths`` reads) and its summary.
    hexiscale data packing PATH --pool POOL.json --cluster CLUSTER --step-tokens N [--steps K] [-o OUT.json]
        The first K steps as training lays them out: each step's sequences (a global batch of N
        tokens), its phases (one strategy of the pool each), every pipeline's packed micro-batches,
        the estimated times and the solver's time (:func:`planner.varlen.step_layout.plan_step`);
        ``-o`` writes them (``hexiscale.packing/1``: per step, the sequences' indices in the corpus
        and lengths, and per phase the strategy and every pipeline's micro-batches as positions in
        the step's sequence list). Training computes the same layouts one step ahead by itself.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from hexiscale.cli.output import console, styled


def register(dsub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    ln = dsub.add_parser("lengths", help="length histogram of a token file's documents cut to a context")
    ln.add_argument("path", help="token file stem, or its .bin/.idx")
    ln.add_argument("--context", type=int, required=True, help="the model's sequence length")
    ln.add_argument("--vocab-size", type=int, default=1 << 31, dest="vocab_size", help="check ids are below this")
    ln.add_argument("-o", "--output", help="write the histogram (hexiscale.lengths/1 JSON)")
    ln.set_defaults(func=run_lengths)
    pk = dsub.add_parser("packing", help="pack a variable-length corpus: its first steps' sequences to a "
                         "strategy pool's pipelines and micro-batches (-o writes them)")
    pk.add_argument("path", help="token file stem, or its .bin/.idx")
    pk.add_argument("--pool", required=True, help="strategy pool (hexiscale plan --lengths -o POOL.json)")
    pk.add_argument("--cluster", required=True, help="cluster file the pool was planned for")
    pk.add_argument("--step-tokens", type=int, required=True, dest="step_tokens", help="tokens per step")
    pk.add_argument("--steps", type=int, default=2, help="how many steps to lay out (default 2)")
    pk.add_argument("--assign", default="cost", choices=("cost", "threshold"), help="sequences to strategies")
    pk.add_argument("--seed", type=int, default=0, help="data order")
    pk.add_argument("-o", "--output", help="write the layouts (hexiscale.packing/1 JSON)")
    pk.set_defaults(func=run_packing)


def _positive(flag: str, value: int) -> None:
    from planner.errors import SpecError

    if value < 1:
        raise SpecError(flag, f"must be >= 1, got {value}", "pass a positive count")


def run_lengths(args: argparse.Namespace) -> int:
    from executor.data.doc_source import TokenFileDocs
    from planner.varlen.histogram import LengthHistogram

    _positive("--context", args.context)
    docs = TokenFileDocs(args.path, context=args.context, vocab_size=args.vocab_size)
    h = LengthHistogram.from_lengths(docs.lengths(), str(args.path), context=args.context,
                                     source=f"token file {args.path}")
    if args.output:
        h.save(args.output)
    console.print(f"{h.sequences:,} sequences (documents cut to {args.context:,} tokens), mean {h.mean():,.0f}, "
                  f"median {h.quantile(0.5):,}; under 4K {h.fraction_below(4096):.1%}, under 8K "
                  f"{h.fraction_below(8192):.1%}; tokens in sequences under 8K {h.token_fraction_below(8192):.1%}"
                  + (f"\nwrote {args.output}" if args.output else ""), highlight=False)
    return 0


def run_packing(args: argparse.Namespace) -> int:
    from executor.data.doc_source import TokenFileDocs, step_sequences
    from planner.cluster import load_cluster
    from planner.errors import SpecError
    from planner.varlen.pool import load_pool, strategy_costs
    from planner.varlen.step_layout import plan_step

    _positive("--step-tokens", args.step_tokens)
    _positive("--steps", args.steps)
    pool = load_pool(args.pool)
    if args.step_tokens < pool.context:
        raise SpecError("--step-tokens", f"{args.step_tokens} is fewer than the pool's context {pool.context}",
                        "give a global batch that holds at least one full-length sequence")
    cluster = load_cluster(args.cluster)
    costs = strategy_costs(pool, cluster)
    docs = TokenFileDocs(args.path, context=pool.context, vocab_size=pool.model.vocab_size, seed=args.seed)
    cursor = 0
    steps = []
    for k in range(args.steps):
        idx, cursor = step_sequences(docs, cursor, args.step_tokens)
        lengths = [docs.length(i) for i in idx]
        lay = plan_step(lengths, costs, assign=args.assign)
        steps.append({"step": k, "sequences": idx, "lengths": lengths, "estimate_s": lay.time_s,
                      "solve_s": lay.solve_s,
                      "phases": [{"strategy": pool.strategies[ph.strategy].name,
                                  "pipelines": [[list(mb) for mb in pipe] for pipe in ph.pipelines]}
                                 for ph in lay.phases]})
        console.print(styled((f"step {k}", "bold"), f": {len(idx)} sequences, {sum(lengths):,} tokens (longest "
                             f"{max(lengths):,}); estimated {lay.time_s:.3f} s, switches {lay.switch_s:.3f} s; "
                             f"dispatch + packing took {lay.solve_s * 1e3:.1f} ms"))
        for ph in lay.phases:
            console.print(f"  phase {pool.strategies[ph.strategy].name}: {len(ph.sequences)} sequences, "
                          f"{ph.time_s:.3f} s", highlight=False)
            for j, pipe in enumerate(ph.pipelines):
                toks = [sum(lengths[i] for i in mb) for mb in pipe]
                console.print(f"    pipeline {j}: {len(pipe)} micro-batches, tokens {toks}", highlight=False)
    if args.output:
        Path(args.output).write_text(json.dumps({"format": "hexiscale.packing/1", "data": str(args.path),
                                                 "pool": str(args.pool), "step_tokens": args.step_tokens,
                                                 "assign": args.assign, "seed": args.seed, "steps": steps}) + "\n")
        console.print(f"wrote {args.output}", highlight=False)
    return 0
