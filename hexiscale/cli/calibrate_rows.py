"""What ``hexiscale calibrate`` reports of its layer rows: each pass's device and host time, so a run
shows whether the device was timed apart from the host (``"device_times": "full-queue"`` on CUDA,
executor/profiler/timing.py) and which passes are launch-bound (host above device: the step pays the
host's time, the cost model ``max(device, host)``)."""

from __future__ import annotations

from typing import Any

from planner.cost.pass_times import FULL_QUEUE


def row_lines(summary: dict[str, Any]) -> list[str]:
    """One heading and one line per layer row that carries host times (none: no lines)."""
    rows = [r for r in summary.get("layer_rows") or [] if "forward_host_s" in r and "backward_host_s" in r]
    if not rows:
        return []
    bound = sum(r[f"{ph}_host_s"] > r[f"{ph}_s"] for r in rows for ph in ("forward", "backward"))
    how = ("device timed from a full queue, host-free" if summary.get("device_times") == FULL_QUEUE
           else "device and host on one clock")
    out = [f"layer rows, device/host ms per pass ({how}): {bound} of {2 * len(rows)} passes launch-bound "
           "(host > device)"]
    for r in rows:
        live = " live" if r.get("collectives") else ""
        out.append(f"  tp{r['tp']} mb{r['micro_batch']} s{r['seq_len']} {r['recompute']}{live}: "
                   f"fwd {r['forward_s'] * 1e3:.2f}/{r['forward_host_s'] * 1e3:.2f} "
                   f"bwd {r['backward_s'] * 1e3:.2f}/{r['backward_host_s'] * 1e3:.2f}")
    return out
