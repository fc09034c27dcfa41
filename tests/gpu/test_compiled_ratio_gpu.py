"""GPU half of ``hexiscale calibrate``'s compiled/eager ratio (skipped without CUDA): a real layer timed
eager and ``torch.compile``'d on one GPU gives a finite, positive ratio with both rows' peaks; the lead
runs it on the device (with ``python -m benchmarks.planner.fidelity`` for the whole program)."""

from __future__ import annotations

import math

import pytest
import torch

from executor.profiler.compiled import compiled_ratio
from planner.model import ModelSpec

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]


def test_compiled_ratio_on_cuda() -> None:
    model = ModelSpec("gpu-ratio", 1, 1024, 2816, 8, 8, 512, 1024)
    out = compiled_ratio(model, micro_batch=2, dtype="bf16", device=torch.device("cuda", 0), warmup=2, repeats=5,
                         chain=2)
    assert math.isfinite(out["ratio"]) and 0.1 < out["ratio"] < 3.0
    assert out["eager"]["peak_bytes"] > 0 and out["compiled"]["peak_bytes"] > 0
