"""Short progress lines of rank 0 before its first step (start-up takes seconds on a small job and
minutes on a large one, and used to show nothing): on stderr, so stdout keeps only the step lines.
They start after pre-flight, so a user error is still the run's only line."""

from __future__ import annotations

import sys


def note(rank: int, text: str) -> None:
    if rank == 0:
        print(f"hexiscale train: {text}", file=sys.stderr, flush=True)
