"""Live TP rows (``"collectives": true``): a layer measured on ``tp`` ranks with its real all-reduces
answers for that TP degree, and the stage model adds no second copy of the layer's all-reduces
(planner/cost/measured.py rule 6, planner/cost/stage.py). Profiles without the flag — every
packaged one — predict exactly what they predicted before the flag existed."""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

import pytest

from planner.calibration.fit import compute_observations
from planner.catalog import Catalog, DeviceType, default_catalog, parse_device_entry, profiles_dir
from planner.cluster import Link
from planner.cost import ProfileSet, estimate, stage_time
from planner.cost.measured import MeasuredProfile
from planner.cost.params import DEFAULT_PARAMS
from planner.cost.stage import tp_collective_time
from planner.errors import SpecError
from planner.model import PRESETS
from planner.plan import Pipeline, Plan, PlanOptions, Stage

MODEL = replace(PRESETS["llama-1.3b"], seq_len=2048)  # the model h200-measured was profiled with
LINK = Link(bandwidth_GBps=450.0, latency_us=10.0, kind="nvlink")
# the live TP-2 layer as measured in the tp2-1-1 run on 4 x H200 (forward, backward per layer);
# micro-batch 2 measured a little faster than 1 (noise), which the tables must not believe
LIVE = {1: (2.35e-3, 3.2e-3), 2: (2.30e-3, 3.6e-3), 4: (2.9e-3, 5.0e-3)}
MB1 = ((LIVE[1][0] + LIVE[2][0]) / 2, LIVE[1][1])  # what the tables make of micro-batch 1 (isotonic)


def _entry(live: dict[int, tuple[float, float]] | None = None, **extra: Any) -> DeviceType:
    """The packaged h200-measured entry, plus live TP-2 rows at the model's sequence length."""
    data = json.loads((profiles_dir() / "devices" / "h200-measured.json").read_text())
    for mb, (f, b) in (live or {}).items():
        data["measured"]["layer"].append({"micro_batch": mb, "seq_len": 2048, "tp": 2, "recompute": "none",
                                          "forward_s": f, "backward_s": b, "chain": 4, "collectives": True,
                                          **extra})
    return parse_device_entry(data, "test")


def _stage(prof: MeasuredProfile, *, layers: int = 12, first: bool = False, last: bool = False, mb: int = 1,
           recompute: str = "none", tp: int = 2):  # type: ignore[no-untyped-def]
    return stage_time(MODEL, layers=layers, first=first, last=last, micro_batch=mb, tp=tp, devices=[(prof, 1.0)],
                      tp_link=LINK, dtype="bf16", recompute=recompute, params=DEFAULT_PARAMS)


# Computed with the code before live rows existed (commit 4f1c0c7), DEFAULT_PARAMS, the packaged
# h200-measured profile: (layers, first, last, micro_batch, recompute, tp) -> StageTime's four terms,
# and host4 plans' step times on its cluster (the packaged calibration; updated when the whole GPU's
# rows came to be bounded by its MPS shares' timed beside it, planner/cost/measured.py rule 7: the packaged
# h200-measured rows above its packaged shares' at TP 2 moved three of them by 3-8 %). The selective and full rows at
# another TP degree or micro-batch were updated when a recompute mode's curve came to be carried by
# that mode's roofline, not none's (planner/cost/measured.py rule 3).
OLD_STAGES: dict[tuple[int, bool, bool, int, str, int], tuple[float, ...]] = {
    (12, False, False, 1, "none", 2):
        (0.01326530420780182, 0.017983055591583252, 0.0014400000000000003, 0.0018384032627450989),
    (12, False, False, 1, "none", 4):
        (0.01326530420780182, 0.017983055591583252, 0.002213545662745099, 0.00332474729411765),
    (12, True, False, 3, "full", 2):
        (0.019486432095989582, 0.04828448283756981, 0.0026514053019607853, 0.005598012235294117),
    (12, True, False, 3, "full", 4):
        (0.019486432095989582, 0.04151573061687636, 0.004506714352941178, 0.009011802352941169),
    (6, False, True, 8, "selective", 2):
        (0.020769566348007445, 0.044704672030777264, 0.002861422933333333, 0.005782414138562092),
    (6, False, True, 8, "selective", 4):
        (0.013932856492189949, 0.03245374042181443, 0.004434625003921569, 0.008583238274509804),
    (24, True, True, 2, "none", 2):
        (0.03606244835630059, 0.050651776760816586, 0.003854160899346405, 0.006330813322875814),
    (24, True, True, 2, "none", 4):
        (0.03543369157091367, 0.04794824118120521, 0.006950839466666671, 0.010440051450980384),
    (12, False, False, 4, "full", 2):
        (0.019809167861938478, 0.055413454075044215, 0.003100806525490194, 0.007176016313725497),
    (12, False, False, 4, "full", 4):
        (0.019809167861938478, 0.04678963943762904, 0.0051134945882352935, 0.011247736470588222),
    (12, True, False, 1, "none", 2):
        (0.013323064208030701, 0.0182628476023674, 0.0014999999999999996, 0.0018384032627450989),
    (12, True, False, 1, "none", 4):
        (0.013323064208030701, 0.018144410855117643, 0.0023520768, 0.00332474729411765),
}
OLD_STEPS: dict[str, float] = {
    "sm100x4/1.3b-tp2-1-1": 0.5287257133063061,
    "sm100x4/1.3b-tp2xdp2": 0.38936905482172623,
    "sm100x4/1.3b-tp1-2|single": 0.44540284654915896,
    "sm100x4/1.3b-tp4-m4": 0.5399111640546721,
    "sm100x4/7b-tp2xpp2-m8": 0.736537708802855,
    "sm100-100-50-50/mps-1.3b-tp2-fast|tp2-slow": 0.7518018771652201,
}


