"""``hexiscale train --plan POOL.json``: mixed-length data with hot switching, on every rank.

The pool (``hexiscale plan --lengths ... -o POOL.json``) numbers the ranks by its home plan (what
``hexiscale launch`` and pre-flight see). :func:`doc_source` is checked in pre-flight like a token
file: ``--data`` gives the documents of a token file cut to the pool's context
(:class:`~executor.doc_source.TokenFileDocs`), else ``--lengths`` gives synthetic sequences of a
length histogram. :func:`train_pool` then runs the steps: each is ``--step-tokens`` tokens of
whole sequences, laid out one step ahead on rank 0 (:class:`~executor.step_prefetch.LayoutStream`:
sequences to strategies and pipelines, packed micro-batches) and trained by the
:class:`~executor.hot_switch.HotSwitchEngine` (one optimizer step over every strategy's phase).
Checkpoints are the home engine's (any plan of the model resumes from them); their ``extra``
holds the next sequence (``varlen.cursor``), where a resumed run goes on.

Per step, rank 0 prints the loss, the tokens and sequences, the phases (strategies used), the
switch time, the dispatch + packing time and what training waited for it; ``--log-jsonl`` gets
the same as one record, ``--tensorboard`` its numbers. ``--stop-at``, ``--on-nonfinite`` (the home
engine's guard) and fault injection act as in a plan's loop (:mod:`executor.flag_modes`).
"""

from __future__ import annotations

import json
import time
from functools import partial
from typing import Any

import torch

from executor import checkpoint
from executor.doc_source import DocSource, SyntheticDocs, TokenFileDocs
from executor.hot_switch import HotSwitchEngine, switch_groups
from executor.launch.faults import maybe_inject
from executor.launch.watchdog import Watchdog
from executor.metrics import memory_gib
from executor.optim import OptimConfig
from executor.output_files import write_text
from executor.progress import note, step_starting
from executor.saving import Saver
from executor.step_prefetch import LayoutStream
from executor.tensorboard_sink import TensorBoardSink
from executor.train_config import TrainConfig
from planner.cluster import ClusterSpec
from planner.errors import SpecError
from planner.varlen.pool import StrategyPool, strategy_costs


def doc_source(args: TrainConfig, pool: StrategyPool, *, scan: bool) -> DocSource:
    """The sequences training reads (module docstring); a ``SpecError`` on bad input."""
    if args.varlen.step_tokens is None:
        raise SpecError("--step-tokens", "missing", "give the tokens of a step's global batch, e.g. "
                        f"--step-tokens {4 * pool.context}")
    if args.varlen.step_tokens < pool.context:
        raise SpecError("--step-tokens", f"{args.varlen.step_tokens} is fewer than the pool's context {pool.context}",
                        "give a global batch that holds at least one full-length sequence")
    model = pool.model
    if args.data.path:
        if args.varlen.lengths:
            raise SpecError("--lengths", "given together with --data", "the token file's documents have lengths")
        return TokenFileDocs(args.data.path, context=pool.context, vocab_size=model.vocab_size, seed=args.run.seed,
                             scan=scan)
    if not args.varlen.lengths:
        raise SpecError("--lengths", "missing", "pass --data TOKENS, or synthetic lengths: --lengths HISTOGRAM.json "
                        "or --lengths synthetic:commoncrawl")
    from planner.varlen.histogram import load_histogram
    from planner.varlen.synthetic import preset

    lengths = args.varlen.lengths
    hist = preset(lengths.split(":", 1)[1]).histogram(pool.context) if lengths.startswith("synthetic:") \
        else load_histogram(lengths)
    return SyntheticDocs(hist, pool.context, model.vocab_size, seed=args.run.seed)


def _log(args: TrainConfig, step: int, rec: dict[str, Any], sink: TensorBoardSink | None) -> None:
    print(f"step {step}/{args.run.steps} | loss {rec['loss']:.4f} | grad-norm {rec['grad_norm']:.3f} "
          f"| lr {rec['lr']:.2e} "
          + ("| skipped (not finite) " if rec["skipped"] else "") +
          f"| {rec['tokens']:,} tokens in {rec['sequences']} sequences (longest {rec['longest']:,}) | "
          f"{rec['tokens_per_s']:,.0f} tok/s | phases {'+'.join(rec['phases'])} | switch {rec['switch_s']:.3f} s | "
          f"dispatch {rec['dispatch_s'] * 1e3:.1f} ms (waited {rec['wait_s'] * 1e3:.1f} ms) | "
          f"mem {rec['memory_gib_rank0']:.2f} GiB", flush=True)
    if args.metrics.log_jsonl:
        write_text(args.metrics.log_jsonl, json.dumps(rec) + "\n", "--log-jsonl", append=True)
    if sink is not None:
        sink.write(rec)


