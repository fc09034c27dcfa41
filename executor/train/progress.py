"""Short progress lines of rank 0 before its first step (start-up takes seconds on a small job and
minutes on a large one, and used to show nothing): on stderr, so stdout keeps only the step lines.
They start after pre-flight, so a user error is still the run's only line. Plan and
strategy-pool training (:mod:`executor.train.entry`) and elastic training (:mod:`executor.switch.elastic`)
all say them through here."""

from __future__ import annotations

import sys


def note(rank: int, text: str) -> None:
    if rank == 0:
        print(f"hexiscale train: {text}", file=sys.stderr, flush=True)


def step_starting(rank: int, step: int, *, compiled: bool = False) -> None:
    """The last line before the first step (which also warms up, and compiles if asked: the slow one)."""
    note(rank, f"step {step} starting (the first step also warms up" + (", and compiles" if compiled else "") + ")")
