"""On the CPU the profiler's repetitions run back to back (:func:`executor.profiler.timing.time_phases`):
the device is waited for once, after the last, never between two. On CUDA each repetition starts idle
behind a GPU spin that covers its issue time, so the device is timed from a full queue instead
(tests/profiler/test_timing_full_queue.py; GPU half: tests/gpu/test_profiler_timing_gpu.py)."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

from executor.profiler import timing


def test_the_device_is_waited_for_once_per_measurement(monkeypatch: pytest.MonkeyPatch) -> None:
    waits: list[torch.device] = []
    monkeypatch.setattr(timing, "synchronize", waits.append)
    calls: list[int] = []

    def step(mark: Callable[[int], None]) -> None:
        calls.append(len(calls))
        mark(0)
        mark(1)
        mark(2)

    got = timing.time_phases(step, 2, torch.device("cpu"), warmup=2, repeats=5)
    assert len(calls) == 7 and len(got) == 2 and all(t >= 0 for t in got)
    assert len(waits) == 1
