"""Measured layer rows carried to a longer sequence (planner/cost/measured.py rule 3): a recompute
mode's rows by that mode's roofline, the attention core at its kernel's roofline, not the rows' level."""

from __future__ import annotations

import dataclasses

import pytest
from _cost_fixtures import MODEL
from test_cost_profile import P, _measured_device, _row

from planner.cost import ProfileSet, SpecProfile
from planner.cost.context import cp_attention_extra

LONG = dataclasses.replace(MODEL, seq_len=MODEL.seq_len * 32)


def _profile(level: float, full_level: float):  # type: ignore[no-untyped-def]
    # the roofline measured tables are carried with (a weight cast in every pass, as the fit's)
    spec = SpecProfile(_measured_device([]).get("meas"), dataclasses.replace(P, cast_once=False))
    none, full = spec.layer_time(MODEL, 4), spec.layer_time(MODEL, 4, recompute="full")
    rows = [_row(4, none.forward_s * level, none.backward_s * level),
            _row(4, full.forward_s * full_level, full.backward_s * full_level, recompute="full")]
    return ProfileSet(_measured_device(rows), P).get("meas"), spec


def test_full_recompute_at_a_long_sequence_adds_about_one_forward() -> None:
    prof, spec = _profile(1.0, 1.0)
    none, full = prof.layer_time(LONG, 4), prof.layer_time(LONG, 4, recompute="full")
    want = spec.layer_time(LONG, 4, recompute="full").backward_s - spec.layer_time(LONG, 4).backward_s
    assert full.backward_s - none.backward_s == pytest.approx(want, rel=0.02)


def test_the_rows_level_does_not_scale_the_attention_core() -> None:
    prof, spec = _profile(2.0, 2.0)  # rows twice the roofline at the short sequence
    attn_f, attn_b = prof.attention_core_time(LONG, 4, 1, "bf16", "none", LONG.seq_len)
    got, sp = prof.layer_time(LONG, 4), spec.layer_time(LONG, 4)
    assert got.forward_s == pytest.approx(2 * (sp.forward_s - attn_f) + attn_f, rel=0.02)
    assert got.backward_s == pytest.approx(2 * (sp.backward_s - attn_b) + attn_b, rel=0.02)


def test_cp_attention_priced_on_its_own_kernel() -> None:
    slow = dataclasses.replace(P, cp_attention_efficiency=P.attention_efficiency / 2)
    same, half = SpecProfile(_measured_device([]).get("meas"), P), SpecProfile(_measured_device([]).get("meas"), slow)
    kw = {"micro_batch": 1, "tp": 1, "cp": 4, "dtype": "bf16", "recompute": "none", "seq_len": LONG.seq_len}
    f1, _ = same.attention_core_time(LONG, 1, 1, "bf16", "none", LONG.seq_len // 4)
    assert cp_attention_extra(LONG, same, **kw).forward_s == pytest.approx(3 * f1, rel=0.01)  # a launch apart
    assert cp_attention_extra(LONG, half, **kw).forward_s == pytest.approx(7 * f1, rel=0.02)
