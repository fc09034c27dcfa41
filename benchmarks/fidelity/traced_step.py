"""One extra, untimed step of a fidelity plan traced span by span (:mod:`executor.train.trace`), so
a plan's gap to its prediction can be put on a term: forward or backward of the micro-batches,
p2p, the gradient sync left after the schedule, the optimizer, or time no span covers.

Why: the 4x H100 run of 2026-11-27 under-predicted TP plans by 9-11 % and packed ones by 13-21 %
while the layer tables they are priced from match the unpacked TP-1 steps; step medians alone
cannot say whether the missing time is inside the layers (forward or backward), between the
micro-batches, or after the schedule. The traced step runs after the timed ones, so the median
stays the plain steps'.

``span_totals`` sums each kind's spans over the step (seconds), with ``micro_batches`` (forward
spans), ``step_s`` (the last span's end: the step as the trace sees it) and ``uncovered_s``
(``step_s`` less every span: host time with the device waiting, between and around the spans).
:func:`trace_one_step` adds the host's seconds inside each kind's spans (``forward_host`` ...: the
host's issue time; a forward whose host time reaches its device time is launch-bound, which the
4x H100 calibration of 2026-11-27 found for almost every llama-1.3b layer row).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import torch
import torch.distributed as dist


def span_totals(events: Iterable[Sequence[Any]]) -> dict[str, float]:
    """``[[kind, micro_batch, start_s, end_s], ...]`` -> seconds per kind (module docstring)."""
    out: dict[str, float] = {}
    spans = sorted((float(a), float(b)) for _, _, a, b in events)
    for kind, _, a, b in events:
        out[kind] = out.get(kind, 0.0) + float(b) - float(a)
    covered, end = 0.0, 0.0
    for a, b in spans:  # the union of the spans (p2p waits may overlap a compute span)
        if b > end:
            covered += b - max(a, end)
            end = b
    out["micro_batches"] = float(sum(1 for k, *_ in events if k == "forward"))
    out["step_s"] = end
    out["uncovered_s"] = max(0.0, end - covered)
    return out


def trace_one_step(engine: Any, plan: Any, *, rank: int, device: torch.device, folder: str, index: int,
                   step: Callable[[], object]) -> dict[str, float]:
    """Run ``step()`` (one training step of ``engine``) traced; this rank's :func:`span_totals`.
    Collective: every rank of the plan calls it (the trace's barrier and its gather)."""
    from executor.train.trace import NO_TRACE, StepTrace

    trace = StepTrace(path=os.path.join(folder, f"trace{index}_{rank}.json"), plan=plan, device=device,
                      window=range(0, 1), rank=rank, world=dist.group.WORLD)
    engine.set_trace(trace)
    try:
        trace.begin_step(0)
        step()
        trace.end_step(0)
    finally:
        engine.set_trace(NO_TRACE)
    if not trace.steps:
        return {}
    last = trace.steps[-1]
    host = {f"{k}_host": v for k, v in span_totals(last["host_events"]).items() if k in KINDS}
    return span_totals(last["events"]) | host


KINDS = ("forward", "backward", "p2p", "grad_sync", "optimizer")


def spans_table(rows: Sequence[dict[str, Any]]) -> str:
    """Markdown: per plan with a traced step, each kind's measured milliseconds beside the estimate's
    (``traced_s`` and ``model_spans_s`` of the fidelity rows), the host's inside them where traced
    (``h``), and the time no span covered."""
    out = ["| plan | " + " | ".join(f"{k} ms (est.; h host)" for k in KINDS) + " | uncovered ms |",
           "|---|" + "---:|" * (len(KINDS) + 1)]
    for r in rows:
        t, m = r.get("traced_s"), r.get("model_spans_s")
        if not t or not m:
            continue
        cells = [f"{t.get(k, 0.0) * 1e3:.1f} ({m.get(k, 0.0) * 1e3:.1f}"
                 + (f"; h {t[k + '_host'] * 1e3:.1f})" if k + "_host" in t else ")") for k in KINDS]
        out.append(f"| {r['plan']} | " + " | ".join(cells) + f" | {t.get('uncovered_s', 0.0) * 1e3:.1f} |")
    return "\n".join(out) if len(out) > 2 else ""
