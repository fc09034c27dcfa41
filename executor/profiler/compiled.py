"""The compiled/eager time ratio of one transformer layer on this GPU (``hexiscale calibrate``): the
cost model prices a plan with ``options.compile`` from it (``CostParams.compiled_layer_ratio``,
:mod:`planner.cost.compiled`). The layer is timed at one point — ``micro_batch`` sequences of the
model's length, TP 1, no recompute, chained as inside a stage — eager and compiled, in that order;
the compiled warm-up holds the compilation. Peak memory of both passes is kept beside the ratio."""

from __future__ import annotations

from typing import Any

import torch

from executor.profiler import compute
from planner.cost.pass_times import pass_seconds, split_times
from planner.model import ModelSpec

MIN_WARMUP = 2  # the first compiled call compiles, the second may still specialise


def compiled_ratio(model: ModelSpec, *, micro_batch: int, dtype: str, device: torch.device, warmup: int,
                   repeats: int, chain: int = 1) -> dict[str, Any]:
    """``{"ratio": compiled / eager (forward + backward), "eager": row, "compiled": row, point...}``, and on
    CUDA ``device_ratio`` and ``host_ratio``: the same on each side apart (``CostParams.compiled_device_ratio``)."""
    rows = {}
    for mode in ("eager", "compiled"):
        rows[mode] = compute.measure_layer(model, micro_batch=micro_batch, seq_len=model.seq_len, tp=1,
                                           recompute="none", dtype=dtype, device=device,
                                           warmup=max(warmup, MIN_WARMUP), repeats=repeats, chain=chain,
                                           compiled=mode == "compiled")
        if device.type == "cuda":
            torch.cuda.empty_cache()
    eager, comp = rows["eager"], rows["compiled"]
    ratio = _pass_s(comp) / _pass_s(eager)
    sides = {}
    if device.type == "cuda":  # host-free device times: the GPU's and the host's ratios apart
        both = [split_times(r, ph, True) for r in (eager, comp) for ph in ("forward_s", "backward_s")]
        if all(b is not None for b in both):
            (ef, eb, cf, cb) = [b for b in both if b is not None]
            sides = {"device_ratio": (cf[0] + cb[0]) / (ef[0] + eb[0]), "host_ratio": (cf[1] + cb[1]) / (ef[1] + eb[1])}
    return {"ratio": ratio, **sides, "micro_batch": micro_batch, "seq_len": model.seq_len, "tp": 1, "model": model.name,
            "eager": eager, "compiled": comp}


def _pass_s(row: dict[str, Any]) -> float:
    """Forward + backward as a step pays them: ``max(device, host)`` per pass (the device times are
    host-free on CUDA, executor.profiler.timing; on the CPU the two are one clock)."""
    return pass_seconds(row, "forward_s", True) + pass_seconds(row, "backward_s", True)
