"""``executor.switch.elastic_switch.fits_beside``: the elastic job builds the next plan's engine
ahead, beside the running one, only where its state fits next to the running engine's next step
(the allocator's readings faked: this runs without a GPU)."""

from __future__ import annotations

import pytest
import torch

from executor.switch.elastic_switch import fits_beside

GIB = 2**30


def _fake_gpu(monkeypatch: pytest.MonkeyPatch, *, free: int, reserved: int, allocated: int, peak: int) -> None:
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (free, 80 * GIB))
    monkeypatch.setattr(torch.cuda, "memory_reserved", lambda device=None: reserved)
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda device=None: allocated)
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda device=None: peak)


def test_the_state_must_fit_beside_the_last_steps_transient_peak(monkeypatch: pytest.MonkeyPatch) -> None:
    # 10 GiB free on the device + 4 GiB cached free; a step peaks 6 GiB above what stays allocated
    _fake_gpu(monkeypatch, free=10 * GIB, reserved=24 * GIB, allocated=20 * GIB, peak=26 * GIB)
    gpu = torch.device("cuda", 0)
    assert fits_beside(gpu, 8 * GIB)  # 8 + 6 <= 10 + 4
    assert not fits_beside(gpu, 8 * GIB + 1)


def test_always_on_a_cpu() -> None:
    assert fits_beside(torch.device("cpu"), 2**60)
