"""The plans measured by ``benchmarks/fidelity/accuracy.py`` and ``benchmarks/fidelity/hetero_efficiency.py``
(pure data).

Devices are ``g0:0`` and ``g1:0``: two one-GPU "nodes", GPU 0 and GPU 1 of the device machine. Each
launch group fixes the MPS SM share of each GPU (one process per GPU, the share set when its CUDA
context is created); a plan's rank ``r`` runs on the GPU of its ``r``-th device, so a plan may put
either GPU first.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from planner.model import PRESETS, ModelSpec
from planner.plan import Pipeline, Plan, PlanOptions, Stage

G0, G1 = "g0:0", "g1:0"


def bench_model(cpu: bool) -> ModelSpec:
    """GPU: the 1.3B preset cut to 8 layers at sequence 2048 (short runs); CPU: the tiny preset."""
    if cpu:
        return PRESETS["tiny-8l"]
    return replace(PRESETS["llama-1.3b"], name="llama-1.3b-8l", num_layers=8, seq_len=2048)


@dataclass(frozen=True)
class Launch:
    """One launch: SM share per GPU and the plans run under it."""

    name: str
    sm: tuple[int, ...]
    plans: tuple[tuple[str, Plan], ...]


def _one(model: ModelSpec, dev: str, batch: int, micro: int, options: PlanOptions = PlanOptions()) -> Plan:
    return Plan(model, batch, (Pipeline(batch, micro, (Stage((dev,), 1, (0, model.num_layers)),)),), options)


def _tp2(model: ModelSpec, batch: int, micro: int) -> Plan:
    return Plan(model, batch, (Pipeline(batch, micro, (Stage((G0, G1), 2, (0, model.num_layers)),)),))


def _pp2(model: ModelSpec, first: str, second: str, split: int, batch: int, micro: int) -> Plan:
    stages = (Stage((first,), 1, (0, split)), Stage((second,), 1, (split, model.num_layers)))
    return Plan(model, batch, (Pipeline(batch, micro, stages),))


def _dp2(model: ModelSpec, a: str, b: str, batch_a: int, batch_b: int, micro_a: int, micro_b: int) -> Plan:
    n = model.num_layers
    return Plan(model, batch_a + batch_b, (Pipeline(batch_a, micro_a, (Stage((a,), 1, (0, n)),)),
                                           Pipeline(batch_b, micro_b, (Stage((b,), 1, (0, n)),))))


def fidelity_launches(model: ModelSpec) -> list[Launch]:
    """At least 12 plans: 1 GPU, TP2, PP2, DP2, asymmetric plans, one GPU throttled, micro-batch counts.
    Global batch 16; micro-batches of 4 samples (8k tokens) unless the plan varies them, so the GPUs
    are busy rather than waiting for kernel launches."""
    n = model.num_layers
    b = 16
    full = Launch("sm100-100", (100, 100), (
        ("1gpu-m4", _one(model, G0, b, 4)),
        ("1gpu-m8", _one(model, G0, b, 8)),
        ("1gpu-m4-selective", _one(model, G0, b, 4, PlanOptions(recompute="selective"))),
        ("tp2-m4", _tp2(model, b, 4)),
        ("pp2-even-m4", _pp2(model, G0, G1, n // 2, b, 4)),
        ("pp2-even-m8", _pp2(model, G0, G1, n // 2, b, 8)),
        ("pp2-5-3-m8", _pp2(model, G0, G1, n * 5 // 8, b, 8)),
        ("dp2-even", _dp2(model, G0, G1, b // 2, b // 2, 2, 2)),
        ("dp2-12-4", _dp2(model, G0, G1, 12, 4, 3, 1)),
    ))
    mixed60 = Launch("sm100-60", (100, 60), (  # the one-GPU plan last: NCCL once failed after it under MPS
        ("tp2-100+60-m4", _tp2(model, b, 4)),
        ("pp2-100|60-5-3-m8", _pp2(model, G0, G1, n * 5 // 8, b, 8)),
        ("pp2-60|100-3-5-m8", _pp2(model, G1, G0, n * 3 // 8, b, 8)),
        ("dp2-100+60-10-6", _dp2(model, G0, G1, 10, 6, 5, 3)),
        ("1gpu-mps60-m4", _one(model, G1, b, 4)),
    ))
    mixed35 = Launch("sm100-35", (100, 35), (
        ("pp2-100|35-6-2-m8", _pp2(model, G0, G1, n * 6 // 8, b, 8)),
        ("dp2-100+35-12-4", _dp2(model, G0, G1, 12, 4, 3, 1)),
    ))
    return [full, mixed60, mixed35]


HETERO_BATCH, HETERO_MICRO = 24, 4


def hetero_candidates(model: ModelSpec, pair: tuple[int, int], micro: int = HETERO_MICRO) -> list[tuple[str, Plan]]:
    """Candidate plans on a GPU pair (global batch 24, micro-batches of ``micro`` samples) from which the
    cost model picks: every PP split (either GPU first), every DP batch split in whole micro-batches, TP2."""
    n, b, mb = model.num_layers, HETERO_BATCH, micro
    out: list[tuple[str, Plan]] = [("tp2", _tp2(model, b, b // mb))]
    for split in range(1, n):
        out.append((f"pp2-g0|g1-{split}-{n - split}", _pp2(model, G0, G1, split, b, b // mb)))
        if pair[0] != pair[1]:
            out.append((f"pp2-g1|g0-{split}-{n - split}", _pp2(model, G1, G0, split, b, b // mb)))
    for ba in range(mb, b, mb):
        if pair[0] == pair[1] and ba < b - ba:
            continue
        out.append((f"dp2-{ba}-{b - ba}", _dp2(model, G0, G1, ba, b - ba, ba // mb, (b - ba) // mb)))
    return out


def plan_to_json(plan: Plan) -> dict[str, Any]:
    from planner.plan import plan_to_dict

    return plan_to_dict(plan)
