"""Spec roofline and measured-table profiles; per-stage time."""

from __future__ import annotations

import dataclasses

import pytest
from _cost_fixtures import CATALOG, FAST, MODEL, SLOW
from hypothesis import given, settings
from hypothesis import strategies as st

from planner.catalog import Catalog
from planner.cost import CostParams, MeasuredProfile, ProfileSet, SpecProfile, stage_time
from planner.cost.ops import GEMM, MEM, Op, layer_backward_ops, layer_forward_ops
from planner.errors import SpecError

P = CostParams()


def test_gemm_op_time_by_hand() -> None:
    prof = SpecProfile(FAST, P)
    op = Op("g", GEMM, 2.0 * 1024**3, 2 * 3 * 1024**2, dim=1024)
    eff = 0.80 * 1024 / (1024 + 96)
    want = 4e-6 + max(2.0 * 1024**3 / (100e12 * eff), 2 * 3 * 1024**2 / (1000e9 * 0.8))
    assert prof.op_time(op, "bf16") == pytest.approx(want)
    # fp32 uses the fp32 peak (4x slower here)
    want32 = 4e-6 + 2.0 * 1024**3 / (25e12 * eff)
    assert prof.op_time(op, "fp32") == pytest.approx(want32)
    mem = Op("n", MEM, 0.0, 8e6, kernels=2)
    assert prof.op_time(mem, "bf16") == pytest.approx(2 * 4e-6 + 8e6 / 800e9)


@pytest.mark.parametrize("tp", [1, 2, 4])
def test_layer_flops_match_the_model_counts(tp: int) -> None:
    b, s = 2, MODEL.seq_len
    fwd = layer_forward_ops(MODEL, b, s, tp, "bf16")
    gemm = sum(o.flops for o in fwd if o.kind == GEMM)
    assert gemm == pytest.approx(2 * b * s * (MODEL.layer_params() - 2 * MODEL.hidden_size) / tp)
    attn = sum(o.flops for o in fwd if o.kind == "attn")
    # causal: half of the model's 4·h·s per token forward attention FLOPs (per layer)
    assert attn == pytest.approx(0.5 * b * s * 4 * MODEL.hidden_size * s / tp)
    bwd = layer_backward_ops(MODEL, b, s, tp, "bf16", 2.5)
    assert sum(o.flops for o in bwd if o.kind == GEMM) == pytest.approx(2 * gemm)
    assert sum(o.flops for o in bwd if o.kind == "attn") == pytest.approx(2.5 * attn)


def test_recompute_adds_what_it_repeats() -> None:
    prof = SpecProfile(FAST, P)
    none = prof.layer_time(MODEL, 2, 1, "bf16", "none")
    full = prof.layer_time(MODEL, 2, 1, "bf16", "full")
    sel = prof.layer_time(MODEL, 2, 1, "bf16", "selective")
    assert full.forward_s == none.forward_s == sel.forward_s
    assert full.backward_s == pytest.approx(none.backward_s + none.forward_s)
    attn = [o for o in layer_forward_ops(MODEL, 2, MODEL.seq_len, 1, "bf16") if o.kind == "attn"][0]
    assert sel.backward_s == pytest.approx(none.backward_s + prof.op_time(attn, "bf16"))


def test_slower_device_and_slowdown() -> None:
    fast, slow = SpecProfile(FAST, P), SpecProfile(SLOW, P)
    assert slow.layer_time(MODEL, 4).forward_s > fast.layer_time(MODEL, 4).forward_s
    base = stage_time(MODEL, layers=2, first=False, last=False, micro_batch=1, tp=1, devices=[(fast, 1.0)],
                      tp_link=None)
    slowed = stage_time(MODEL, layers=2, first=False, last=False, micro_batch=1, tp=1, devices=[(fast, 1.5)],
                        tp_link=None)
    assert slowed.forward_s == pytest.approx(1.5 * base.forward_s)
    assert slowed.backward_s == pytest.approx(1.5 * base.backward_s)
    # a mixed TP group runs at its slowest member
    mixed = stage_time(MODEL, layers=2, first=False, last=False, micro_batch=1, tp=2,
                       devices=[(fast, 1.0), (slow, 1.0)], tp_link=None)
    assert mixed.slowest == 1
    assert mixed.forward_compute_s == pytest.approx(slow.layer_time(MODEL, 1, 2).forward_s * 2)


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 7), st.integers(1, 8), st.sampled_from([1, 2, 4, 8]), st.booleans(), st.booleans(),
       st.sampled_from(["none", "selective", "full"]))
