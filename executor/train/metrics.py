"""Per-step log lines, the rank-0 summary and the optional JSONL metrics file.

MFU = achieved model FLOP/s / peak FLOP/s, with model FLOPs per token from
``ModelSpec.model_flops_per_token`` (6N + 12·L·h·s) and the peak summed over the devices involved
(a pipeline's devices for its leader's line, the plan's devices for the summary) from the cluster's
device catalog at the plan's dtype. It is reported only on GPU with ``--cluster``; on CPU (or
without a cluster) it is ``n/a``, never an invented number. Memory is the device's peak allocated
memory on GPU and the process's peak resident set on CPU.
"""

from __future__ import annotations

import json
import math
import resource
import sys
import time
from dataclasses import dataclass, field
from typing import Any

import torch

from executor.train.output_files import write_text
from executor.train.tensorboard_sink import TensorBoardSink
from planner.cluster import ClusterSpec
from planner.plan import Plan


def peak_tflops(plan: Plan, cluster: ClusterSpec | None, devices: list[str]) -> float | None:
    """Sum of the devices' dense peak at the plan's dtype (None without a cluster)."""
    if cluster is None:
        return None
    return sum(cluster.catalog.get(cluster.device(d).gpu).peak(plan.options.dtype) for d in devices)


def _finite(x: float) -> float | None:
    """JSON has no NaN/Infinity: a non-finite value is written as null."""
    return x if math.isfinite(x) else None


def memory_gib(device: torch.device) -> float:
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**30
    rss_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux
    return rss_kib / 2**20


@dataclass
class StepLogger:
    plan: Plan
    rank: int
    pipeline: int
    leader: bool  # first rank of its pipeline
    device: torch.device
    cluster: ClusterSpec | None
    jsonl: str | None = None
    every: int = 1
    tensorboard: TensorBoardSink | None = None  # rank 0's TensorBoard sink beside the JSONL file
    times: list[float] = field(default_factory=list)
    losses: list[float] = field(default_factory=list)
    _t0: float = field(default_factory=time.perf_counter)

    def _mfu(self, tokens_per_s: float, devices: list[str]) -> float | None:
        peak = peak_tflops(self.plan, self.cluster, devices)
        if peak is None or self.device.type != "cuda":
            return None
        return tokens_per_s * self.plan.model.model_flops_per_token() / (peak * 1e12)

    def step(self, step: int, total: int, stats: Any, seconds: float) -> None:
        self.times.append(seconds)
        self.losses.append(stats.loss)
        pipe = self.plan.pipelines[self.pipeline]
        seq = stats.tokens // self.plan.global_batch_size
        pipe_tps = pipe.batch_size * seq / seconds
        mfu = self._mfu(pipe_tps, pipe.devices)
        mem = memory_gib(self.device)
        skipped = getattr(stats, "skipped", False)
        if self.leader and (step % self.every == 0 or step + 1 == total or skipped):
            tail = " | SKIPPED: not finite, weights unchanged" if skipped else ""
            print(f"step {step + 1}/{total} pipeline {self.pipeline} rank {self.rank} | loss {stats.loss:.4f} | "
                  f"grad-norm {stats.grad_norm:.3f} | lr {stats.lr:.2e} | {pipe_tps:,.0f} tok/s | "
                  f"MFU {'n/a' if mfu is None else f'{100 * mfu:.1f}%'} | mem {mem:.2f} GiB{tail}", flush=True)
        if self.rank == 0 and (self.jsonl or self.tensorboard):
            tps = stats.tokens / seconds
            gmfu = self._mfu(tps, self.plan.devices)
            rec = {"step": step + 1, "loss": _finite(stats.loss), "grad_norm": _finite(stats.grad_norm),
                   "lr": stats.lr, "tokens": stats.tokens, "step_time_s": seconds, "tokens_per_s": tps, "mfu": gmfu,
                   "memory_gib_rank0": mem, "time": time.time(), "skipped": skipped}
            if self.jsonl:
                write_text(self.jsonl, json.dumps(rec) + "\n", "--log-jsonl", append=True)
            if self.tensorboard:
                self.tensorboard.write(rec)

    def summary(self, start_step: int, tokens_per_step: int) -> None:
        if self.rank != 0 or not self.times:
            return
        n = len(self.times)
        steady = self.times[1:] if n > 1 else self.times  # the first step includes warm-up
        step_s = sum(steady) / len(steady)
        tps = tokens_per_step / step_s
        mfu = self._mfu(tps, self.plan.devices)
        print(f"summary: {n} steps ({start_step + 1}..{start_step + n}) on {self.plan.world_size} ranks "
              f"({len(self.plan.pipelines)} pipelines), loss {self.losses[0]:.4f} -> {self.losses[-1]:.4f}, "
              f"{step_s:.3f} s/step, {tps:,.0f} tok/s, MFU {'n/a' if mfu is None else f'{100 * mfu:.1f}%'}, "
              f"wall {time.perf_counter() - self._t0:.1f} s", flush=True)
        sys.stdout.flush()
        if self.tensorboard:
            self.tensorboard.close()
