"""The host's issue time beside every timed phase (:func:`executor.profiler.timing.phase_times`): on the
CPU the host is the device, so a phase that sleeps on the host is timed the same by both clocks; the
layer rows carry it (``forward_host_s``, ``backward_host_s``, per layer of a chain). The GPU half, where
the two differ: tests/gpu/test_profiler_timing_gpu.py."""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest
import torch

from executor.profiler import compute
from executor.profiler.timing import PhaseTimes, phase_times, time_phases
from planner.model import PRESETS

CPU = torch.device("cpu")
SLEEPS = (0.002, 0.006)


def _sleeping(mark: Callable[[int], None]) -> None:
    for i, s in enumerate(SLEEPS):
        mark(i)
        time.sleep(s)
    mark(len(SLEEPS))


def test_a_phase_that_sleeps_on_the_host_takes_the_host_as_long_as_it_takes_the_cpu() -> None:
    got = phase_times(_sleeping, 2, CPU, warmup=1, repeats=3)
    assert isinstance(got, PhaseTimes) and len(got.device_s) == len(got.host_s) == 2
    assert got.host_s == got.device_s  # one clock on the CPU
    for host, slept in zip(got.host_s, SLEEPS, strict=True):
        assert slept <= host < slept + 0.05, got  # a busy shared host overshoots a sleep
    assert time_phases(_sleeping, 2, CPU, warmup=0, repeats=1) == pytest.approx(list(SLEEPS), abs=0.05)


def test_layer_rows_carry_the_host_time_of_each_pass_per_layer_of_the_chain() -> None:
    row = compute.measure_layer(PRESETS["tiny"], micro_batch=1, seq_len=16, tp=1, recompute="none", dtype="fp32",
                                device=CPU, warmup=0, repeats=1, chain=2)
    assert set(compute.TIME_KEYS) <= row.keys()
    assert row["forward_host_s"] == row["forward_s"] > 0 and row["backward_host_s"] == row["backward_s"] > 0


def test_the_optimizer_row_takes_the_larger_of_its_device_and_host_times() -> None:
    row = compute.measure_optimizer(PRESETS["tiny"], layers=1, tp=1, device=CPU, warmup=0, repeats=1)
    assert row["seconds"] == max(row["device_s"], row["host_s"]) > 0
