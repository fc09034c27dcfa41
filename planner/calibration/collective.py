"""``collective_host_s`` fitted to the live TP rows: what one TP all-reduce costs inside an eager pass.

``hexiscale calibrate`` measures a TP collective's issue time alone (``measured.comm.tp_issue_s``:
~80 us on 4x H100) and times the layer live on ``t`` ranks with its all-reduces
(:mod:`executor.profiler.live_tp`). The stage model prices a TP layer that has no live row (another
model width, another micro-batch) as the shard-only layer plus its collectives
(:func:`planner.cost.stage.stage_time`), each charging ``collective_host_s`` on the host side. With
the issue time, that composition fell 9-24 % short of the live forward rows on 4x H100
(2026-11-27, tests/data/calibration/h100x4-20261127): inside a launch-bound pass an all-reduce also
waits for the slowest rank's host to reach it. Fitting the term to the live rows — the composition
of one layer against each live timing, relative error — gives the cost as the executor pays it
(~0.3 ms there; composition error 12 % -> ~4 % mean).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from planner.calibration.fit import FitResult, fit_terms
from planner.catalog import DeviceType
from planner.cluster import Link
from planner.cost.measured import MeasuredProfile
from planner.cost.params import CostParams
from planner.cost.pass_times import host_free, pass_seconds
from planner.cost.stage import stage_time
from planner.model import model_from_dict

BOUNDS = {"collective_host_s": (0.0, 2e-3)}


def live_rows(device: DeviceType) -> list[dict[str, Any]]:
    """The layer rows of ``device`` timed live with their TP collectives."""
    return [r for r in (device.measured or {}).get("layer") or [] if r.get("collectives")]


def shard_only(device: DeviceType) -> DeviceType:
    """``device`` without its live rows: the profile a TP layer off the live table is priced from."""
    m = device.measured or {}
    return replace(device, measured={**m, "layer": [r for r in m.get("layer") or [] if not r.get("collectives")]})


def fit_collective_host(device: DeviceType, base: CostParams, link: Link) -> FitResult | None:
    """``collective_host_s`` from ``device``'s live rows, each priced as one shard-only layer plus its
    all-reduces over ``link`` (module docstring); None where the profile has no live rows."""
    rows = live_rows(device)
    if not rows:
        return None
    model = model_from_dict((device.measured or {}).get("model"), f"devices.{device.key}.measured.model")
    dtype = str((device.measured or {}).get("dtype", "bf16"))
    shard = shard_only(device)

    def predict(params: CostParams) -> list[float]:
        prof = MeasuredProfile(shard, params)
        out = []
        for r in rows:
            mm = replace(model, seq_len=max(model.seq_len, int(r["seq_len"])))
            st = stage_time(mm, layers=1, first=False, last=False, micro_batch=int(r["micro_batch"]),
                            tp=int(r["tp"]), devices=[(prof, 1.0)], tp_link=link, dtype=dtype,
                            recompute=str(r.get("recompute", "none")), params=params, seq_len=int(r["seq_len"]))
            out += [st.forward_s, st.backward_s]
        return out

    full_queue = host_free(device.measured)  # a pass costs max(device, host) of host-free rows
    measured = [pass_seconds(r, k, full_queue) for r in rows for k in ("forward_s", "backward_s")]
    return fit_terms(base, BOUNDS, predict, measured)
