"""An elastic job whose layouts use context parallelism, end to end on CPU/gloo (``hexiscale launch
--local --elastic-trace``): it starts on a lone pipeline whose two stages are cp 2 (ZeRO-1 over the
CP slots, planner.state_layout.zero_sharded), switches out of CP when r4090:2 leaves (two
pipelines, no CP, ZeRO 0) and back into the CP plan when it joins again. Every loss equals the
dense single-process reference. The switch itself, case by case against checkpoint-restart (weights
and Adam moments too), is tests/executor/test_exec_switch.py's CP cases."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from test_elastic_jobs import logged, reference_losses
from test_train_jobs import CLUSTER, PLAN4, hexiscale

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("hexiscale-jobs")]
FOUR = ["a100:0", "r4090:0", "r4090:1", "r4090:2"]


def _plan(path: Path, pipelines: list[dict], zero: int) -> Path:
    data = json.loads(PLAN4.read_text())
    data.update(format="hexiscale.plan/2", pipelines=pipelines)
    data["options"]["zero"] = zero
    path.write_text(json.dumps(data))
    return path


def test_elastic_trace_out_of_cp_and_back_equals_the_reference(tmp_path: Path) -> None:
    cp = _plan(tmp_path / "cp.json", [{"batch_size": 8, "micro_batches": 2, "stages": [
        {"devices": FOUR[1:3], "tp": 1, "cp": 2, "layers": [0, 2]},
        {"devices": [FOUR[0], FOUR[3]], "tp": 1, "cp": 2, "layers": [2, 4]}]}], zero=1)
    flat = _plan(tmp_path / "flat.json", [
        {"batch_size": 3, "micro_batches": 3, "stages": [{"devices": ["a100:0"], "layers": [0, 4]}]},
        {"batch_size": 5, "micro_batches": 2, "stages": [{"devices": ["r4090:0"], "layers": [0, 1]},
                                                         {"devices": ["r4090:1"], "layers": [1, 4]}]}], zero=0)
    trace = tmp_path / "trace.yaml"
    trace.write_text(f"format: hexiscale.trace/1\nphases:\n  - steps: 2\n"
                     f"  - steps: 2\n    devices: [{', '.join(FOUR[:3])}]\n    plan: {flat.name}\n"
                     f"  - steps: 2\n    devices: [{', '.join(FOUR)}]\n    plan: {cp.name}\n")
    jsonl = tmp_path / "steps.jsonl"
    run = hexiscale("launch", str(cp), "--local", "--cluster", str(CLUSTER), "--elastic-trace", str(trace),
                    "--run-id", "cptrace", "--", "--log-jsonl", str(jsonl), "--lr", "3e-3", "--warmup", "1")
    out = run.stdout + run.stderr
    assert run.returncode == 0, out
    assert "epoch 1 after step 2: 4 -> 3 ranks (leave r4090:2)" in out
    assert "epoch 2 after step 4: 3 -> 4 ranks (join r4090:2)" in out
    assert "[r4090:2] warmed up in" in out  # the joiner warmed up on its CP stage, then received its state
    got = logged(jsonl)
    assert sorted(got) == [1, 2, 3, 4, 5, 6]
    assert [got[k] for k in range(1, 7)] == pytest.approx(reference_losses(6, 6), rel=1e-5)
