"""``cp_attention_efficiency`` from one timing of the executor's context-parallel attention
(``hexiscale calibrate`` on a GPU: :mod:`executor.profiler.cp_attention`).

The cost model prices a CP rank's attention cores at ``cp_attention_efficiency`` of peak
(:mod:`planner.cost.context`). Its time is FLOP-bound at the sequence lengths CP is for, so the
term is the roofline time at efficiency 1 over the measured time; the fit reports the model's
time with the fitted term beside the measured one (they differ only by launch overheads).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from planner.catalog import DeviceType
from planner.cost.params import CostParams
from planner.cost.profile import SpecProfile
from planner.model import ModelSpec

BOUNDS = (0.05, 1.0)


@dataclass(frozen=True)
class CPAttentionFit:
    efficiency: float
    measured_s: float
    predicted_s: float  # the model's forward + backward with the fitted term
    seq_len: int
    cp: int


def fit_cp_attention(measured_s: float, model: ModelSpec, device: DeviceType, params: CostParams, *, seq_len: int,
                     cp: int, dtype: str) -> CPAttentionFit:
    """The efficiency at which one CP rank's attention (forward + backward, no recompute, one
    sequence of ``seq_len`` over ``cp`` ranks, TP 1) takes ``measured_s`` on ``device``."""
    if measured_s <= 0:
        raise ValueError(f"measured CP attention time must be > 0, got {measured_s}")

    def model_s(eff: float) -> float:
        prof = SpecProfile(device, replace(params, cp_attention_efficiency=eff))
        f, b = prof.attention_core_time(model, 1, 1, dtype, "none", seq_len // cp, copies=cp, cp_kernel=True)
        return f + b

    eff = min(max(model_s(1.0) / measured_s, BOUNDS[0]), BOUNDS[1])
    return CPAttentionFit(eff, measured_s, model_s(eff), seq_len, cp)
