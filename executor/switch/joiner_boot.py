"""How long a joining device took from its process start to ``ready``, part by part.

A job whose next epoch is due before its joiners are ready waits for them (the supervisor's
"waited N s for joining devices"); this line says where the joiner's time went: the process start,
imports and local checks, its warm-up, NCCL's start-up, and its move and engine built ahead. The
start is the supervisor's clock at spawn (``HEXISCALE_STARTED_AT``, wall seconds); without it the
line starts at the checks' end.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass


@dataclass(frozen=True)
class JoinerBoot:
    started_at: float | None  # wall seconds at spawn, None where the supervisor did not say
    checked_at: float  # wall seconds when the local checks ended

    @classmethod
    def since_start(cls) -> JoinerBoot:
        """Called once the local checks have ended."""
        raw = os.environ.get("HEXISCALE_STARTED_AT")
        try:
            started = float(raw) if raw else None
        except ValueError:
            started = None
        return cls(started, time.time())

    def line(self, epoch: int, warm_s: float | None, nccl_s: float | None, now: float | None = None) -> str:
        now = time.time() if now is None else now
        start = self.started_at if self.started_at is not None else self.checked_at
        checks = self.checked_at - start
        rest = now - self.checked_at - (warm_s or 0.0) - (nccl_s or 0.0)
        parts = [f"process start, imports and checks {checks:.1f} s" if self.started_at is not None else None,
                 f"warm-up {warm_s:.1f} s" if warm_s is not None else None,
                 f"NCCL {nccl_s:.1f} s" if nccl_s is not None else None,
                 f"move and engine {max(0.0, rest):.1f} s"]
        since = "after its start" if self.started_at is not None else "after its checks"
        return f"ready for epoch {epoch} {now - start:.1f} s {since}: " + ", ".join(p for p in parts if p)
