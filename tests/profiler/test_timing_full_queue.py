"""Host-free device times (:func:`executor.profiler.timing.phase_times` on CUDA): every repetition is
issued behind a GPU spin that covers the host's issue time of the last one, so the CUDA events time the
device alone. CPU half: the seconds -> cycles conversion, and the CUDA path's order of calls with the
CUDA pieces faked; the CPU path is unchanged (tests/profiler/test_timing_back_to_back.py). GPU half:
tests/gpu/test_profiler_timing_gpu.py."""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest
import torch

from executor.profiler import timing
from executor.profiler.timing import SPIN_FACTOR, SPIN_MARGIN_S, SPIN_MAX_S, spin_cycles


def test_the_spin_lasts_the_factor_times_the_host_time_plus_the_margin_in_cycles() -> None:
    assert spin_cycles(1e-3, 2e9) == round((SPIN_FACTOR * 1e-3 + SPIN_MARGIN_S) * 2e9)
    assert spin_cycles(2e-3, 1e9, factor=2.0, margin_s=0.0) == 4_000_000
    assert spin_cycles(0.0, 1e9) == round(SPIN_MARGIN_S * 1e9) > 0
    assert spin_cycles(30.0, 1e9) == round(SPIN_MAX_S * 1e9)  # a recompiling warm-up does not spin for a minute
    with pytest.raises(ValueError):
        spin_cycles(1e-3, 0.0)


class _FakeMarker:
    def __init__(self, device: torch.device):
        self._t = 0.0

    def record(self) -> None:
        self._t = time.perf_counter()

    def seconds_until(self, other: _FakeMarker) -> float:
        return other._t - self._t

    host_seconds_until = seconds_until


def test_each_cuda_repetition_starts_idle_behind_a_spin_covering_the_last_issue_time(
        monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[tuple[str, float]] = []
    rate = 1e9
    monkeypatch.setattr(timing, "Marker", _FakeMarker)
    monkeypatch.setattr(timing, "cycles_per_second", lambda device: rate)
    monkeypatch.setattr(timing, "synchronize", lambda device: calls.append(("sync", 0.0)))
    monkeypatch.setattr(torch.cuda, "_sleep", lambda cycles: calls.append(("spin", cycles / rate)), raising=False)

    def step(mark: Callable[[int], None]) -> None:
        calls.append(("step", 0.0))
        mark(0)
        time.sleep(0.004)  # the host issuing the repetition
        mark(1)

    got = timing.phase_times(step, 1, torch.device("cuda", 0), warmup=1, repeats=3)
    kinds = [k for k, _ in calls]
    assert kinds == ["sync", "step"] + ["sync", "spin", "step"] * 3 + ["sync"], kinds
    spins = [s for k, s in calls if k == "spin"]
    assert all(s >= SPIN_FACTOR * 0.004 + SPIN_MARGIN_S for s in spins), spins  # each covers an issue
    assert 0.004 <= got.host_s[0] < 0.05, got
