"""The plan format's context-parallel field: ``/2`` adds ``Stage.cp``; ``/1`` plans load unchanged."""

from __future__ import annotations

import pytest

from planner.errors import SpecError
from planner.model import ModelSpec
from planner.plan import PLAN_FORMAT, PLAN_FORMAT_CP, Pipeline, Plan, Stage, plan_from_dict, plan_to_dict

MODEL = ModelSpec("t", 2, 256, 704, 8, 4, 512, 128)


def _plan(cp: int = 2, tp: int = 2) -> Plan:
    devs = tuple(f"n:{i}" for i in range(tp * cp))
    return Plan(MODEL, 4, (Pipeline(4, 2, (Stage(devs, tp, (0, 1), cp), Stage(("m:0",), 1, (1, 2)))),))


def test_cp_plan_round_trips_as_format_2_and_ranks_are_cp_major() -> None:
    plan = _plan()
    data = plan_to_dict(plan)
    assert data["format"] == PLAN_FORMAT_CP
    assert data["pipelines"][0]["stages"][0]["cp"] == 2 and "cp" not in data["pipelines"][0]["stages"][1]
    assert plan_from_dict(data) == plan
    ranks = plan.ranks()
    assert [(r.cp_rank, r.tp_rank) for r in ranks[:4]] == [(0, 0), (0, 1), (1, 0), (1, 1)]


def test_plans_without_cp_stay_format_1() -> None:
    plan = _plan(cp=1, tp=2)
    assert plan_to_dict(plan)["format"] == PLAN_FORMAT
    assert plan_from_dict(plan_to_dict(plan)) == plan


def test_format_1_refuses_a_cp_field_by_name() -> None:
    data = plan_to_dict(_plan())
    data["format"] = PLAN_FORMAT
    with pytest.raises(SpecError, match=r"pipelines\[0\].stages\[0\].cp.*hexiscale.plan/2"):
        plan_from_dict(data)


@pytest.mark.parametrize(("cp", "tp", "ndev", "field"), [(2, 2, 3, "tp"), (3, 1, 3, "cp")])
def test_mesh_that_does_not_fit_is_one_line(cp: int, tp: int, ndev: int, field: str) -> None:
    devs = tuple(f"n:{i}" for i in range(ndev))
    with pytest.raises(SpecError, match=rf"stages\[0\]\.{field}"):
        Plan(MODEL, 4, (Pipeline(4, 2, (Stage(devs, tp, (0, 2), cp),)),))


def test_an_odd_sequence_length_needs_no_cp_check_without_cp() -> None:
    odd = ModelSpec("t", 2, 256, 704, 8, 4, 512, 127)
    Plan(odd, 4, (Pipeline(4, 2, (Stage(("n:0",), 1, (0, 2)),)),))  # no CP: no chunks to balance
    with pytest.raises(SpecError, match=r"stages\[0\]\.cp: 2 x cp = 4 does not divide seq_len=127"):
        Plan(odd, 4, (Pipeline(4, 2, (Stage(("n:0", "n:1"), 1, (0, 2), 2),)),))


def test_an_interleaved_pipeline_with_a_cp_stage_loads_back_the_same() -> None:
    """CP stages in an interleaved pipeline (once refused in one line) are a valid plan; the plan file
    keeps both the chunks and the cp degrees."""
    from planner.interleave import interleaved

    model = ModelSpec("t4", 4, 256, 704, 8, 4, 512, 128)
    devs = tuple(f"n:{i}" for i in range(2))
    pipe = Pipeline(4, 4, (Stage(devs, 1, (0, 2), 2), Stage(("m:0",), 1, (2, 4))))
    plan = Plan(model, 4, (interleaved(pipe, 2, "interleaved-1f1b", "pipelines[0]"),))
    data = plan_to_dict(plan)
    assert data["format"] == PLAN_FORMAT_CP and data["pipelines"][0]["stages"][0]["cp"] == 2
    assert plan_from_dict(data) == plan
