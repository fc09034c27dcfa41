"""The search prices ZB-H1 beside 1F1B per finalist (issue 35 item 3, planner.search.schedule_variant).

On the 4x H100 MPS cluster (two full GPUs, two at 50 % of their SMs) llama2-13b needs a multi-stage
pipeline: at global batch 8 (two TP-2 stages) ZB-H1's smaller bubble wins where it fits; llama3-8b
without recompute at micro-batch 1 runs a 3-stage pipeline (fast, fast, the two slow GPUs at TP 2)
whose later stages cannot hold, beside 1F1B's micro-batches in flight, the weight-gradient operands
ZB-H1's held-back ``W`` keeps queued (the 128K-vocabulary logits' gradient among them on the last;
planner.cost.wgrad_memory), so 1F1B stays. (Until issue 32's memory fix, one bf16 weight copy per
stage instead of one per micro-batch in flight, llama2-13b at batch 32 chose ZB-H1 on TP2/TP1/TP1 and
llama3-8b two TP-2 stages: both now find 1F1B layouts that fit and are faster.)"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from planner.cluster import load_cluster
from planner.cost import estimate
from planner.model import PRESETS
from planner.plan import Plan
from planner.search import PlannerConfig, search
from planner.search.config import SWITCHABLE

MPS = load_cluster(Path(__file__).resolve().parents[2] / "examples" / "clusters" / "h100x4-mps-100-100-50-50.yaml")
FAST = dict(local_search=False, polish=False)


def _as(plan: Plan, schedule: str) -> Plan:
    """The same layout under ``schedule`` (single-stage pipelines stay 1F1B, as the search writes them)."""
    return dataclasses.replace(plan, pipelines=tuple(
        dataclasses.replace(p, schedule=schedule if len(p.stages) > 1 else "1f1b") for p in plan.pipelines))


def test_search_picks_zb_h1_when_faster_and_fits() -> None:
    # ZB-H1's twin alone: with interleaved's twin too, interleaved wins this case
    # (tests/planner/test_search_interleaved.py)
    result = search(MPS, PRESETS["llama2-13b"], 8,
                    config=PlannerConfig(recompute=("full",), schedules=SWITCHABLE, **FAST))
    plan = result.plan
    assert any(len(p.stages) > 1 for p in plan.pipelines)
    assert {p.schedule for p in plan.pipelines if len(p.stages) > 1} == {"zb-h1"}, result.log
    chosen = estimate(plan, MPS)
    assert chosen.fits
    for other in ("1f1b", "gpipe"):
        variant = estimate(_as(plan, other), MPS)
        assert not variant.fits or chosen.step_time_s < variant.step_time_s, (other, variant.step_time_s)


def test_search_keeps_1f1b_when_zb_h1_memory_does_not_fit() -> None:
    cfg = PlannerConfig(recompute=("none",), zero=(1,), micro_batch_sizes=(1,), **FAST)
    result = search(MPS, PRESETS["llama3-8b"], 32, config=cfg)
    plan = result.plan
    assert [len(p.stages) for p in plan.pipelines] == [3], result.log
    assert plan.pipelines[0].schedule == "1f1b"
    assert estimate(plan, MPS).fits
    assert not estimate(_as(plan, "zb-h1"), MPS).fits  # the last stage also holds a queued micro-batch
