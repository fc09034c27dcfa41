"""The joiner's warm-up (executor.switch.warm_up): one training step of one block of its stage, run for
every role a stage can have, that leaves torch's random number generators and grad mode as they
were; a failing warm-up only logs. (That a joined job trains as before: the switch oracle's joiners
warm up first, tests/executor/switch_jobs.py, and so does the elastic smoke job's joiner.)"""

from __future__ import annotations

import dataclasses
import logging
from typing import Any

import pytest
import torch

from executor.switch.warm_up import warm_up
from executor.train.optim import OptimConfig, for_device
from planner.plan import Plan
from tests.support.random_plans import TINY, TINY8, named_plan

CPU = torch.device("cpu")
# a TP-2 first stage and a TP-1 last stage; first, middle (TP 2) and last stage of one pipeline
TP_LAST = named_plan(TINY, [(3, [(["a:0", "a:1"], 2), (["a:2"], 2)]), (5, [(["b:0"], 4)])], micro=2)
THREE = named_plan(TINY8, [(4, [(["a:0"], 3), (["a:1", "a:2"], 3), (["a:3"], 2)])], micro=2, zero=1)


def _with(plan: Plan, **options: Any) -> Plan:
    return dataclasses.replace(plan, options=dataclasses.replace(plan.options, **options))


PLANS = [TP_LAST, THREE, _with(TP_LAST, recompute="selective", dtype="bf16"), _with(THREE, recompute="full")]


@pytest.mark.parametrize("plan", PLANS, ids=["tp2-first+last", "first-mid-last-zero1", "selective-bf16", "full"])
def test_warm_up_runs_every_stage_role_and_leaves_the_generators_alone(plan: Plan, monkeypatch) -> None:
    steps: list[Any] = []
    adamw_step = torch.optim.AdamW.step

    def counted(self, *a, **kw):  # type: ignore[no-untyped-def]
        steps.append(self.defaults.get("fused"))
        return adamw_step(self, *a, **kw)

    monkeypatch.setattr(torch.optim.AdamW, "step", counted)
    for device in plan.devices:
        torch.manual_seed(5)
        expected = torch.rand(4)
        torch.manual_seed(5)
        with torch.no_grad():
            took = warm_up(plan, device, CPU, OptimConfig(lr=1e-3))
            assert not torch.is_grad_enabled()
        assert took is not None and took > 0, device
        assert torch.equal(torch.rand(4), expected), f"{device}: the warm-up moved the CPU generator"
    assert steps == [None] * len(plan.devices)  # one AdamW step each, torch's default kernel on CPU


def test_a_failing_warm_up_logs_and_returns_none(caplog: pytest.LogCaptureFixture) -> None:
    torch.manual_seed(7)
    expected = torch.rand(3)
    torch.manual_seed(7)
    with caplog.at_level(logging.WARNING, logger="hexiscale.executor"):
        assert warm_up(TP_LAST, "z:9", CPU, OptimConfig()) is None  # not a device of the plan
    assert "warm-up failed on z:9" in caplog.text
    assert torch.equal(torch.rand(3), expected)


def test_engine_optimizer_settings_per_device() -> None:
    cuda = torch.device("cuda", 0)
    assert for_device(OptimConfig(), cuda).fused is True
    assert for_device(OptimConfig(fused=False), cuda).fused is False
    assert for_device(OptimConfig(), CPU).fused is None


def test_warm_up_runs_the_switchs_strided_copies(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """The joiner unpacks its state with ``_foreach_copy_`` into strided views (executor.switch.state_move);
    the warm-up launches that op on such views once, so the switch does not load its kernels."""
    calls: list[bool] = []
    copy = torch._foreach_copy_

    def recorded(dst, src, *a, **kw):  # type: ignore[no-untyped-def]
        calls.append(any(not t.is_contiguous() for t in dst))
        return copy(dst, src, *a, **kw)

    monkeypatch.setattr(torch, "_foreach_copy_", recorded)
    assert warm_up(TP_LAST, "b:0", CPU, OptimConfig()) is not None
    assert True in calls