def test_adding_a_layer_never_lowers_stage_time(n: int, mb: int, tp: int, first: bool, last: bool,
                                                recompute: str) -> None:
    prof = ProfileSet(CATALOG).get("slow")
    kw = dict(first=first, last=last, micro_batch=mb, tp=tp, devices=[(prof, 1.0)], tp_link=None,
              recompute=recompute)
    a = stage_time(MODEL, layers=n, **kw)  # type: ignore[arg-type]
    b = stage_time(MODEL, layers=n + 1, **kw)  # type: ignore[arg-type]
    assert b.forward_s > a.forward_s and b.backward_s > a.backward_s
    # and a larger micro-batch never takes less time
    c = stage_time(MODEL, layers=n, **{**kw, "micro_batch": mb + 1})  # type: ignore[arg-type]
    assert c.forward_s > a.forward_s


def _measured_device(points: list[list[float]], tp: int = 1, seq: int = MODEL.seq_len) -> Catalog:
    shape = {k: getattr(MODEL, k) for k in ("hidden_size", "ffn_hidden_size", "num_heads", "num_kv_heads")}
    measured = {"format": "hexiscale.measured/1", "dtype": "bf16",
                "layer": [{"model": shape, "tp": tp, "seq_len": seq, "points": points}],
                "optimizer": {"bytes_per_s": 5e11}}
    return Catalog([dataclasses.replace(FAST, key="meas", derived="measured", measured=measured)])


def test_measured_interpolates_and_transfers_shape() -> None:
    profs = ProfileSet(_measured_device([[1, 2.0, 4.0], [4, 7.0, 13.0]]))
    prof = profs.get("meas")
    assert isinstance(prof, MeasuredProfile) and prof.source == "measured"
    assert prof.layer_time(MODEL, 1).forward_s == pytest.approx(2e-3)
    assert prof.layer_time(MODEL, 2).forward_s == pytest.approx((2.0 + 5.0 / 3) * 1e-3)
    assert prof.layer_time(MODEL, 3).backward_s == pytest.approx((4.0 + 2 * 3.0) * 1e-3)
    # outside the range: nearest point times the spec ratio
    spec = SpecProfile(FAST, P)
    want = 7e-3 * spec.layer_time(MODEL, 8).forward_s / spec.layer_time(MODEL, 4).forward_s
    assert prof.layer_time(MODEL, 8).forward_s == pytest.approx(want)
    # another TP degree: same transfer from the nearest measured configuration
    want_tp = 2e-3 * spec.layer_time(MODEL, 1, 2).forward_s / spec.layer_time(MODEL, 1, 1).forward_s
    assert prof.layer_time(MODEL, 1, 2).forward_s == pytest.approx(want_tp)
    # full recompute adds the measured forward
    assert prof.layer_time(MODEL, 4, recompute="full").backward_s == pytest.approx(20e-3)
    # another model shape or dtype: spec roofline
    other = dataclasses.replace(MODEL, hidden_size=2048, num_heads=16)
    assert prof.layer_time(other, 1).forward_s == pytest.approx(spec.layer_time(other, 1).forward_s)
    assert prof.layer_time(MODEL, 1, dtype="fp32").forward_s == pytest.approx(
        spec.layer_time(MODEL, 1, dtype="fp32").forward_s)
    assert prof.optimizer_time(1e6, 1) == pytest.approx(4e-6 + 1e6 * 34 / 5e11)
    assert ProfileSet(profs.catalog, prefer_measured=False).get("meas").source == "spec"


def test_measured_rejects_malformed_tables() -> None:
    with pytest.raises(SpecError, match="points"):
        ProfileSet(_measured_device([[1, -2.0, 4.0]])).get("meas")
    bad = Catalog([dataclasses.replace(FAST, key="meas", measured={"format": "nope"})])
    with pytest.raises(SpecError, match="format"):
        ProfileSet(bad).get("meas")


def test_bad_arguments_are_spec_errors() -> None:
    prof = SpecProfile(FAST, P)
    with pytest.raises(SpecError):
        prof.layer_time(MODEL, 1, recompute="most")
    with pytest.raises(SpecError):
        CostParams(gemm_efficiency=1.5)
    with pytest.raises(SpecError):
        CostParams(allreduce_algo="magic")
