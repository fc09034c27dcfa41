"""A trace says what the run computed: a CPU run of a bf16 plan computes in fp32, and the trace (and
so ``hexiscale show --plot``'s title) must say fp32, not the plan's bf16."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from executor.train.trace import StepTrace
from planner.model import PRESETS
from planner.plan import Pipeline, Plan, PlanOptions, Stage
from planner.timeline import read_trace


def _plan(dtype: str) -> Plan:
    model = PRESETS["tiny"]
    stage = Stage(("local:0",), 1, (0, model.num_layers))
    return Plan(model, 2, (Pipeline(2, 1, (stage,)),), PlanOptions(dtype=dtype, residual_dtype=dtype))


@pytest.mark.parametrize("dtype", ["bf16", "fp32"])
def test_a_cpu_trace_names_the_dtype_it_computed_in(dtype: str, tmp_path: Path) -> None:
    path = tmp_path / "trace.json"
    trace = StepTrace(path=str(path), plan=_plan(dtype), device=torch.device("cpu"), window=range(0, 1), rank=0,
                      world=None)
    trace.begin_step(0)
    with trace.span("forward", 0):
        pass
    trace.end_step(0)
    plan, _ = read_trace(path)
    assert (plan.options.dtype, plan.options.residual_dtype) == ("fp32", "fp32")


def test_a_trace_holds_each_ranks_peak_memory(tmp_path: Path) -> None:
    """The bubble benchmark compares schedules at the same memory: each rank's lane carries its
    peak memory (here the CPU's resident set, > 0), and a trace written before that field still reads."""
    path = tmp_path / "trace.json"
    trace = StepTrace(path=str(path), plan=_plan("fp32"), device=torch.device("cpu"), window=range(0, 1), rank=0,
                      world=None)
    trace.begin_step(0)
    trace.end_step(0)
    _, [step] = read_trace(path)
    [lane] = step.lanes
    assert lane.peak_memory_gib is not None and lane.peak_memory_gib > 0
    data = json.loads(path.read_text())
    del data["steps"][0]["ranks"][0]["peak_memory_gib"]
    path.write_text(json.dumps(data))
    assert read_trace(path)[1][0].lanes[0].peak_memory_gib is None