def train_pool(args: TrainConfig, pool: StrategyPool, cluster: ClusterSpec | None, source: DocSource, *,
               rank: int, device: torch.device, optim: OptimConfig, resume: str | None, wd: Watchdog,
               fault: tuple[int, int, str] | None = None) -> None:
    """Steps ``start..args.end`` of hot switching on this rank (module docstring); ``cluster`` and
    ``args.varlen.step_tokens`` were checked in pre-flight; ``fault``: an injected one (tests)."""
    assert cluster is not None and args.varlen.step_tokens is not None
    costs = strategy_costs(pool, cluster)
    plans = [s.plan for s in pool.strategies]
    note(rank, "creating the communicators...")
    groups = switch_groups(plans, pool.home)
    wire = torch.bfloat16 if device.type == "cuda" and pool.home_plan.options.dtype == "bf16" else None
    note(rank, f"building the model ({pool.model.name}; the hot-switching engine, home strategy "
               f"{pool.strategies[pool.home].name})...")
    eng = HotSwitchEngine(plans, pool.home, groups, device=device, optim=optim, seed=args.run.seed, wire_dtype=wire,
                          on_nonfinite=args.faults.on_nonfinite)
    sink = TensorBoardSink(args.metrics.tensorboard) if args.metrics.tensorboard and rank == 0 else None
    cursor = 0
    if resume is not None:
        note(rank, f"loading checkpoint {resume}...")
        extra = checkpoint.load(eng.home, resume)
        cursor = int(extra.get("varlen", {}).get("cursor", 0))
    note(rank, f"loading data ({args.data.path or args.varlen.lengths})...")
    stream = LayoutStream(source, costs, step_tokens=args.varlen.step_tokens, cursor=cursor, group=groups.layouts,
                          assign=args.varlen.assign, seed=args.run.seed)
    saver = Saver(eng.home, args.checkpoint.dir, args.checkpoint.save_every, args.checkpoint.async_save)
    start = eng.home.step
    if rank == 0:
        print(f"hexiscale train: strategy pool of {len(plans)} ({', '.join(s.name for s in pool.strategies)}; home "
              f"{pool.strategies[pool.home].name}), {pool.home_plan.world_size} ranks, model {pool.model.name}, "
              f"context {pool.context:,}, {args.varlen.step_tokens:,} tokens per step, "
              f"data {args.data.path or args.varlen.lengths}, "
              f"{device.type}, steps {start}..{args.run.end}" + (f", resumed from {resume}" if resume else ""),
              flush=True)
    step_starting(rank, start + 1)
    t_all, tokens_all = 0.0, 0
    for k in range(start, args.run.end):
        wd.begin_step(k + 1)
        maybe_inject(fault, rank, k)
        step = stream.next()
        t0 = time.perf_counter()
        st = eng.train_step(step.docs, step.layout, global_tokens=step.docs.label_tokens)
        seconds = time.perf_counter() - t0
        if k > start:  # the first step includes warm-up
            t_all, tokens_all = t_all + seconds, tokens_all + step.docs.label_tokens
        if rank == 0 and ((k + 1) % args.metrics.log_every == 0 or k + 1 == args.run.end):
            _log(args, k + 1, {"step": k + 1, "loss": st.step.loss, "grad_norm": st.step.grad_norm, "lr": st.step.lr,
                               "skipped": st.step.skipped,
                               "tokens": st.step.tokens, "sequences": len(step.docs),
                               "longest": max(step.docs.lengths), "step_time_s": seconds,
                               "tokens_per_s": st.step.tokens / seconds,
                               "phases": [pool.strategies[ph.strategy].name for ph in step.layout.phases],
                               "switch_s": st.switch_s, "dispatch_s": step.solve_s, "wait_s": step.wait_s,
                               "estimate_s": step.layout.time_s, "memory_gib_rank0": memory_gib(device),
                               "time": time.time()}, sink)
        saver.after_step(k + 1, k + 1 == args.run.end, {"varlen": {"cursor": step.next_cursor},
                                                     "plan_world_size": pool.home_plan.world_size},
                         partial(maybe_inject, fault, rank, k, in_save=True))
    eng.home.drain()
    saver.finish()
    if sink is not None:
        sink.close()
    if rank == 0 and t_all > 0:
        print(f"summary: steps {start + 1}..{args.run.end}, {tokens_all / t_all:,.0f} tok/s after the first step",
              flush=True)
