"""GPU half of tests/profiler/test_timing_back_to_back.py (skipped without CUDA; the lead runs it): a
phase whose host side is slow (a 5 ms sleep before its 0.5 ms kernel) is timed at its device time
when the repetition before it left ~10 ms of work queued, as a step's forward is issued while the
previous micro-batch's backward runs. Timed from an idle device it took the host's 5 ms. The host's
issue time of the same phases (:func:`executor.profiler.timing.phase_times`, CPU half:
tests/profiler/test_timing_host.py) holds the slow host's 5 ms and not the device's ~10 ms."""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest
import torch

from executor.profiler.timing import phase_times, time_phases

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]


def _step(mark: Callable[[int], None]) -> None:
    mark(0)
    time.sleep(0.005)  # the host issuing the phase slowly
    torch.cuda._sleep(1_000_000)  # ~0.5-0.7 ms on the device
    mark(1)
    torch.cuda._sleep(20_000_000)  # ~10-14 ms the host runs ahead of
    mark(2)


def test_a_slow_host_is_hidden_behind_the_queued_work() -> None:
    first, second = time_phases(_step, 2, torch.device("cuda", 0), warmup=2, repeats=7)
    assert second > 0.005 and first < 0.003, (first, second)


def test_the_host_time_is_the_issue_time_not_the_device_time() -> None:
    got = phase_times(_step, 2, torch.device("cuda", 0), warmup=2, repeats=7)
    assert got.host_s[0] >= 0.005 and got.host_s[1] < 0.002 < 0.005 < got.device_s[1], got
