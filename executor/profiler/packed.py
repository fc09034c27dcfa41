"""Packed micro-batches timed on this host (``hexiscale calibrate``): one transformer layer on one row
of documents of mixed length — the executor's packed attention (:mod:`executor.data.packed_docs`: positions
restart and attention stays inside each document) — so the varlen cost ``a·Σs² + b·Σs + c + d·n`` is
fitted to the path it prices (:mod:`planner.calibration.packed`), not carried from full-length rows.

Rows (``measured.packed`` of the device entry): ``{"lengths": [s_d...], "forward_s", "backward_s",
"forward_host_s", "backward_host_s", "peak_bytes"?}`` per layer (chained as inside a stage, divided by
the chain; the host times: :func:`executor.profiler.timing.phase_times`), for the profiled model at
TP 1, no recompute. :func:`packed_rows` picks the documents: per total token count
(:func:`row_totals`: above the host's launch floor on a GPU), from full-length documents to many short
ones, so ``b``, ``c`` and ``d`` are all identifiable; :func:`packed_kernel` names the attention kernel
the rows ran (a per-document loop or one varlen kernel), which the calibration records with them.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import torch

from executor.data.packed_docs import DocSpans, varlen_kernel_name
from executor.profiler import compute
from planner.calibration.packed import SPLITS, packed_rows, row_totals
from planner.model import ModelSpec

__all__ = ["SPLITS", "measure_packed_layer", "packed_kernel", "packed_rows", "row_totals"]


def packed_kernel(dtype: str, device: torch.device) -> str:
    """The packed-attention kernel a row of several documents runs on ``device`` in ``dtype``."""
    return varlen_kernel_name(torch.empty(1, device=device, dtype=compute.TORCH_DTYPES[dtype]))


def measure_packed_layer(model: ModelSpec, rows: list[list[int]], *, dtype: str, device: torch.device, warmup: int,
                         repeats: int, chain: int = 1) -> list[dict[str, Any]]:
    """Time one layer forward + backward on each packed row of ``rows`` (module docstring)."""
    from executor.model.llama import Block

    out = []
    for lengths in rows:
        total = sum(lengths)
        spec = replace(model, seq_len=max(model.seq_len, total))
        block = compute.prepare(Block(spec, tp=1, group=None, recompute="none", device=None), dtype, device)
        docs = DocSpans(tuple(lengths))
        cos, sin = compute._rope(spec, max(lengths), device)
        pos = docs.positions(cos.device)
        cos, sin = cos[pos], sin[pos]
        x = torch.randn(1, total, model.hidden_size, device=device, requires_grad=True)
        fresh = compute.engine_copies(block, dtype) if compute.uses_autocast(dtype, device) else (lambda: None)

        def forward(block: Any = block, x: torch.Tensor = x, cos: torch.Tensor = cos, sin: torch.Tensor = sin,
                    docs: DocSpans = docs, fresh: Any = fresh) -> torch.Tensor:
            y = x
            for _ in range(chain):
                fresh()  # the engine's cast-once copies, as a stage refreshes them per layer
                y = block(y, cos, sin, docs)
            return y

        res = compute._measure_fwd_bwd(forward, [*block.parameters(), x], device, dtype, warmup, repeats)
        out.append({"lengths": list(lengths), **{k: v / chain for k, v in res.items()
                                                 if k in compute.TIME_KEYS},
                    **({"peak_bytes": res["peak_bytes"]} if "peak_bytes" in res else {})})
        del block, x
        if device.type == "cuda":
            torch.cuda.empty_cache()
    return out
