"""The search places interleaved 1F1B (issue 35): a twin of each 1F1B finalist, its pipelines cut
into layer chunks where they can run them (planner.search.interleaved_variant), kept where the full
estimate finds it faster; plans whose layouts switch while training keep one range per stage."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from planner.cluster import load_cluster
from planner.errors import SpecError
from planner.interleave import interleaved
from planner.model import PRESETS
from planner.plan import Pipeline, Stage, plan_from_dict, plan_to_dict
from planner.replan import replan
from planner.search import PlannerConfig, search
from planner.search.config import SWITCHABLE
from planner.validate import validate
from tests.support.searched_plans import mixed_interleaved_search

ROOT = Path(__file__).resolve().parents[2]
H100X4 = load_cluster(ROOT / "examples" / "clusters" / "h100x4.yaml")
CFG = PlannerConfig(local_search=False)  # the layer polish on: it moves layers of interleaved stages too


def _plain(pipe: Pipeline) -> Pipeline:
    """``pipe``'s stages as one layer range each (their layer counts), 1F1B."""
    stages, at = [], 0
    for st in pipe.stages:
        stages.append(Stage(st.devices, st.tp, (at, at + st.num_layers), st.cp))
        at += st.num_layers
    return Pipeline(pipe.batch_size, pipe.micro_batches, tuple(stages))


def test_search_places_interleaved_where_the_bubble_dominates() -> None:
    """llama2-13b on 4 H100s at global batch 4: one 4-stage pipeline of 4 micro-batches, the bubble
    3/7 of the step under 1F1B; ZB-H1's twin does not fit. Today the search refuses the schedule."""
    result = search(H100X4, PRESETS["llama2-13b"], 4, config=CFG)
    [pipe] = result.plan.pipelines
    assert pipe.schedule == "interleaved-1f1b" and len(pipe.stages) == 4, result.log
    assert pipe == interleaved(_plain(pipe))  # chunk k of stage s is virtual stage k·S + s
    validate(result.plan, H100X4)
    assert result.estimate.fits
    without = search(H100X4, PRESETS["llama2-13b"], 4, config=dataclasses.replace(CFG, schedules=SWITCHABLE))
    assert all(p.chunks == 1 for p in without.plan.pipelines)
    assert result.estimate.step_time_s < 0.95 * without.estimate.step_time_s
    data = plan_to_dict(result.plan)  # the plan file shows the chunks, and loads back the same
    assert data["pipelines"][0]["stages"][0]["layers"] == [list(c) for c in pipe.stages[0].chunks]
    assert plan_from_dict(data).pipelines == result.plan.pipelines


def test_schedule_chosen_per_pipeline() -> None:
    """Two pipelines of one plan: the one whose micro-batches are a multiple of its stages runs
    interleaved, the other keeps 1F1B (6 micro-batches on 4 stages cannot interleave)."""
    plan = mixed_interleaved_search().plan
    assert [(p.schedule, len(p.stages), p.micro_batches) for p in plan.pipelines] == [
        ("interleaved-1f1b", 2, 4), ("1f1b", 4, 6)]
    assert plan.pipelines[0] == interleaved(_plain(plan.pipelines[0]))


def test_interleaved_needs_1f1b_among_the_schedules() -> None:
    with pytest.raises(SpecError) as e:
        PlannerConfig(schedules=("gpipe", "interleaved-1f1b")).check()
    text = str(e.value)
    assert "\n" not in text and text.startswith("schedules: ") and "add 1f1b" in text, text


def test_replan_keeps_one_layer_range_per_stage() -> None:
    """A re-planned layout replaces a running one (elastic switching moves state between plans of one
    range per stage): the same devices that searched interleaved above re-plan without chunks."""
    current = search(H100X4, PRESETS["llama2-13b"], 4, config=CFG).plan
    new = replan(H100X4, [d for p in current.pipelines for d in p.devices], current,
                 config=dataclasses.replace(CFG, context_parallel=False)).plan
    assert all(p.chunks == 1 and p.schedule != "interleaved-1f1b" for p in new.pipelines), new.pipelines


def test_cp_pipelines_get_an_interleaved_twin() -> None:
    """Two cp 2 stages of llama-1.3b at 64K on the 4 H100s, 4 micro-batches: interleaved 1F1B runs
    there (CP boundaries go piece-wise inside its rounds), so the twin interleaves the pipeline."""
    from planner.search.candidate import Layout
    from planner.search.graph import Unit, device_compute
    from planner.search.interleaved_variant import interleaves
    from planner.search.oracle import Oracle, Setting

    def unit(i: int, devs: tuple[str, str]) -> Unit:
        d = H100X4.device(devs[0])
        return Unit(i, d.node, devs, d.gpu, d.memory_gib, d.slowdown,
                    sum(device_compute(H100X4, x, "bf16") for x in devs), H100X4.link(*devs), cp=2)

    model = dataclasses.replace(PRESETS["llama-1.3b"], seq_len=65536)
    lay = Layout((unit(0, ("h100:0", "h100:1")), unit(1, ("h100:2", "h100:3"))), (12, 12), 4, 4)
    assert interleaves(Oracle(H100X4, model), lay, Setting(recompute="full", schedule="interleaved-1f1b"), 1)
