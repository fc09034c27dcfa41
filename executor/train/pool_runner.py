"""The step runner of a strategy pool (:class:`executor.train.loop.StepRunner`): mixed-length data
with hot switching.

Each step is ``--step-tokens`` tokens of whole sequences, laid out one step ahead on rank 0
(:class:`~executor.data.step_prefetch.LayoutStream`: sequences to strategies and pipelines, packed
micro-batches) and trained by the :class:`~executor.switch.hot_switch.HotSwitchEngine` (one optimizer
step over every strategy's phase). Checkpoints are the home engine's (any plan of the model
resumes from them); their ``extra`` holds the next sequence (``varlen.cursor``), where a resumed
run — or the next layout of an elastic job — goes on.

Per step, rank 0 prints the loss, the tokens and sequences, the phases (strategies used), the
switch time, the dispatch + packing time and what training waited for it; ``--log-jsonl`` gets
the same as one record, ``--tensorboard`` its numbers.
"""

from __future__ import annotations

import json
import time
from typing import Any

import torch

from executor.data.doc_source import DocSource
from executor.data.step_prefetch import LayoutStream, StepPlan
from executor.state import checkpoint
from executor.switch.hot_switch import HotStepStats, HotSwitchEngine, SwitchGroups, switch_groups
from executor.train.config import TrainConfig
from executor.train.engine import Engine
from executor.train.metrics import memory_gib
from executor.train.optim import OptimConfig
from executor.train.output_files import write_text
from executor.train.tensorboard_sink import TensorBoardSink
from executor.train.trace import StepTrace
from planner.cluster import ClusterSpec
from planner.varlen.pool import StrategyPool, strategy_costs


def build_engine(pool: StrategyPool, args: TrainConfig, *, device: torch.device, optim: OptimConfig,
                 init: bool = True, home: Engine | None = None) -> tuple[HotSwitchEngine, SwitchGroups]:
    """Every group of the pool (collective over the default group) and the hot-switching engine
    (``home``: its home engine, built before the groups by an elastic switch, which gets them)."""
    groups = switch_groups([s.plan for s in pool.strategies], pool.home)
    wire = torch.bfloat16 if device.type == "cuda" and pool.home_plan.options.dtype == "bf16" else None
    eng = HotSwitchEngine([s.plan for s in pool.strategies], pool.home, groups, device=device, optim=optim,
                          seed=args.run.seed, wire_dtype=wire, on_nonfinite=args.faults.on_nonfinite, init=init,
                          home_engine=home)
    return eng, groups


def resume(engine: Engine, path: str) -> int:
    """Load checkpoint ``path`` into the home ``engine``; the sequence it was saved before."""
    return int(checkpoint.load(engine, path).get("varlen", {}).get("cursor", 0))


class PoolRunner:
    """A strategy pool's steps on this rank (module docstring)."""

    def __init__(self, eng: HotSwitchEngine, groups: SwitchGroups, pool: StrategyPool, args: TrainConfig, *,
                 source: DocSource, cluster: ClusterSpec, cursor: int, tensorboard: TensorBoardSink | None = None):
        assert args.varlen.step_tokens is not None  # checked in pre-flight (executor.data.pool_source)
        self.hot, self.groups, self.pool, self.args = eng, groups, pool, args
        self.engine, self.plan, self.rank = eng.home, pool.home_plan, eng.home.rank
        self.trace: StepTrace | None = None  # --trace is refused with a pool (executor.train.flag_modes)
        self.start, self.cursor = eng.home.step, cursor
        self.sink = tensorboard if self.rank == 0 else None
        self.stream = LayoutStream(source, strategy_costs(pool, cluster), step_tokens=args.varlen.step_tokens,
                                   cursor=cursor, group=groups.layouts, assign=args.varlen.assign, seed=args.run.seed)
        self.t_all, self.tokens_all = 0.0, 0

    def train(self) -> tuple[StepPlan, HotStepStats]:
        step = self.stream.next()
        st = self.hot.train_step(step.docs, step.layout, global_tokens=step.docs.label_tokens)
        self.cursor = step.next_cursor
        return step, st

    def log(self, k: int, total: int, result: Any, seconds: float) -> None:
        step, st = result
        if k > self.start:  # the first step includes warm-up
            self.t_all, self.tokens_all = self.t_all + seconds, self.tokens_all + step.docs.label_tokens
        args = self.args
        if self.rank != 0 or not ((k + 1) % args.metrics.log_every == 0 or k + 1 == args.run.end):
            return
        rec = {"step": k + 1, "loss": st.step.loss, "grad_norm": st.step.grad_norm, "lr": st.step.lr,
               "skipped": st.step.skipped, "tokens": st.step.tokens, "sequences": len(step.docs),
               "longest": max(step.docs.lengths), "step_time_s": seconds, "tokens_per_s": st.step.tokens / seconds,
               "phases": [self.pool.strategies[ph.strategy].name for ph in step.layout.phases],
               "switch_s": st.switch_s, "dispatch_s": step.solve_s, "wait_s": step.wait_s,
               "estimate_s": step.layout.time_s, "memory_gib_rank0": memory_gib(self.engine.device),
               "time": time.time()}
        print(f"step {k + 1}/{total} | loss {rec['loss']:.4f} | grad-norm {rec['grad_norm']:.3f} | lr {rec['lr']:.2e} "
              + ("| skipped (not finite) " if rec["skipped"] else "") +
              f"| {rec['tokens']:,} tokens in {rec['sequences']} sequences (longest {rec['longest']:,}) | "
              f"{rec['tokens_per_s']:,.0f} tok/s | phases {'+'.join(rec['phases'])} | switch {rec['switch_s']:.3f} s | "
              f"dispatch {rec['dispatch_s'] * 1e3:.1f} ms (waited {rec['wait_s'] * 1e3:.1f} ms) | "
              f"mem {rec['memory_gib_rank0']:.2f} GiB", flush=True)
        if args.metrics.log_jsonl:
            write_text(args.metrics.log_jsonl, json.dumps(rec) + "\n", "--log-jsonl", append=True)
        if self.sink is not None:
            self.sink.write(rec)

    def position(self) -> tuple[int, int]:
        return self.engine.step, self.cursor

    def extra(self) -> dict[str, Any]:
        return {"varlen": {"cursor": self.cursor}, "plan_world_size": self.plan.world_size}

    def summary(self) -> None:
        if self.sink is not None:
            self.sink.close()
        if self.rank == 0 and self.t_all > 0:
            print(f"summary: steps {self.start + 1}..{self.engine.step}, {self.tokens_all / self.t_all:,.0f} tok/s "
                  "after the first step", flush=True)
