"""The fidelity plan's traced step summed by kind: what the step's time went to, including the time
no span covers (the device waiting on the host between and around the spans)."""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks.fidelity.traced_step import span_totals


def test_spans_summed_by_kind_with_the_uncovered_time() -> None:
    events = [["forward", 0, 0.000, 0.010], ["forward", 1, 0.012, 0.022], ["backward", 1, 0.022, 0.042],
              ["backward", 0, 0.043, 0.063], ["p2p", 1, 0.020, 0.024],  # overlaps a forward and a backward
              ["grad_sync", -1, 0.063, 0.065], ["optimizer", -1, 0.070, 0.075]]
    t = span_totals(events)
    assert t["forward"] == pytest.approx(0.020) and t["backward"] == pytest.approx(0.040)
    assert t["p2p"] == pytest.approx(0.004) and t["optimizer"] == pytest.approx(0.005)
    assert t["micro_batches"] == 2 and t["step_s"] == pytest.approx(0.075)
    # gaps 0.010-0.012, 0.042-0.043 and 0.065-0.070: 8 ms no span covers (the p2p overlap counted once)
    assert t["uncovered_s"] == pytest.approx(0.008)
    assert span_totals([]) == {"micro_batches": 0.0, "step_s": 0.0, "uncovered_s": 0.0}


def test_a_row_traces_its_bottleneck_rank_not_the_last_to_finish() -> None:
    """Every rank of a step ends at its last collective together, so the largest ``step_s`` picked any
    rank: on 4x H200 (2026-11-27) the packed DP 4 row showed GPU 3, whose 49.8 ms of gradient sync was
    its wait for GPU 0, as if the sync were exposed; GPU 0 did 282.7 ms of forward and backward and
    synced in 5.6 ms."""
    from benchmarks.planner.fidelity_repredict import repredict

    run = Path(__file__).resolve().parents[2] / "benchmarks" / "results" / "fidelity_h200x4_20261127T124458Z.json"
    [row] = [r for r in repredict(run) if r["plan"] == "packed-1.3b-dp4"]
    t = row["traced_s"]
    assert t["forward"] + t["backward"] == pytest.approx(0.2827, abs=5e-4)
    assert t["grad_sync"] == pytest.approx(0.0056, abs=5e-4)


def test_the_traced_step_reports_the_hosts_seconds_inside_each_kind(tmp_path: Path) -> None:
    """Beside each kind's device seconds, the host's seconds inside the same spans (``forward_host``
    ...): what tells a launch-bound forward (host as long as device) from a device-bound one on a GPU.
    On the CPU the two are one clock, so they agree; the host's time outside every span is no part of it."""
    import time

    import torch

    from benchmarks.fidelity.traced_step import trace_one_step
    from planner.model import PRESETS
    from planner.plan import Pipeline, Plan, PlanOptions, Stage

    model = PRESETS["tiny"]
    plan = Plan(model, 2, (Pipeline(2, 1, (Stage(("local:0",), 1, (0, model.num_layers)),)),), PlanOptions())

    class Engine:
        trace = None

        def set_trace(self, trace: object) -> None:
            self.trace = trace

    engine = Engine()

    def step() -> None:
        time.sleep(0.02)  # outside every span
        with engine.trace.span("forward", 0):
            time.sleep(0.01)
        with engine.trace.span("backward", 0):
            time.sleep(0.02)

    t = trace_one_step(engine, plan, rank=0, device=torch.device("cpu"), folder=str(tmp_path), index=0, step=step)
    assert t["forward_host"] == pytest.approx(t["forward"], abs=2e-3) and t["forward_host"] >= 0.01
    assert t["backward_host"] == pytest.approx(t["backward"], abs=2e-3) and t["backward_host"] >= 0.02
    assert t["uncovered_s"] >= 0.02 and not {"step_s_host", "micro_batches_host"} & t.keys()
