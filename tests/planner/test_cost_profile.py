"""Spec roofline and measured-table profiles; per-stage time."""

from __future__ import annotations

import dataclasses

import pytest
from _cost_fixtures import CATALOG, FAST, MODEL, SLOW, plan
from hypothesis import given, settings
from hypothesis import strategies as st

from planner.catalog import Catalog
from planner.cluster import parse_cluster
from planner.cost import CostParams, MeasuredProfile, ProfileSet, SpecProfile, estimate, stage_memory, stage_time
from planner.cost.ops import GEMM, MEM, Numerics, Op, layer_backward_ops, layer_forward_ops
from planner.errors import SpecError

P = CostParams()
P0 = CostParams(host_overhead_s=0.0, host_overhead_backward_s=0.0)  # GPU time only


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
    num = Numerics.of("bf16", fp32_residual=True, autocast_weight_copies=True, expand_kv_heads=True)
    fwd = layer_forward_ops(MODEL, b, s, tp, num)
    gemm = sum(o.flops for o in fwd if o.kind == GEMM)
    assert gemm == pytest.approx(2 * b * s * (MODEL.layer_params() - 2 * MODEL.hidden_size) / tp)
    attn = sum(o.flops for o in fwd if o.kind == "attn")
    # causal: half of the model's 4·h·s per token forward attention FLOPs (per layer)
    assert attn == pytest.approx(0.5 * b * s * 4 * MODEL.hidden_size * s / tp)
    bwd = layer_backward_ops(MODEL, b, s, tp, num, 2.5)
    assert sum(o.flops for o in bwd if o.kind == GEMM) == pytest.approx(2 * gemm)
    assert sum(o.flops for o in bwd if o.kind == "attn") == pytest.approx(2.5 * attn)


def test_small_passes_are_host_bound() -> None:
    """Eager PyTorch issues kernels from the host: a tiny layer takes kernels x host overhead."""
    prof = SpecProfile(FAST, CostParams(host_overhead_s=1e-4, host_overhead_backward_s=5e-5))
    num = prof.numerics("bf16")
    fwd = layer_forward_ops(MODEL, 1, 16, 1, num)
    bwd = layer_backward_ops(MODEL, 1, 16, 1, num, 2.5)
    t = prof.layer_time(MODEL, 1, 1, "bf16", "none", seq_len=16)
    assert t.forward_s == pytest.approx(sum(o.kernels for o in fwd) * 1e-4)
    assert t.backward_s == pytest.approx(sum(o.kernels for o in bwd) * 5e-5)
    big = prof.layer_time(MODEL, 64, 1, "bf16", "none")
    assert big.forward_s == pytest.approx(sum(prof.op_time(o, "bf16") for o in layer_forward_ops(
        MODEL, 64, MODEL.seq_len, 1, num)))  # large: GPU-bound


def test_recompute_adds_what_it_repeats() -> None:
    prof = SpecProfile(FAST, P0)
    none = prof.layer_time(MODEL, 2, 1, "bf16", "none")
    full = prof.layer_time(MODEL, 2, 1, "bf16", "full")
    sel = prof.layer_time(MODEL, 2, 1, "bf16", "selective")
    assert full.forward_s == none.forward_s == sel.forward_s
    fwd_ops = layer_forward_ops(MODEL, 2, MODEL.seq_len, 1, prof.numerics("bf16"))
    skipped = sum(prof.op_time(o, "bf16") for o in fwd_ops if o.name in ("w_down", "residual_mlp"))
    assert full.backward_s == pytest.approx(none.backward_s + none.forward_s - skipped)
    attn = [o for o in layer_forward_ops(MODEL, 2, MODEL.seq_len, 1, prof.numerics("bf16")) if o.kind == "attn"][0]
    assert sel.backward_s == pytest.approx(none.backward_s + prof.op_time(attn, "bf16"))


def test_slower_device_and_slowdown() -> None:
    fast, slow = SpecProfile(FAST, P0), SpecProfile(SLOW, P0)
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
    assert c.forward_s >= a.forward_s and c.backward_s >= a.backward_s  # equal while host-bound


def _measured_device(rows: list[dict], optimizer: list[dict] | None = None, dtype: str = "bf16") -> Catalog:
    """A catalog entry in the profiler's layout (executor/profiler/store.py)."""
    measured = {"format": "hexiscale.measured/1", "meta": {"mode": "gpu"}, "model": MODEL.to_dict(), "dtype": dtype,
                "layer": rows, "embedding": [], "head": [], "optimizer": optimizer or []}
    return Catalog([dataclasses.replace(FAST, key="meas", derived="measured", measured=measured)])


def _row(mb: int, fwd: float, bwd: float, tp: int = 1, recompute: str = "none", act: float | None = None) -> dict:
    row = {"micro_batch": mb, "seq_len": MODEL.seq_len, "tp": tp, "recompute": recompute, "forward_s": fwd,
           "backward_s": bwd}
    if act is not None:
        row["activation_bytes"] = act
    return row


