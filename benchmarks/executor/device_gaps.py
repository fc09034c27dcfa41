"""Where a profiled step leaves the GPU idle: gaps between device work and the host ops beside them.

A kernel table says what the GPU did; the step time minus its sum is time the GPU waited for the
host (launch-bound stretches, synchronisations, Python between steps). :func:`device_gaps` reads a
``torch.profiler`` Chrome trace: the union of device activity (kernels, copies, memsets), every
idle gap between the first and the last of it, and for the longest gaps the innermost host op
running when the gap began (what the host was doing instead of launching).
"""

from __future__ import annotations

import bisect
import json
from pathlib import Path
from typing import Any

DEVICE_CATS = ("kernel", "gpu_memcpy", "gpu_memset")
HOST_CATS = ("cpu_op", "user_annotation", "python_function")


def _busy(events: list[dict[str, Any]]) -> list[tuple[float, float]]:
    spans = sorted((float(e["ts"]), float(e["ts"]) + float(e.get("dur", 0.0))) for e in events
                   if e.get("cat") in DEVICE_CATS and e.get("ph") == "X")
    merged: list[tuple[float, float]] = []
    for a, b in spans:
        if merged and a <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], b))
        else:
            merged.append((a, b))
    return merged


def _host_at(host: list[tuple[float, float, str]], starts: list[float], t: float) -> str:
    """The innermost (latest-starting) host op whose span holds ``t``."""
    i = bisect.bisect_right(starts, t)
    best = ""
    for a, b, name in reversed(host[max(0, i - 400):i]):
        if a <= t < b:
            best = name
            break
    return best


def device_gaps(trace: dict[str, Any], *, min_us: float = 20.0, top: int = 12) -> dict[str, Any]:
    """Idle time of the device within the profiled window (µs figures in ms in the result)."""
    events = trace.get("traceEvents", [])
    busy = _busy(events)
    if not busy:
        return {"window_ms": 0.0, "busy_ms": 0.0, "idle_ms": 0.0, "gaps": 0, "largest": []}
    host = sorted((float(e["ts"]), float(e["ts"]) + float(e.get("dur", 0.0)), str(e.get("name", "")))
                  for e in events if e.get("cat") in HOST_CATS and e.get("ph") == "X")
    starts = [h[0] for h in host]
    gaps = [(b0, a1 - b0) for (_, b0), (a1, _) in zip(busy, busy[1:]) if a1 - b0 >= min_us]
    window = busy[-1][1] - busy[0][0]
    busy_us = sum(b - a for a, b in busy)
    largest = sorted(gaps, key=lambda g: -g[1])[:top]
    return {"window_ms": round(window / 1e3, 3), "busy_ms": round(busy_us / 1e3, 3),
            "idle_ms": round((window - busy_us) / 1e3, 3), "gaps": len(gaps),
            "idle_in_gaps_ms": round(sum(d for _, d in gaps) / 1e3, 3),
            "largest": [{"at_ms": round((t - busy[0][0]) / 1e3, 3), "ms": round(d / 1e3, 3),
                         "host_op": _host_at(host, starts, t)[:80]} for t, d in largest]}


def gaps_of_file(path: Path, **kw: Any) -> dict[str, Any]:
    return device_gaps(json.loads(path.read_text()), **kw)


def format_gaps(g: dict[str, Any]) -> str:
    lines = [f"device window {g['window_ms']:.1f} ms: busy {g['busy_ms']:.1f}, idle {g['idle_ms']:.1f} "
             f"({g['gaps']} gaps >= 20 us hold {g.get('idle_in_gaps_ms', 0.0):.1f} ms)"]
    lines += [f"  idle {x['ms']:7.3f} ms at {x['at_ms']:8.2f} ms   host: {x['host_op']}" for x in g["largest"]]
    return "\n".join(lines)
