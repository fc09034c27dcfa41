"""GPU half of tests/profiler/test_timing_full_queue.py and test_timing_host.py (skipped without CUDA;
the lead runs it): :func:`executor.profiler.timing.phase_times` times each repetition behind a GPU spin
that covers the host's issue time, so a phase whose host side is slow (a 5 ms sleep before its 0.5 ms
kernel) is timed at its device time, a launch-bound layer (the host slower than the GPU) at less than
its host time, and a device-bound GEMM as long as back-to-back repetitions without any spin time it
(the spin never leaks into the interval). The host's issue time of the same phases holds the slow
host's 5 ms and not the device's ~10 ms."""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest
import torch

from executor.profiler import compute
from executor.profiler.timing import phase_times, time_call, time_phases
from planner.model import PRESETS

# alone: its timings compare intervals a few percent apart, which another process on the GPU would skew
pytestmark = [pytest.mark.gpu, pytest.mark.gpu_alone,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]


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


def test_a_launch_bound_pass_is_timed_below_its_host_time() -> None:
    x = torch.zeros(16, device="cuda")

    def tiny_kernels(mark: Callable[[int], None]) -> None:
        mark(0)
        for _ in range(300):  # ~300 launches: the host takes longer than the GPU's ~1-2 us each
            x.add_(1.0)
        mark(1)

    got = phase_times(tiny_kernels, 1, torch.device("cuda", 0), warmup=2, repeats=7)
    assert got.device_s[0] < 0.7 * got.host_s[0], got


def test_a_launch_bound_layer_row_has_its_device_time_below_its_host_time() -> None:
    row = compute.measure_layer(PRESETS["llama-1.3b"], micro_batch=1, seq_len=256, tp=4, recompute="none",
                                dtype="bf16", device=torch.device("cuda", 0), warmup=2, repeats=5, chain=4)
    assert row["forward_s"] < row["forward_host_s"] and row["backward_s"] < row["backward_host_s"], row


def test_the_spin_does_not_leak_into_a_device_bound_gemm() -> None:
    dev = torch.device("cuda", 0)
    a = torch.randn(8192, 8192, device=dev, dtype=torch.bfloat16)
    b = torch.randn(8192, 8192, device=dev, dtype=torch.bfloat16)
    spun = time_call(lambda: a @ b, dev, warmup=2, repeats=9)
    n = 20  # the reference: n GEMMs back to back, no spin, one pair of events
    for _ in range(3):
        a @ b
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(n):
        a @ b
    end.record()
    end.synchronize()
    plain = start.elapsed_time(end) / 1e3 / n
    assert spun == pytest.approx(plain, rel=0.04), (spun, plain)


def test_idle_host_times_come_from_repetitions_without_the_spin(monkeypatch: pytest.MonkeyPatch) -> None:
    """``HOST_TIMES = "idle"``: the device times are still the spun repetitions' (the slow host stays
    hidden), the host times those of an idle GPU's repetitions (the same issue time here: a sleep)."""
    from executor.profiler import timing

    monkeypatch.setattr(timing, "HOST_TIMES", "idle")
    got = phase_times(_step, 2, torch.device("cuda", 0), warmup=2, repeats=7)
    assert got.device_s[0] < 0.003 and got.host_s[0] >= 0.005 and got.host_s[1] < 0.002 < 0.005 < got.device_s[1], got