def test_measured_interpolates_and_transfers_shape() -> None:
    opt = [{"layers": 1, "tp": 1, "seconds": 0.002, "num_params": 1e6, "num_tensors": 9},
           {"layers": 4, "tp": 1, "seconds": 0.0074, "num_params": 4e6, "num_tensors": 36}]
    profs = ProfileSet(_measured_device([_row(1, 2e-3, 4e-3, act=1e6), _row(4, 7e-3, 13e-3, act=4e6),
                                         _row(2, 5e-3, 12e-3, recompute="full")], opt))
    prof = profs.get("meas")
    assert isinstance(prof, MeasuredProfile) and prof.source == "measured"
    assert prof.layer_time(MODEL, 1).forward_s == pytest.approx(2e-3)
    assert prof.layer_time(MODEL, 2).forward_s == pytest.approx((2.0 + 5.0 / 3) * 1e-3)
    assert prof.layer_time(MODEL, 3).backward_s == pytest.approx((4.0 + 2 * 3.0) * 1e-3)
    # outside the range: nearest point times the spec ratio (of the roofline measured tables are carried
    # with, the calibration fit's: a weight cast in every pass, planner.cost.measured.MeasuredProfile)
    spec = SpecProfile(FAST, dataclasses.replace(P, cast_once=False))
    want = 7e-3 * spec.layer_time(MODEL, 8).forward_s / spec.layer_time(MODEL, 4).forward_s
    assert prof.layer_time(MODEL, 8).forward_s == pytest.approx(want)
    # another TP degree: same transfer from the nearest measured configuration
    want_tp = 2e-3 * spec.layer_time(MODEL, 1, 2).forward_s / spec.layer_time(MODEL, 1, 1).forward_s
    assert prof.layer_time(MODEL, 1, 2).forward_s == pytest.approx(want_tp)
    # a recompute mode with rows of its own uses them; one without is derived from 'none'
    assert prof.layer_time(MODEL, 2, recompute="full").backward_s == pytest.approx(12e-3)
    sel = prof.layer_time(MODEL, 4, recompute="selective")
    assert sel.forward_s == pytest.approx(7e-3) and sel.backward_s > 13e-3
    # another model shape or dtype: spec roofline
    other = dataclasses.replace(MODEL, hidden_size=2048, num_heads=16)
    assert prof.layer_time(other, 1).forward_s == pytest.approx(spec.layer_time(other, 1).forward_s)
    assert prof.layer_time(MODEL, 1, dtype="fp32").forward_s == pytest.approx(
        spec.layer_time(MODEL, 1, dtype="fp32").forward_s)
    # activation bytes: interpolated, and None where nothing was measured
    # (the profiler's figures with the input added and the bf16 weight casts taken out)
    shift = 2 * MODEL.seq_len * MODEL.hidden_size * 4 - 2 * (MODEL.layer_params() - 2 * MODEL.hidden_size)
    assert prof.activation_bytes("layer", MODEL, 2) == pytest.approx(2e6 + shift)
    assert prof.activation_bytes("head", MODEL, 2) is None
    assert spec.activation_bytes("layer", MODEL, 2) is None
    # optimizer: the line through both rows (0.2 ms fixed + 1.8 ns per parameter), plus the clipping tail
    assert prof.tables.optimizer_fit == pytest.approx((2e-4, 1.8e-9))
    assert prof.optimizer_time(2e6, 18) == pytest.approx(2e-4 + 2e6 * 1.8e-9 + 2e6 * 12 / (1000e9 * 0.8))
    assert ProfileSet(profs.catalog, prefer_measured=False).get("meas").source == "spec"


def test_measured_profile_drives_the_estimate() -> None:
    rows = [_row(1, 2e-3, 4e-3, act=3e7), _row(2, 4e-3, 8e-3, act=5e7)]
    catalog = _measured_device(rows)
    c = parse_cluster({"nodes": [{"name": "a", "gpu": "meas", "gpus": 1,
                                  "intra_link": {"kind": "nvlink", "bandwidth_GBps": 100}}],
                       "inter_node": {"bandwidth_GBps": 10}}, catalog)
    est = estimate(plan([(4, 2, [(["a:0"], 8)])]), c, ProfileSet(catalog))
    assert est.sources == {"meas": "measured"}
    stage = est.pipelines[0].stages[0]
    assert stage.compute_s > 2 * 8 * (4e-3 + 8e-3)  # 8 measured layers per micro-batch, plus embedding and head
    prof = ProfileSet(catalog).get("meas")
    want = stage_memory(MODEL, layers=8, tp=1, first=True, last=True, micro_batch=2, in_flight=1,
                        layer_activation=prof.activation_bytes("layer", MODEL, 2))
    assert est.memory["a:0"] == want
    spec = estimate(plan([(4, 2, [(["a:0"], 8)])]), c, ProfileSet(catalog, prefer_measured=False))
    assert est.memory["a:0"].activations != spec.memory["a:0"].activations


