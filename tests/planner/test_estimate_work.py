"""The estimate's per-stage work, counted (no timings): the split-backward share of a layer
(``DeviceProfile.weight_grad_share``) is computed once per distinct stage shape, however many
pipelines repeat it — uncached, it made the 8,192-GPU search 2.5x slower (17 s -> 43 s on CI's
2 cores) without moving the search's own counters."""

from __future__ import annotations

import pytest

from benchmarks.planner.common import mixed_cluster
from planner.cost import estimate
from planner.cost.profile import DeviceProfile
from planner.model import PRESETS
from planner.plan import Pipeline, Plan, PlanOptions, Stage


def test_weight_grad_share_once_per_stage_shape(monkeypatch: pytest.MonkeyPatch) -> None:
    cluster = mixed_cluster(512)
    model = PRESETS["llama2-13b"]
    gpu = cluster.devices[0].gpu
    devs = [d.id for d in cluster.devices if d.gpu == gpu][:128]
    half = model.num_layers // 2
    pipes = tuple(Pipeline(4, 4, (Stage((a,), 1, (0, half)), Stage((b,), 1, (half, model.num_layers))), "zb-h1")
                  for a, b in zip(devs[0::2], devs[1::2]))
    plan = Plan(model, 4 * len(pipes), pipes, PlanOptions(recompute="full"))
    calls = []
    original = DeviceProfile._weight_grad_share

    def counted(self: DeviceProfile, *args: object) -> float:
        calls.append(args)
        return original(self, *args)  # type: ignore[arg-type]

    monkeypatch.setattr(DeviceProfile, "_weight_grad_share", counted)
    est = estimate(plan, cluster)
    assert len(pipes) == 64 and est.step_time_s > 0
    assert len(calls) == len(set(calls)) <= 2  # one shape per micro-batch size, not one per stage
