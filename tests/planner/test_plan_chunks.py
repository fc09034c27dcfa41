"""Stages of an interleaved pipeline hold several layer ranges (planner.plan): JSON ``[[a, b], ...]``
in format /2, plain plans read and written as before, one SpecError line per broken rule; the
layout (planner.layout) holds, syncs and connects every chunk."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from planner.errors import SpecError
from planner.interleave import interleaved
from planner.layout import build_topology, logical_params, stage_params
from planner.model import PRESETS
from planner.plan import PLAN_FORMAT, PLAN_FORMAT_CP, Pipeline, Plan, Stage, plan_from_dict, plan_to_dict

TINY8 = PRESETS["tiny-8l"]


def _plain(tps: list[int], counts: list[int], m: int = 4, batch: int = 4, node: str = "d") -> Pipeline:
    stages, lo, dev = [], 0, 0
    for tp, n in zip(tps, counts):
        stages.append(Stage(tuple(f"{node}:{dev + i}" for i in range(tp)), tp, (lo, lo + n)))
        lo, dev = lo + n, dev + tp
    return Pipeline(batch, m, tuple(stages))


def _plan(*pipes: Pipeline) -> Plan:
    return Plan(TINY8, sum(p.batch_size for p in pipes), pipes)


def test_interleave_worked_example() -> None:
    """Two stages of 5 and 3 layers: chunks in virtual order s0c0 s1c0 s0c1 s1c1."""
    pipe = interleaved(_plain([1, 1], [5, 3]))
    assert [s.chunks for s in pipe.stages] == [((0, 3), (5, 7)), ((3, 5), (7, 8))]
    assert [s.layers for s in pipe.stages] == [(0, 3), (3, 5)] and [s.num_layers for s in pipe.stages] == [5, 3]
    assert pipe.schedule == "interleaved-1f1b"


def test_json_round_trip_and_plain_plans_unchanged() -> None:
    plan = _plan(interleaved(_plain([2, 1], [4, 4])))
    data = plan_to_dict(plan)
    assert data["format"] == PLAN_FORMAT_CP
    assert [s["layers"] for s in data["pipelines"][0]["stages"]] == [[[0, 2], [4, 6]], [[2, 4], [6, 8]]]
    assert plan_from_dict(json.loads(json.dumps(data))) == plan
    plain = _plan(_plain([2, 1], [4, 4]))
    pdata = plan_to_dict(plain)
    assert pdata["format"] == PLAN_FORMAT and [s["layers"] for s in pdata["pipelines"][0]["stages"]] == [[0, 4], [4, 8]]
    assert plan_from_dict(pdata) == plain
    data["format"] = PLAN_FORMAT
    with pytest.raises(SpecError, match=r"^pipelines\[0\]\.stages\[0\]\.layers: 'hexiscale.plan/1' has one layer "
                                        r"range per stage \(hint: write format 'hexiscale.plan/2'"):
        plan_from_dict(data)


def _broken(chunks: list[list[tuple[int, int]]]) -> str:
    pipe = interleaved(_plain([1, 1], [4, 4]))
    stages = tuple(replace(s, layers=c[0], chunks=tuple(c)) for s, c in zip(pipe.stages, chunks))
    with pytest.raises(SpecError) as e:
        _plan(replace(pipe, stages=stages))
    assert "\n" not in str(e.value)
    return str(e.value)


def test_each_broken_rule_is_one_line_naming_the_field() -> None:
    assert _broken([[(0, 2), (4, 6)], [(2, 4)]]).startswith(
        "pipelines[0].stages[1].layers: holds 1 layer range(s), schedule interleaved-1f1b runs 2 layer chunk(s)")
    assert _broken([[(0, 2), (5, 6)], [(2, 4), (6, 8)]]).startswith(
        "pipelines[0].stages[0].layers[1]: starts at 5, expected 4 (hint: virtual stages (chunk k of stage s is "
        "k x 2 + s) must cover the layers contiguously")
    assert _broken([[(0, 2), (4, 4)], [(2, 4), (4, 8)]]).startswith("pipelines[0].stages[0].layers[1]: [4, 4) is empty")
    assert _broken([[(0, 2), (4, 6)], [(2, 4), (6, 7)]]).startswith(
        "pipelines[0].stages: layers end at 7, the model has 8 (hint: the last virtual stage must end at 8)")
    assert _broken([[(0, 4), (4, 6)], [(2, 4), (6, 8)]]).startswith("pipelines[0].stages[1].layers[0]: starts at 2")
    two = replace(_plain([1, 1], [4, 4]), stages=(Stage(("d:0",), 1, (0, 2), chunks=((0, 2), (4, 6))),
                                                   Stage(("d:1",), 1, (2, 8))))
    with pytest.raises(SpecError, match=r"^pipelines\[0\]\.stages\[0\]\.layers: holds 2 layer range\(s\), schedule "
                                        r"1f1b runs 1 layer chunk\(s\) per stage \(hint: give every stage one"):
        _plan(two)
    with pytest.raises(SpecError, match=r"^pipelines\[0\]\.stages\[0\]\.layers: chunk 0 is \[0, 3\], layers says"):
        st = interleaved(_plain([1, 1], [4, 4])).stages
        _plan(replace(interleaved(_plain([1, 1], [4, 4])), stages=(replace(st[0], chunks=((0, 3), (4, 6))), st[1])))


def test_three_chunks_per_stage_and_a_mismatch() -> None:
    """The plan chooses the chunk count (at least 2), the same on every stage."""
    pipe = interleaved(_plain([1, 1], [4, 4]), 3)
    plan = _plan(pipe)
    assert plan.pipelines[0].chunks == 3 and plan_from_dict(plan_to_dict(plan)) == plan
    assert [s.chunks for s in pipe.stages] == [((0, 2), (4, 5), (6, 7)), ((2, 4), (5, 6), (7, 8))]
    two = interleaved(_plain([1, 1], [4, 4]))
    with pytest.raises(SpecError, match=r"^pipelines\[0\]\.stages\[1\]\.layers: holds 2 layer range\(s\), schedule "
                                        r"interleaved-1f1b runs 3 layer chunk\(s\) per stage"):
        _plan(replace(pipe, stages=(pipe.stages[0], two.stages[1])))


def test_a_stage_of_one_range_keeps_one_chunk_when_replaced() -> None:
    st = replace(Stage(("d:0",), 1, (0, 4)), layers=(0, 3))
    assert st.chunks == ((0, 3),) and st.num_layers == 3


def test_layout_holds_syncs_and_connects_every_chunk() -> None:
    il4 = interleaved(_plain([1, 2, 1, 1], [2, 2, 2, 2]))
    plan = _plan(il4, interleaved(_plain([2, 1], [4, 4], node="e")))
    topo = build_topology(plan)
    s0 = topo.pipelines[0][0]
    assert s0.chunks == ((0, 1), (4, 5)) and s0.holds("layers.4.attn.wq.weight")
    assert not s0.holds("layers.2.mlp_norm.weight")
    names = [p.name for p in stage_params(TINY8, s0.layers, True, False, s0.chunks)]
    assert names[1] == "layers.0.attn_norm.weight" and "layers.4.mlp.w_up.weight" in names
    # every parameter is synchronised once per pipeline: the holding stage of chunk 1 too
    synced = {sl.name for g in topo.sync_groups for sl in g.slices}
    assert synced == {p.name for p in logical_params(TINY8)}
    # 4 stages: a boundary group from the last stage back to the first; 2 stages: the one boundary serves
    leaders0 = [st.leader for st in topo.pipelines[0]]
    leaders1 = [st.leader for st in topo.pipelines[1]]
    assert (leaders0[-1], leaders0[0]) in topo.p2p_pairs() and len(topo.p2p_pairs()) == 4 + 1
    assert (leaders1[0], leaders1[1]) in topo.p2p_pairs()


def test_seed_flags_refuse_layer_chunks_and_tables_show_them() -> None:
    from hexiscale.cli.output import layers_label
    from planner.seed_flags import plan_to_flags

    plan = _plan(interleaved(_plain([1, 1], [4, 4])))
    with pytest.raises(SpecError, match=r"^pipelines\[0\]\.stages\[0\]\.layers: 2 layer chunks: the seed flags have "
                                        r"one layer range per stage"):
        plan_to_flags(plan)
    assert [layers_label(s) for s in plan.pipelines[0].stages] == ["0-1,4-5", "2-3,6-7"]


def test_a_format_1_plan_whose_stages_are_not_a_list_is_the_parsers_error() -> None:
    """The /2-fields scan of a /1 plan skips shapes it cannot read (the fuzzer's ``"stages": 0`` was a TypeError)."""
    data = plan_to_dict(_plan(_plain([1, 1], [4, 4])))
    data["pipelines"][0]["stages"] = 0
    with pytest.raises(SpecError, match=r"^pipelines\[0\]\.stages: "):
        plan_from_dict(data)