def test_unflagged_profiles_predict_exactly_as_before() -> None:
    prof = MeasuredProfile(default_catalog().get("h200-measured"), DEFAULT_PARAMS)
    assert not prof.live_tps and not prof.layer_holds_collectives(MODEL, 1, 2, "bf16")
    for (layers, first, last, mb, rc, tp), want in OLD_STAGES.items():
        st = _stage(prof, layers=layers, first=first, last=last, mb=mb, recompute=rc, tp=tp)
        got = (st.forward_compute_s, st.backward_compute_s, st.forward_tp_s, st.backward_tp_s)
        assert got == pytest.approx(want, rel=1e-12, abs=0.0), (layers, first, last, mb, rc, tp)
    for name, want in OLD_STEPS.items():
        assert _host4_step(name) == pytest.approx(want, rel=1e-12, abs=0.0), name


def _host4_step(name: str) -> float:
    from benchmarks.fidelity.host4 import cluster_for, launches

    plans = {f"{launch}/{pn}": (sm, plan) for launch, sm, ps in launches(False) for pn, plan in ps}
    sm, plan = plans[name]
    return estimate(plan, cluster_for(sm, "h200-measured", False), ProfileSet(default_catalog())).step_time_s


def test_live_rows_set_the_layer_time_of_their_tp_degree_only() -> None:
    prof = MeasuredProfile(_entry(LIVE), DEFAULT_PARAMS)
    old = MeasuredProfile(_entry(), DEFAULT_PARAMS)
    assert prof.live_tps == {2}
    assert prof.layer_holds_collectives(MODEL, 1, 2, "bf16")
    assert not prof.layer_holds_collectives(MODEL, 1, 1, "bf16") and not prof.layer_holds_collectives(MODEL, 1, 4)
    assert not prof.layer_holds_collectives(MODEL, 1, 2, "fp32")  # the tables are bf16: the roofline answers
    # the rows, noise made monotone (isotonic: the forwards of micro-batches 1 and 2 pooled)
    lt = prof.layer_time(MODEL, 1, 2, "bf16")
    assert (lt.forward_s, lt.backward_s) == pytest.approx(MB1, rel=1e-12)
    assert prof.layer_time(MODEL, 2, 2).forward_s == pytest.approx(MB1[0], rel=1e-12)
    mb3 = prof.layer_time(MODEL, 3, 2)
    assert mb3.backward_s == pytest.approx((LIVE[2][1] + LIVE[4][1]) / 2)
    times = [prof.layer_time(MODEL, mb, 2) for mb in range(1, 13)]
    for a, b in zip(times, times[1:]):  # beyond the rows the roofline extends the live curve, monotone
        assert a.forward_s <= b.forward_s and a.backward_s <= b.backward_s
    # other TP degrees, the shard-only reads (memory) and the embedding are the unflagged profile's
    for tp in (1, 4):
        assert prof.layer_time(MODEL, 2, tp) == old.layer_time(MODEL, 2, tp)
    assert prof.activation_bytes("layer", MODEL, 2, 2) == old.activation_bytes("layer", MODEL, 2, 2)
    assert prof.embedding_time(MODEL, 1, 2) == old.embedding_time(MODEL, 1, 2)


def test_recompute_modes_add_their_shard_only_extra_to_the_live_rows() -> None:
    prof = MeasuredProfile(_entry(LIVE), DEFAULT_PARAMS)
    old = MeasuredProfile(_entry(), DEFAULT_PARAMS)
    none = prof.layer_time(MODEL, 1, 2)
    for rc in ("selective", "full"):
        got, extra = prof.layer_time(MODEL, 1, 2, "bf16", rc), old.layer_time(MODEL, 1, 2, "bf16", rc)
        base = old.layer_time(MODEL, 1, 2)
        assert got.forward_s == pytest.approx(none.forward_s + extra.forward_s - base.forward_s)
        assert got.backward_s == pytest.approx(none.backward_s + extra.backward_s - base.backward_s)
        assert got.forward_s >= none.forward_s and got.backward_s >= none.backward_s


