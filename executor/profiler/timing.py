"""Timers that wait for the device: CUDA events on a GPU, the host clock on the CPU.

Every measurement warms up first (module load, cuBLAS handle creation and autotuning stay out of the
numbers), then repeats and keeps the median, which is robust to the odd slow repeat.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence

import torch


class Marker:
    """A point in the device's stream of work (a CUDA event, or the host clock after a CPU op)."""

    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"
        self._event = torch.cuda.Event(enable_timing=True) if self.cuda else None
        self._t = 0.0

    def record(self) -> None:
        if self._event is not None:
            self._event.record()
        else:
            self._t = time.perf_counter()

    def seconds_until(self, other: Marker) -> float:
        if self._event is not None and other._event is not None:
            return self._event.elapsed_time(other._event) / 1e3
        return other._t - self._t


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_phases(step: Callable[[Callable[[int], None]], None], phases: int, device: torch.device,
                warmup: int, repeats: int) -> list[float]:
    """Median seconds of each of ``phases`` consecutive phases of ``step``.

    ``step(mark)`` runs one repetition and calls ``mark(i)`` at the start of phase ``i`` and
    ``mark(phases)`` at its end, so one repetition yields every phase (e.g. forward then backward).
    """
    for _ in range(warmup):
        step(lambda i: None)
    synchronize(device)
    samples: list[list[float]] = [[] for _ in range(phases)]
    for _ in range(repeats):
        marks = [Marker(device) for _ in range(phases + 1)]

        def mark(i: int, marks: Sequence[Marker] = marks) -> None:
            marks[i].record()

        step(mark)
        synchronize(device)
        for i in range(phases):
            samples[i].append(marks[i].seconds_until(marks[i + 1]))
    return [statistics.median(s) for s in samples]


def time_call(fn: Callable[[], object], device: torch.device, warmup: int, repeats: int) -> float:
    """Median seconds of ``fn()``."""

    def step(mark: Callable[[int], None]) -> None:
        mark(0)
        fn()
        mark(1)

    return time_phases(step, 1, device, warmup, repeats)[0]
