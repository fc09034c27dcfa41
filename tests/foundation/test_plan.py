from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from planner.cluster import load_cluster
from planner.errors import SpecError
from planner.model import PRESETS
from planner.plan import Pipeline, Plan, Stage, load_plan, plan_from_dict, plan_to_dict
from planner.validate import validate

ROOT = Path(__file__).resolve().parents[2]
PLANS = sorted((ROOT / "examples" / "plans").glob("*.json"))


def two_pipelines() -> dict:
    return json.loads((ROOT / "examples" / "plans" / "demo-cpu-6-tiny.json").read_text())


def test_examples_validate_against_their_clusters() -> None:
    assert len(PLANS) >= 4
    for path in PLANS:
        plan = load_plan(path)
        cluster = load_cluster(ROOT / "examples" / "clusters" / f"{plan.cluster}.yaml")
        validate(plan, cluster)
        assert plan_from_dict(plan_to_dict(plan)) == plan


def test_rank_order_contract() -> None:
    plan = plan_from_dict(two_pipelines())
    ranks = plan.ranks()
    assert [r.device for r in ranks] == ["a100:0", "a100:1", "r4090:0", "r4090:1", "r4090:2", "r4090:3"]
    assert [(r.pipeline, r.stage, r.tp_rank) for r in ranks] == [(0, 0, 0), (0, 0, 1), (1, 0, 0), (1, 1, 0),
                                                                  (1, 1, 1), (1, 2, 0)]
    assert plan.world_size == 6


def test_micro_batch_sizes_even_split() -> None:
    assert Pipeline(10, 4, (Stage(("a:0",), 1, (0, 4)),)).micro_batch_sizes() == [3, 3, 2, 2]
    assert Pipeline(8, 2, (Stage(("a:0",), 1, (0, 4)),)).micro_batch_sizes() == [4, 4]


def _set(path: list, value):  # noqa: ANN202
    def mutate(d: dict) -> None:
        obj = d
        for key in path[:-1]:
            obj = obj[key]
        obj[path[-1]] = value
    return mutate


@pytest.mark.parametrize("mutate, path, word", [
    (_set(["global_batch_size"], 9), "pipelines", "sum to 8"),
    (_set(["pipelines", 1, "stages", 1, "layers"], [1, 2]), "pipelines[1].stages[2].layers", "starts at 3"),
    (_set(["pipelines", 1, "stages", 2, "layers"], [3, 3]), "pipelines[1].stages[2].layers", "empty"),
    (_set(["pipelines", 0, "stages", 0, "layers"], [0, 3]), "pipelines[0].stages", "end at 3"),
    (_set(["pipelines", 0, "stages", 0, "tp"], 3), "pipelines[0].stages[0].tp", "tp=3"),
    (_set(["pipelines", 1, "stages", 0, "devices"], ["a100:0"]), "pipelines[1].stages[0].devices[0]", "already used"),
    (_set(["pipelines", 0, "micro_batches"], 6), "pipelines[0].micro_batches", "not in [1"),
    (_set(["pipelines", 0, "schedule"], "zb"), "pipelines[0].schedule", "not one of"),
    (_set(["format"], "hexiscale.plan/0"), "format", "unsupported"),
    (_set(["options", "recompute"], "some"), "options.recompute", "not one of"),
    (_set(["options", "compile"], "yes"), "options.compile", "expected true or false"),
    (_set(["options", "compile"], 1), "options.compile", "expected true or false"),
    (_set(["pipelines", 0, "bogus"], 1), "pipelines[0].bogus", "unknown key"),
    (_set(["model", "num_heads"], 3), "model.hidden_size", "not divisible"),
])
def test_plan_errors_name_the_field(mutate, path: str, word: str) -> None:
    data = two_pipelines()
    mutate(data)
    with pytest.raises(SpecError) as info:
        plan_from_dict(data)
    assert info.value.path == path, str(info.value)
    assert word in str(info.value)


def test_tp_must_divide_heads() -> None:
    m = PRESETS["tiny"]  # 4 heads, 2 kv heads
    with pytest.raises(SpecError, match="does not divide num_kv_heads=2"):
        Plan(m, 2, (Pipeline(2, 1, (Stage(("a:0", "a:1", "a:2", "a:3"), 4, (0, 4)),)),))


def test_validate_against_cluster() -> None:
    plan = plan_from_dict(two_pipelines())
    cluster = load_cluster(ROOT / "examples" / "clusters" / "demo-cpu-6.yaml")
    validate(plan, cluster)
    bad = replace(plan, pipelines=(replace(plan.pipelines[0], stages=(Stage(("a100:0", "a100:7"), 2, (0, 4)),)),
                                   plan.pipelines[1]))
    with pytest.raises(SpecError) as info:
        validate(bad, cluster)
    assert info.value.path == "pipelines[0].stages[0].devices[1]"


def test_load_plan_errors(tmp_path: Path) -> None:
    p = tmp_path / "p.json"
    p.write_text("{ not json")
    with pytest.raises(SpecError, match="not valid JSON"):
        load_plan(p)


def test_binary_files_are_clear_errors(tmp_path: Path) -> None:
    from planner.cluster import load_cluster

    p = tmp_path / "p.json"
    p.write_bytes(b"\xff\xfe\x00binary")
    with pytest.raises(SpecError, match="not UTF-8"):
        load_plan(p)
    with pytest.raises(SpecError, match="not UTF-8"):
        load_cluster(p)


def test_compile_option_round_trips_and_defaults_to_false() -> None:
    data = two_pipelines()
    assert "compile" not in data.get("options", {})  # an old plan file
    old = plan_from_dict(data)
    assert old.options.compile is False
    assert "compile" not in plan_to_dict(old)["options"]  # written only when set: old readers see the same file
    assert plan_from_dict(plan_to_dict(old)) == old
    data.setdefault("options", {})["compile"] = True
    new = plan_from_dict(data)
    assert new.options.compile is True and new != old
    assert plan_to_dict(new)["options"]["compile"] is True
    assert plan_from_dict(json.loads(json.dumps(plan_to_dict(new)))) == new
    data["options"]["compile"] = False
    assert plan_from_dict(data) == old


def test_compile_option_error_is_one_line() -> None:
    data = two_pipelines()
    data.setdefault("options", {})["compile"] = "true"
    with pytest.raises(SpecError) as info:
        plan_from_dict(data)
    assert info.value.path == "options.compile" and "\n" not in str(info.value)
    with pytest.raises(SpecError, match="options.compile"):
        replace(plan_from_dict(two_pipelines()), options=replace(plan_from_dict(two_pipelines()).options,
                                                                 compile=1))  # type: ignore[arg-type]
