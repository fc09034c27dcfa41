"""``cp_attention_efficiency`` from a timing (planner.calibration.cp_attention): the fitted term
makes the cost model's CP attention take the measured time, and the estimate follows it."""

from __future__ import annotations

from dataclasses import replace

import pytest

from planner.calibration.cp_attention import BOUNDS, fit_cp_attention
from planner.catalog import default_catalog
from planner.cost.params import DEFAULT_PARAMS
from planner.cost.profile import SpecProfile
from planner.model import PRESETS

H100 = default_catalog().get("h100-sxm", "test")
MODEL = PRESETS["llama-1.3b"]


@pytest.mark.parametrize("measured_s", [0.016, 0.027, 0.055])
def test_the_fit_reproduces_the_measured_time(measured_s: float) -> None:
    fit = fit_cp_attention(measured_s, MODEL, H100, DEFAULT_PARAMS, seq_len=32768, cp=2, dtype="bf16")
    assert BOUNDS[0] < fit.efficiency < BOUNDS[1]
    assert fit.predicted_s == pytest.approx(measured_s, rel=0.01)
    prof = SpecProfile(H100, replace(DEFAULT_PARAMS, cp_attention_efficiency=fit.efficiency))
    f, b = prof.attention_core_time(MODEL, 1, 1, "bf16", "none", 16384, copies=2, cp_kernel=True)
    assert f + b == pytest.approx(fit.predicted_s)


def test_slower_kernels_fit_lower_efficiency_and_impossible_times_clamp() -> None:
    kw = dict(seq_len=32768, cp=2, dtype="bf16")
    fast, slow = (fit_cp_attention(t, MODEL, H100, DEFAULT_PARAMS, **kw).efficiency for t in (0.016, 0.032))
    assert slow == pytest.approx(fast / 2, rel=0.02)
    assert fit_cp_attention(1e-6, MODEL, H100, DEFAULT_PARAMS, **kw).efficiency == BOUNDS[1]
    with pytest.raises(ValueError, match="must be > 0"):
        fit_cp_attention(0.0, MODEL, H100, DEFAULT_PARAMS, **kw)
