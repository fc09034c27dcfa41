"""A full disk under ``--log-jsonl`` or ``--trace`` is one line naming the flag, the file and that the
disk is full (it was a bare ``OSError: [Errno 28]``); ``--checkpoint-dir`` where no file can be
created fails before the first step; ``--warmup`` past ``--steps`` is refused."""

from __future__ import annotations

import errno
import os
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from executor.train.config import TrainConfig
from executor.train.metrics import StepLogger
from executor.train.preflight_paths import check_output_dir
from executor.train.setup import classify
from executor.train.trace import StepTrace
from planner.errors import SpecError
from planner.model import PRESETS
from planner.plan import Pipeline, Plan, PlanOptions, Stage

FULL = "/dev/full"  # every write fails with ENOSPC
needs_dev_full = pytest.mark.skipif(not os.path.exists(FULL), reason="needs /dev/full")


def _plan() -> Plan:
    model = PRESETS["tiny"]
    return Plan(model, 2, (Pipeline(2, 1, (Stage(("local:0",), 1, (0, model.num_layers)),)),),
                PlanOptions(dtype="fp32"))


@needs_dev_full
def test_log_jsonl_on_a_full_disk() -> None:
    logger = StepLogger(_plan(), 0, 0, leader=True, device=torch.device("cpu"), cluster=None, jsonl=FULL)
    stats = SimpleNamespace(loss=1.0, grad_norm=1.0, lr=1e-3, tokens=64)
    with pytest.raises(SpecError) as info:
        logger.step(0, 2, stats, 0.1)
    assert str(info.value).startswith(f"--log-jsonl: cannot write {FULL}: the disk is full")
    assert "checkpoints written so far are kept" in str(info.value)


@needs_dev_full
def test_trace_on_a_full_disk() -> None:
    trace = StepTrace(path=FULL, plan=_plan(), device=torch.device("cpu"), window=range(0, 1), rank=0, world=None)
    trace.begin_step(0)
    with pytest.raises(SpecError, match=f"^--trace: cannot write {FULL}: the disk is full"):
        trace.end_step(0)


def test_a_full_disk_elsewhere_is_named(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import builtins

    real = builtins.open

    def full(file: object, mode: str = "r", *args: object, **kwargs: object) -> object:
        if "a" in mode or "w" in mode:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(file, mode, *args, **kwargs)  # type: ignore[call-overload]

    monkeypatch.setattr(builtins, "open", full)
    logger = StepLogger(_plan(), 0, 0, leader=True, device=torch.device("cpu"), cluster=None,
                        jsonl=str(tmp_path / "m.jsonl"))
    with pytest.raises(SpecError, match="--log-jsonl: cannot write .*m.jsonl: the disk is full"):
        logger.step(0, 2, SimpleNamespace(loss=1.0, grad_norm=1.0, lr=1e-3, tokens=64), 0.1)
    reason, _, _ = classify(OSError(errno.ENOSPC, "No space left on device", str(tmp_path / "step-1.tmp")))
    assert reason.startswith("the disk is full: cannot write") and "step-1.tmp" in reason


@pytest.mark.skipif(not os.path.isdir("/proc"), reason="needs /proc")
def test_a_checkpoint_dir_where_no_file_can_be_made_is_refused_before_training() -> None:
    with pytest.raises(SpecError, match="^--checkpoint-dir: /proc/ck: cannot create a file in /proc"):
        check_output_dir("/proc/ck", "--checkpoint-dir")


@pytest.mark.parametrize("warmup", [11, 1_000_000_000])
def test_warmup_past_the_run_is_refused(warmup: int) -> None:
    with pytest.raises(SpecError, match=f"^--warmup: {warmup} warm-up steps, more than the run's --steps 10"):
        TrainConfig.flat(plan="p.json", steps=10, warmup=warmup)
    TrainConfig.flat(plan="p.json", steps=10, warmup=10)


def test_a_commands_output_on_a_full_disk_says_so_without_checkpoints() -> None:
    """``hexiscale plan -o`` and friends (hexiscale.cli.writing) share the training outputs' wording."""
    import errno

    from hexiscale.cli.writing import writing

    with pytest.raises(SpecError) as info, writing("-o", "plan.json"):
        raise OSError(errno.ENOSPC, "No space left on device")
    assert str(info.value).startswith("-o: cannot write plan.json: the disk is full")
    assert "checkpoint" not in str(info.value)