def test_a_live_stage_is_its_rows_without_a_second_all_reduce_term() -> None:
    prof = MeasuredProfile(_entry(LIVE), DEFAULT_PARAMS)
    old = MeasuredProfile(_entry(), DEFAULT_PARAMS)
    f, b = MB1
    # a middle stage: exactly the rows times the layers, no TP term at all
    st = _stage(prof)
    assert (st.forward_s, st.backward_s) == pytest.approx((12 * f, 12 * b), rel=1e-12)
    assert st.forward_tp_s == st.backward_tp_s == 0.0
    # the same stage on the unflagged profile: shard compute plus the modelled all-reduces
    was = _stage(old)
    assert was.forward_tp_s > 0 and was.backward_tp_s > 0
    assert st.forward_s + st.backward_s > was.forward_s + was.backward_s  # the live rows are the slower truth
    # first + last stage: the rows, plus the embedding, the head and THEIR collectives (what a stage
    # without layers costs), which live layer rows do not hold
    edge = _stage(prof, layers=12, first=True, last=True)
    bare = _stage(prof, layers=0, first=True, last=True)
    assert bare.forward_tp_s > 0 and bare.backward_tp_s > 0
    assert edge.forward_s == pytest.approx(12 * f + bare.forward_s, rel=1e-9)
    assert edge.backward_s == pytest.approx(12 * b + bare.backward_s, rel=1e-9)
    # full recompute repeats the wo all-reduce in the backward, which the live rows (recompute none)
    # did not time: that one stays, the layers' own four do not
    full = _stage(prof, recompute="full")
    kw = dict(layers=12, first=False, last=False, micro_batch=1, tp=2, devices=[(prof, 1.0)], tp_link=LINK,
              dtype="bf16", recompute="full", params=DEFAULT_PARAMS, seq_len=None)
    live_terms, all_terms = tp_collective_time(MODEL, **kw, in_layer_time=True), tp_collective_time(
        MODEL, **kw, in_layer_time=False)
    assert live_terms[0] == live_terms[2] == 0.0 and 0 < live_terms[1] < all_terms[1]
    assert full.forward_tp_s == 0.0 and full.backward_tp_s == pytest.approx(live_terms[1], rel=1e-9)
    # TP 4 has no live rows: the old composition, all-reduces modelled
    assert _stage(prof, tp=4) == _stage(old, tp=4)
    # a TP group of two profiles (one with live rows): each device is composed by its own profile,
    # the slower sets the pace
    mixed = stage_time(MODEL, layers=12, first=False, last=False, micro_batch=1, tp=2,
                       devices=[(old, 1.0), (prof, 1.0)], tp_link=LINK, dtype="bf16", params=DEFAULT_PARAMS)
    assert mixed.slowest == 1 and (mixed.forward_s, mixed.backward_s) == (st.forward_s, st.backward_s)


def test_a_plan_on_live_rows_is_priced_by_them() -> None:
    """The estimate of a TP-2 plan reads the live rows through the whole step model."""
    live_entry = _entry(LIVE)
    catalog = default_catalog()
    plain = ProfileSet(catalog, DEFAULT_PARAMS)
    entries = [live_entry if k == "h200-measured" else catalog.get(k) for k in catalog.keys()]
    from benchmarks.fidelity.host4 import cluster_for

    live = ProfileSet(Catalog(entries), DEFAULT_PARAMS)
    cluster = cluster_for((100, 100, 100, 100), "h200-measured", False)
    stages = (Stage(("g0:0", "g1:0"), 2, (0, 12)), Stage(("g2:0",), 1, (12, 18)), Stage(("g3:0",), 1, (18, 24)))
    plan = Plan(MODEL, 16, (Pipeline(16, 16, stages, "1f1b"),), PlanOptions())
    a, b = estimate(plan, cluster, plain), estimate(plan, cluster, live)
    assert b.step_time_s > a.step_time_s
    s0 = b.pipelines[0].stages[0]
    assert s0.forward_s == pytest.approx(12 * MB1[0] + _stage(live.get("h200-measured"), layers=0,  # type: ignore[arg-type]
                                                                  first=True).forward_s, rel=1e-9)


@pytest.mark.parametrize(("extra", "where"), [({"collectives": "yes"}, "collectives"),
                                              ({"tp": 1}, "collectives"),
                                              ({"recompute": "full"}, "collectives")])
def test_malformed_live_rows_are_named(extra: dict[str, Any], where: str) -> None:
    with pytest.raises(SpecError) as err:
        MeasuredProfile(_entry({1: LIVE[1]}, **extra), DEFAULT_PARAMS)
    assert where in str(err.value)


def test_the_roofline_fit_never_sees_live_rows() -> None:
    entry = _entry(LIVE)
    obs = compute_observations(entry)
    assert obs and not any(row.get("collectives") for _, _, row, _, _ in obs)
    assert len(obs) == len(compute_observations(_entry()))
    json.dumps([o[2] for o in obs])  # rows stay plain data
