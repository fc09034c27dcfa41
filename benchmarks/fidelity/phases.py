"""Where a fidelity plan's wall time goes on one rank, phase by phase.

The fidelity program took ~55 s per plan on 4x H100 (2026-11-27) against ~20 s expected; the worker
now records, per plan and rank, ``groups`` (process group and communicators), ``weights`` (the
initial weights the plan's engine loads, drawn before its memory is measured), ``gemm_check``
(:mod:`executor.model.gemm_check`, inside the engine's construction), ``build`` (the rest of the
engine: model, initial weights, optimizer, compile set-up), ``warmup`` and ``steps`` (the untimed and
timed steps), ``traced`` (one more step, span by span: :mod:`benchmarks.fidelity.traced_step`) and
``teardown`` (engine, groups, process group, allocator cache), so a GPU run shows which one to cut.
Each phase ends with a device synchronisation, so queued GPU work is charged to the phase that
queued it.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch

PHASES = ("groups", "weights", "gemm_check", "build", "warmup", "steps", "traced", "teardown")


@dataclass
class PhaseClock:
    device: torch.device
    seconds: dict[str, float] = field(default_factory=dict)

    def add(self, name: str, seconds: float) -> None:
        self.seconds[name] = self.seconds.get(name, 0.0) + seconds

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        t0 = time.perf_counter()
        try:
            yield
        finally:
            if self.device.type == "cuda":
                torch.cuda.synchronize(self.device)
            self.add(name, time.perf_counter() - t0)


def slowest(per_rank: Sequence[Mapping[str, float]]) -> dict[str, float]:
    """Per phase, the slowest rank's seconds (the ranks wait for each other at every phase's end)."""
    out: dict[str, float] = {}
    for rec in per_rank:
        for name, s in rec.items():
            out[name] = max(out.get(name, 0.0), s)
    return out


def describe(seconds: Mapping[str, float]) -> str:
    """``groups 1.2 s, gemm_check 0.4 s, ...`` in :data:`PHASES` order (others after them)."""
    names = [n for n in PHASES if n in seconds] + sorted(set(seconds) - set(PHASES))
    return ", ".join(f"{n} {seconds[n]:.1f} s" for n in names)
