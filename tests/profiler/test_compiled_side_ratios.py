"""calibrate's compiled/eager ratio, on CUDA also per side: the GPU's (host-free device times) and the
host's apart (``CostParams.compiled_device_ratio``, ``compiled_host_ratio``)."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from executor.profiler import compiled, compute
from planner.model import PRESETS

MS = 1e-3
ROWS = {False: {"forward_s": 0.6 * MS, "forward_host_s": 1.8 * MS, "backward_s": 1.5 * MS, "backward_host_s": 1.7 * MS},
        True: {"forward_s": 0.5 * MS, "forward_host_s": 0.3 * MS, "backward_s": 1.2 * MS, "backward_host_s": 0.4 * MS}}


def _fake(monkeypatch: pytest.MonkeyPatch) -> None:
    def measure_layer(*_: Any, compiled: bool, **__: Any) -> dict[str, float]:
        return dict(ROWS[compiled])

    monkeypatch.setattr(compute, "measure_layer", measure_layer)
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: None)


def test_on_cuda_the_ratio_is_given_per_side_too(monkeypatch: pytest.MonkeyPatch) -> None:
    _fake(monkeypatch)
    got = compiled.compiled_ratio(PRESETS["llama-1.3b"], micro_batch=2, dtype="bf16", device=torch.device("cuda"),
                                  warmup=2, repeats=3)
    assert got["ratio"] == pytest.approx((0.5 + 1.2) / (1.8 + 1.7))  # max(device, host) per pass, both modes
    assert got["device_ratio"] == pytest.approx((0.5 + 1.2) / (0.6 + 1.5))
    assert got["host_ratio"] == pytest.approx((0.3 + 0.4) / (1.8 + 1.7))


def test_on_the_cpu_there_is_one_clock_and_one_ratio(monkeypatch: pytest.MonkeyPatch) -> None:
    _fake(monkeypatch)
    got = compiled.compiled_ratio(PRESETS["llama-1.3b"], micro_batch=2, dtype="bf16", device=torch.device("cpu"),
                                  warmup=2, repeats=3)
    assert "device_ratio" not in got and "host_ratio" not in got
