"""GPU half of what ``hexiscale calibrate`` adds for issue 32 (skipped without CUDA; the lead runs it on
the device, with ``python -m benchmarks.planner.fidelity`` for the whole program): a real layer timed
eager and ``torch.compile``'d gives a finite, positive ratio with both rows' peaks; the layer on packed
rows (bf16: the varlen flash kernel) gives times the packed fit reproduces held out."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
import torch

from executor.profiler.compiled import compiled_ratio
from executor.profiler.packed import measure_packed_layer, packed_kernel, packed_rows, row_totals
from planner.calibration.packed import attention_per_square, fit_packed
from planner.catalog import default_catalog
from planner.cost.pass_times import pass_seconds
from planner.cost.profile import SpecProfile
from planner.model import PRESETS, ModelSpec

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]
MODEL = ModelSpec("gpu-points", 1, 1024, 2816, 8, 8, 512, 1024)
PACKED = replace(PRESETS["llama-1.3b"], seq_len=2048)  # as calibrate times it (issue 32: --seq-len 2048)


def test_compiled_ratio_on_cuda() -> None:
    out = compiled_ratio(MODEL, micro_batch=2, dtype="bf16", device=torch.device("cuda", 0), warmup=2, repeats=5,
                         chain=2)
    assert math.isfinite(out["ratio"]) and 0.1 < out["ratio"] < 3.0
    assert out["eager"]["peak_bytes"] > 0 and out["compiled"]["peak_bytes"] > 0


@pytest.mark.xfail(strict=True, reason="measured on 4x H100 2026-11-27: the a*sum(s^2) + b*sum(s) + c fit missed "
                   "its own packed rows (2K-token rows, launch-bound) by 30.6 %; the per-document form on >= 4K-token "
                   "rows (planner.calibration.packed) holds the recorded tables within 18-27 % held out on CPU but "
                   "has not run here yet (strict: an XPASS means it holds on the GPU, and this marker must go)")
def test_packed_rows_on_cuda_follow_the_varlen_cost() -> None:
    """A llama-1.3b layer (what calibrate times) on calibrate's rows: the fit predicts every row from
    the others within 10 % (issue 32's target for the packed path)."""
    rows = packed_rows(PACKED.seq_len, row_totals(PACKED.seq_len))
    out = measure_packed_layer(PACKED, rows, dtype="bf16", device=torch.device("cuda", 0), warmup=2, repeats=5,
                               chain=4)
    assert all(r["forward_s"] > 0 and r["backward_s"] > 0 and r["peak_bytes"] > 0 for r in out)
    a = attention_per_square(SpecProfile(default_catalog().get("h100-sxm")), PACKED, "bf16")
    # each pass as the planner reads it: max(device, host), the device host-free (planner.cost.pass_times)
    passes = [pass_seconds(r, "forward_s", True) + pass_seconds(r, "backward_s", True) for r in out]
    fit = fit_packed([r["lengths"] for r in out], passes, a)
    print(f"kernel {packed_kernel('bf16', torch.device('cuda', 0))}: {fit}")
    assert fit.held_out < 0.10
