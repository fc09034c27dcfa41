"""Measured per-micro-batch events of a few training steps (``hexiscale train --trace FILE``).

Each rank records spans — forward and backward of every micro-batch, its p2p exchanges (waits
included), the gradient sync left after the schedule (with the loss/norm all-reduce) and the
optimizer step — timed from an anchor taken right after a barrier at the start of the step. The
anchor's wall-clock time travels with the spans (``perf_counter`` plus this rank's offset to the
wall clock, measured once in a tight bracket), and rank 0 shifts every rank's spans by its
anchor's distance to the earliest one: exact to microseconds on one host (one clock), as good as
the hosts' clock sync across hosts, and unaffected by a rank that is descheduled after the barrier. On CUDA the
spans are CUDA events read after the step (the host does not wait inside a step); on CPU,
``perf_counter``. Each span's host interval (``perf_counter`` at its start and end, from the same
anchor) is kept beside it in memory (a step's ``host_events``, not written to the file): where the
host's forward takes as long as the device's, the forward is launch-bound (the fidelity benchmark's
traced step reports both). After the traced steps, rank 0 gathers every rank's
spans, with each rank's peak memory after each traced step (:func:`executor.train.metrics.memory_gib`:
allocated on CUDA, resident on CPU), and writes the ``hexiscale.trace/1`` file described in
:mod:`planner.timeline`.

Off (the default), the engine holds :data:`NO_TRACE`, whose ``span`` returns one shared null
context: a method call per op, nothing else.
"""

from __future__ import annotations

import contextlib
import json
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from executor.train.metrics import memory_gib
from executor.train.output_files import output_error, write_text
from planner.plan import Plan, plan_to_dict
from planner.timeline import TRACE_FORMAT

_NULL = contextlib.nullcontext()


class NullTrace:
    """Tracing off."""

    active = False

    def span(self, kind: str, micro_batch: int = -1) -> contextlib.AbstractContextManager:
        return _NULL


NO_TRACE = NullTrace()


class _Span:
    __slots__ = ("trace", "kind", "mb", "start", "host")

    def __init__(self, trace: StepTrace, kind: str, mb: int):
        self.trace, self.kind, self.mb = trace, kind, mb

    def __enter__(self) -> None:
        self.host = time.perf_counter()
        self.start = self.trace.mark()

    def __exit__(self, *exc: object) -> None:
        self.trace.pending.append((self.kind, self.mb, self.start, self.trace.mark()))
        t0 = self.trace.t0
        self.trace.host_pending.append((self.kind, self.mb, self.host - t0, time.perf_counter() - t0))


def wall_clock_offset(samples: int = 10) -> float:
    """``time.time() - time.perf_counter()``, from the tightest of ``samples`` brackets (a sample
    whose process was descheduled between the two clock reads is never the tightest)."""
    best = (float("inf"), 0.0)
    for _ in range(samples):
        a = time.perf_counter()
        wall = time.time()
        b = time.perf_counter()
        best = min(best, (b - a, wall - (a + b) / 2))
    return best[1]


def trace_window(start: int, steps: int, count: int) -> range:
    """0-based steps to trace: ``count`` steps after the run's first (which warms up), or from the
    first if the run is too short for that."""
    first = start + 1 if steps - start > count else start
    return range(first, min(steps, first + count))


class StepTrace:
    """Tracing on: spans of the steps in ``window`` (0-based step indices)."""

    def __init__(self, *, path: str, plan: Plan, device: torch.device, window: range, rank: int, world: Any):
        self.path, self.plan, self.device, self.window = Path(path), plan, device, window
        self.rank, self.world = rank, world
        self.cuda = device.type == "cuda"
        self.active = False
        self.pending: list[tuple[str, int, Any, Any]] = []
        self.host_pending: list[tuple[str, int, float, float]] = []  # the same spans on the host clock
        self.steps: list[dict[str, Any]] = []
        self._anchor: Any = None
        self._t0 = 0.0
        self._offset = wall_clock_offset()

    @property
    def t0(self) -> float:
        """The host clock (``perf_counter``) at the traced step's anchor."""
        return self._t0

    def mark(self) -> Any:
        if not self.cuda:
            return time.perf_counter() - self._t0
        ev = torch.cuda.Event(enable_timing=True)
        ev.record()
        return ev

    def span(self, kind: str, micro_batch: int = -1) -> contextlib.AbstractContextManager:
        return _Span(self, kind, micro_batch) if self.active else _NULL

    def begin_step(self, k: int) -> None:
        """Collective when ``k`` is traced: a barrier, then this rank's time anchor."""
        self.active = k in self.window
        if not self.active:
            return
        if self.plan.world_size > 1:
            dist.all_reduce(torch.zeros(1, device=self.device), group=self.world)
        if self.cuda:
            torch.cuda.synchronize(self.device)
        self._t0 = time.perf_counter()
        self._anchor = self.mark()
        self.pending, self.host_pending = [], []

    def end_step(self, k: int) -> None:
        """Keep step ``k``'s spans; after the window's last step, write the file (collective)."""
        if not self.active:
            return
        self.active = False
        if self.cuda:
            torch.cuda.synchronize(self.device)
            events = [[kind, mb, self._anchor.elapsed_time(a) / 1e3, self._anchor.elapsed_time(b) / 1e3]
                      for kind, mb, a, b in self.pending]
        else:
            events = [[kind, mb, a, b] for kind, mb, a, b in self.pending]
        host = [[kind, mb, a, b] for kind, mb, a, b in self.host_pending]
        self.steps.append({"step": k + 1, "wall0": self._t0 + self._offset, "events": events, "host_events": host,
                           "peak_memory_gib": memory_gib(self.device)})
        if k + 1 == self.window.stop:
            self.write()

    def write(self) -> None:
        """Collective: gather every rank's steps to rank 0, which writes the trace file."""
        gathered: list[Any] = [None] * self.plan.world_size if self.rank == 0 else []
        if self.plan.world_size > 1:
            dist.gather_object(self.steps, gathered if self.rank == 0 else None, dst=0, group=self.world)
        else:
            gathered = [self.steps]
        if self.rank != 0:
            return
        steps = []
        for i, rec in enumerate(self.steps):
            wall0 = min(per_rank[i]["wall0"] for per_rank in gathered)
            steps.append({"step": rec["step"], "ranks": [
                {"rank": r, "events": _shifted(per_rank[i]["events"], per_rank[i]["wall0"] - wall0),
                 "peak_memory_gib": per_rank[i]["peak_memory_gib"]}
                for r, per_rank in enumerate(gathered)]})
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise output_error(self.path.parent, "--trace", exc) from None
        write_text(self.path, json.dumps({"format": TRACE_FORMAT, "plan": plan_to_dict(self.plan_as_run()),
                                          "steps": steps}), "--trace")

    def plan_as_run(self) -> Plan:
        """The plan with the dtypes this run computed in (a CPU run computes a bf16 plan in fp32;
        ``executor.train.engine.compute_dtype``), so that what ``hexiscale show`` draws is what was measured."""
        if self.device.type != "cpu" or self.plan.options.dtype == "fp32":
            return self.plan
        return replace(self.plan, options=replace(self.plan.options, dtype="fp32", residual_dtype="fp32"))


def _shifted(events: list[list[Any]], offset: float) -> list[list[Any]]:
    return [[kind, mb, a + offset, b + offset] for kind, mb, a, b in events]
