"""Fault injection for the failure tests: ``HEXISCALE_FAULT=RANK:STEP:KIND``.

When set, global rank ``RANK`` misbehaves as it starts step ``STEP`` (0-based), while the other
ranks are entering that step's collectives. ``KIND``:

* ``kill``  — SIGKILL itself (a crashed process: no message, no clean-up);
* ``hang``  — stop making progress forever (its heartbeat thread keeps running);
* ``freeze`` — SIGSTOP itself: every thread stops, the TCPStore it may host included;
* ``raise`` — raise a RuntimeError (a bug in one rank);
* ``oom``   — raise ``torch.OutOfMemoryError`` (as the allocator would);
* ``kill-in-save`` — SIGKILL itself while writing the checkpoint saved after step ``STEP`` (its own
  shards written, the checkpoint not yet complete).

Unset (the normal case) it does nothing.
"""

from __future__ import annotations

import os
import signal
import time

from planner.errors import SpecError

KINDS = ("kill", "hang", "freeze", "raise", "oom", "kill-in-save")


def parse_fault(text: str | None) -> tuple[int, int, str] | None:
    if not text:
        return None
    parts = text.split(":")
    if len(parts) != 3 or not parts[0].isdigit() or not parts[1].isdigit() or parts[2] not in KINDS:
        raise SpecError("HEXISCALE_FAULT", f"{text!r} is not RANK:STEP:KIND", f"KIND is one of {', '.join(KINDS)}")
    return int(parts[0]), int(parts[1]), parts[2]


def maybe_inject(fault: tuple[int, int, str] | None, rank: int, step: int, *, in_save: bool = False) -> None:
    """Misbehave if ``fault`` names this rank and step (``in_save``: called from inside a checkpoint
    save, where only ``kill-in-save`` fires)."""
    if fault is None or fault[0] != rank or fault[1] != step or (fault[2] == "kill-in-save") != in_save:
        return
    kind = fault[2]
    print(f"[rank {rank}] HEXISCALE_FAULT: injecting '{kind}' at step {step}", flush=True)
    if kind in ("kill", "kill-in-save"):
        os.kill(os.getpid(), signal.SIGKILL)
    elif kind == "freeze":
        os.kill(os.getpid(), signal.SIGSTOP)
    elif kind == "hang":
        while True:
            time.sleep(3600)
    elif kind == "raise":
        raise RuntimeError(f"injected failure on rank {rank} at step {step}")
    elif kind == "oom":
        import torch

        raise torch.OutOfMemoryError(f"injected out-of-memory on rank {rank} at step {step}")
