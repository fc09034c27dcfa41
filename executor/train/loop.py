"""The one training loop of ``hexiscale train``: plans, strategy pools and elastic jobs alike.

The loop owns what every mode shares: the step count (``--steps``, ``--stop-at``), the watchdog's
step marks, fault injection (``HEXISCALE_FAULT``, :func:`executor.job.faults.maybe_inject`),
``--trace`` (where the runner has one), the per-step log and its sinks (``--log-jsonl``,
``--tensorboard``: the runner's logger, called here), checkpoints (:class:`executor.state.saving.Saver`
of the runner's engine, with the runner's data position in their ``extra``) and the summary. The
non-finite guard (``--on-nonfinite``) is the engine's own, in every runner. What differs is a
:class:`StepRunner`:

* :class:`executor.train.plan_runner.PlanRunner` — one plan's :class:`~executor.train.engine.Engine` on
  fixed-length batches (:class:`~executor.data.stream.BatchStream`);
* :class:`executor.train.pool_runner.PoolRunner` — a strategy pool's
  :class:`~executor.switch.hot_switch.HotSwitchEngine` on mixed-length steps
  (:class:`~executor.data.step_prefetch.LayoutStream`); its checkpoints are the home engine's.

Elastic jobs are a :class:`Boundary`: after each step the loop asks whether the next epoch is due
(:meth:`executor.switch.elastic_channel.Channel.switch_due`); if so the boundary moves the state and hands
the loop a new runner — of either kind (:mod:`executor.switch.elastic_switch`) — or None when this
device leaves the job.

**One training step, module by module** (what a newcomer reads; the issue asks for at most 10,
it was 24). Before the first step, once per rank, ``executor.train.entry`` (``run_training``:
pre-flight, store, process group, watchdog) builds the runner; a step then goes through::

     1 executor.train.loop            this loop
     2 executor.train.plan_runner     (a pool: executor.train.pool_runner -> executor.switch.hot_switch)
     3 executor.data.stream           the step's batch
     4 executor.train.engine          Engine.train_step: micro-batches, then the update
     5 executor.parallel.schedules    the registry's op order (planner.schedules), interpreted
     6 executor.model.llama           the stage's layers
     7 executor.parallel.tp_layers    tensor-parallel linears
     8 executor.parallel.p2p          activations between stages
     9 executor.parallel.grad_sync    gradients across pipelines
    10 executor.train.optim           clipping, AdamW (executor.parallel.zero under ZeRO-1; the guard:
                                      executor.train.nonfinite)

10 for a plain plan's step (11 with ZeRO-1, 11 counting the start-up module too).
"""

from __future__ import annotations

import time
from functools import partial
from typing import Any, Protocol

from executor.job.faults import maybe_inject
from executor.job.watchdog import Watchdog
from executor.state.saving import Saver
from executor.train.config import TrainConfig
from executor.train.engine import Engine
from executor.train.trace import StepTrace
from planner.plan import Plan


class StepRunner(Protocol):
    """One layout's steps on this rank."""

    engine: Engine  # whose state checkpoints save and switches move (a pool's: its home engine)
    plan: Plan  # the plan that numbers this layout's ranks (a pool's home plan)
    rank: int
    trace: StepTrace | None

    def train(self) -> Any:
        """One optimizer step on the next batch; returns what :meth:`log` reports."""

    def log(self, k: int, total: int, result: Any, seconds: float) -> None:
        """Step ``k`` (0-based) of ``total``: the log line, ``--log-jsonl``, ``--tensorboard``."""

    def position(self) -> tuple[int, int]:
        """(steps done, data offset): where the next step reads (samples of a plan, the next
        sequence of a pool); an elastic switch hands it to the new layout."""

    def extra(self) -> dict[str, Any]:
        """What a checkpoint keeps besides the engine's state (the data position)."""

    def summary(self) -> None:
        """The run's last line (rank 0)."""


class Boundary(Protocol):
    """An elastic job's epochs, seen from the loop (:mod:`executor.switch.elastic_switch`)."""

    wd: Watchdog  # the epoch's watchdog (each epoch has its own)

    def after_step(self, runner: StepRunner, step: int) -> None:
        """After step ``step`` (1-based), before its checkpoint (a new layout's retire point)."""

    def due(self, runner: StepRunner, step: int) -> bool:
        """Does the next epoch start after step ``step``?"""

    def switch(self, runner: StepRunner) -> StepRunner | None:
        """Move the state into the next epoch's layout: its runner, or None if this device leaves."""


def run_loop(args: TrainConfig, runner: StepRunner, *, wd: Watchdog, fault: tuple[int, int, str] | None,
             boundary: Boundary | None = None) -> None:
    """Steps ``runner.engine.step .. args.run.end`` (module docstring)."""
    saver = Saver(runner.engine, args.checkpoint.dir, args.checkpoint.save_every, args.checkpoint.async_save)
    k = runner.engine.step
    while k < args.run.end:
        watch = boundary.wd if boundary is not None else wd
        watch.begin_step(k + 1)
        maybe_inject(fault, runner.rank, k)
        trace = runner.trace
        if trace is not None:
            trace.begin_step(k)
        t0 = time.perf_counter()
        result = runner.train()
        runner.log(k, args.run.steps, result, time.perf_counter() - t0)
        if trace is not None:
            trace.end_step(k)
        if boundary is not None:  # before the step's checkpoint: nothing in flight at a retire point
            boundary.after_step(runner, k + 1)
        saver.after_step(k + 1, k + 1 == args.run.end, runner.extra(),
                         partial(maybe_inject, fault, runner.rank, k, in_save=True))
        k += 1
        if boundary is not None and k < args.run.end and boundary.due(runner, k):
            saver.finish()
            nxt = boundary.switch(runner)
            if nxt is None:
                return
            runner = nxt
            saver = Saver(runner.engine, args.checkpoint.dir, args.checkpoint.save_every, args.checkpoint.async_save)
    runner.engine.drain()
    saver.finish()
    runner.summary()
