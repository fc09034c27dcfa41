"""One CP rank's attention timed on this GPU (``hexiscale calibrate``): the executor's blockwise
path (:mod:`executor.parallel.cp_blockwise`) forward and backward for the profiled model's heads,
one sequence of ``seq_len`` over ``cp`` ranks, K/V already whole (the collectives are priced
apart, :mod:`planner.cost.context`). The slowest rank's time is what the stage waits for;
:mod:`planner.calibration.cp_attention` turns it into ``cp_attention_efficiency``.
"""

from __future__ import annotations

from typing import Any

import torch

from executor.parallel.attention_pieces import kernel_for
from executor.parallel.context_parallel import split_sequence
from executor.parallel.cp_blockwise import local_backward, local_forward
from executor.profiler.timing import time_call
from planner.model import ModelSpec

SEQ_LEN = 32768  # long enough for the pieces CP runs at 64K over 4 ranks (8K-token chunks at cp 2)
CP = 2


def measure_cp_attention(model: ModelSpec, *, dtype: str, device: torch.device, warmup: int, repeats: int,
                         seq_len: int = SEQ_LEN, cp: int = CP) -> dict[str, Any] | None:
    """``{"seconds": slowest rank's forward + backward, "per_rank_s", "seq_len", "cp", "kernel"}``,
    or None where the executor has no piece kernel (CUDA fp32)."""
    dt = torch.bfloat16 if dtype == "bf16" else torch.float16 if dtype == "fp16" else torch.float32
    gen = torch.Generator(device=device).manual_seed(0)
    h, d = model.num_heads, model.head_dim
    kv = torch.randn(2, 1, h, seq_len, d, device=device, dtype=dt, generator=gen)
    full_q = torch.randn(1, h, seq_len, d, device=device, dtype=dt, generator=gen)
    kernel = kernel_for(full_q)
    if kernel is None:
        return None
    per_rank = []
    for r in range(cp):
        q = split_sequence(full_q, cp, r, dim=-2)
        dout = torch.randn_like(q)

        def step(q: torch.Tensor = q, dout: torch.Tensor = dout, r: int = r) -> None:
            out, lse, aux = local_forward(q, kv, cp, r, kernel)
            local_backward(dout, q, kv, out, lse, aux, cp, r, kernel)
        per_rank.append(time_call(step, device, max(warmup, 1), max(repeats, 1)))
    return {"seconds": max(per_rank), "per_rank_s": per_rank, "seq_len": seq_len, "cp": cp, "kernel": kernel.name}

