"""The fidelity worker on 2 GPUs (make test-gpu): a plan run after a larger one in the same launch
reports its own memory peak (reset per plan, the initial weights drawn before the window) and the
step losses of a launch of its own; the GPU draw of the initial weights has the CPU draw's
distribution."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from benchmarks.fidelity.plans import G0, G1, _dp2, _pp2, plan_to_json
from benchmarks.fidelity.worker import run_launch
from executor.model.init import init_tensor
from planner.model import PRESETS

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 CUDA GPUs")]

MODEL = replace(PRESETS["llama-1.3b"], name="llama-1.3b-4l", num_layers=4, seq_len=1024)


def test_a_gpu_draw_has_the_cpu_draws_distribution() -> None:
    t = init_tensor(MODEL, 0, "layers.0.attn.wq.weight", (2048, 2048), torch.device("cuda"))
    assert t.device.type == "cuda" and abs(float(t.std()) - 0.02) < 1e-3 and abs(float(t.mean())) < 1e-3


def test_memory_peak_and_losses_are_per_plan() -> None:
    big = {"name": "big-dp2", "plan": plan_to_json(_dp2(MODEL, G0, G1, 8, 8, 1, 1))}  # 8 sequences at once
    small = {"name": "small-pp2", "plan": plan_to_json(_pp2(MODEL, G0, G1, 2, 2, 2))}
    together = {p["name"]: p for p in run_launch([big, small], [100, 100], cpu=False, warmup=1, steps=2)["plans"]}
    alone = run_launch([small], [100, 100], cpu=False, warmup=1, steps=2)["plans"][0]
    assert all("error" not in p for p in (*together.values(), alone))
    for after, own in zip(together["small-pp2"]["ranks"], alone["ranks"]):
        assert after["loss"] == pytest.approx(own["loss"], rel=1e-3)
        assert after["max_allocated_gib"] == pytest.approx(own["max_allocated_gib"], rel=0.02, abs=0.02)
        assert after["left_allocated_gib"] < 0.01
    for b, s in zip(together["big-dp2"]["ranks"], together["small-pp2"]["ranks"]):
        assert b["max_allocated_gib"] > 1.5 * s["max_allocated_gib"]  # the big plan's peak did not carry over