def test_measured_rejects_malformed_tables() -> None:
    with pytest.raises(SpecError, match="forward_s"):
        ProfileSet(_measured_device([_row(1, -2.0, 4.0)])).get("meas")
    with pytest.raises(SpecError, match="two rows"):
        ProfileSet(_measured_device([_row(1, 2.0, 4.0), _row(1, 3.0, 4.0)])).get("meas")
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


def _launch_bound_pair() -> tuple[SpecProfile, object, CostParams]:
    """A TP-2 pair whose layer passes are launch-bound (1 ms of host time per kernel) over a fast link."""
    from planner.cluster import Link

    params = CostParams(host_overhead_s=1e-3, host_overhead_backward_s=1e-3, collective_host_s=2e-3)
    return SpecProfile(FAST, params), Link(kind="nvlink", bandwidth_GBps=400.0, latency_us=1.0), params


def test_launch_bound_tp_pass_pays_the_host_cost_of_its_collectives() -> None:
    """A launch-bound table point is host time, not compute: issuing the TP all-reduces (and their
    copies) adds to the host's critical path, which the all-reduces' GPU time alone under-states."""
    from planner.cost.stage import tp_collectives

    prof, link, params = _launch_bound_pair()
    lt = prof.layer_time(MODEL, 1, 2)
    gpu, host = prof.pass_split("layer", MODEL, 1, 2)
    assert host.forward_s == lt.forward_s and gpu.forward_s < lt.forward_s  # host-bound: T is the host's
    st = stage_time(MODEL, layers=3, first=False, last=False, micro_batch=1, tp=2, devices=[(prof, 1.0)],
                    tp_link=link, params=params)
    fwd, bwd = tp_collectives(MODEL, layers=3, first=False, last=False, micro_batch=1, dtype="bf16",
                              recompute="none", params=params)
    assert st.forward_compute_s == pytest.approx(3 * lt.forward_s)
    assert st.forward_s == pytest.approx(3 * lt.forward_s + len(fwd) * (2e-3 + 1e-3))
    assert st.backward_s == pytest.approx(3 * lt.backward_s + len(bwd) * (2e-3 + 1e-3))
    # a GPU-bound pass keeps its all-reduces' GPU time on top of compute
    fast = SpecProfile(FAST, P0)
    g = stage_time(MODEL, layers=3, first=False, last=False, micro_batch=4, tp=2, devices=[(fast, 1.0)],
                   tp_link=link, params=P0)
    assert g.forward_tp_s > 0 and g.forward_s == pytest.approx(g.forward_compute_s + g.forward_tp_s)


def test_slowdown_scales_the_gpu_share_only() -> None:
    """Issuing kernels does not slow down with the GPU: a launch-bound pass on a slowed device keeps
    its host time until the slowed GPU time exceeds it."""
    prof, _, _ = _launch_bound_pair()
    gpu, host = prof.pass_split("layer", MODEL, 1, 1)
    kw = dict(layers=2, first=False, last=False, micro_batch=1, tp=1, tp_link=None)
    one = stage_time(MODEL, devices=[(prof, 1.0)], **kw)  # type: ignore[arg-type]
    two = stage_time(MODEL, devices=[(prof, 2.0)], **kw)  # type: ignore[arg-type]
    assert two.forward_s == pytest.approx(2 * max(2 * gpu.forward_s, host.forward_s)) == pytest.approx(one.forward_s)
    slow = host.forward_s / gpu.forward_s * 3
    much = stage_time(MODEL, devices=[(prof, slow)], **kw)  # type: ignore[arg-type]
    assert much.forward_s == pytest.approx(2 * slow * gpu.forward_s)


def test_checkpoint_host_time_lands_on_the_host_side_of_full_recompute() -> None:
    """A host-bound layer under full recompute pays ``checkpoint_host_s`` in its forward and in the
    backward's re-run; a GPU-bound one hides it; the other modes never pay it."""
    host_bound = CostParams(host_overhead_s=1e-3, host_overhead_backward_s=1e-3)
    ck = dataclasses.replace(host_bound, checkpoint_host_s=2e-3)
    plain, with_ck = SpecProfile(FAST, host_bound), SpecProfile(FAST, ck)
    for recompute in ("none", "selective"):
        assert with_ck.layer_time(MODEL, 1, 1, "bf16", recompute) == plain.layer_time(MODEL, 1, 1, "bf16", recompute)
    a, b = plain.layer_time(MODEL, 1, 1, "bf16", "full"), with_ck.layer_time(MODEL, 1, 1, "bf16", "full")
    assert b.forward_s == pytest.approx(a.forward_s + 2e-3)
    assert b.backward_s > a.backward_s + 2e-3 * 0.9  # the re-run pays it again
    gpu, host = with_ck.pass_split("layer", MODEL, 1, 1, "bf16", "full")
    assert host.forward_s == pytest.approx(b.forward_s)  # host-bound: the whole pass is host time
    gpu_bound = SpecProfile(FAST, dataclasses.replace(P0, checkpoint_host_s=1e-9))
    assert gpu_bound.layer_time(MODEL, 1, 1, "bf16", "full").forward_s == pytest.approx(
        SpecProfile(FAST, P0).layer_time(MODEL, 1, 1, "bf16", "full").forward_s)
