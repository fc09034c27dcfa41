"""Least-squares fits of named ``CostParams`` terms to measurements (scipy).

Every fit minimises the relative error ``log(predicted / measured)`` over its observations with
``scipy.optimize.least_squares`` (trust-region reflective, bounded), changing only the terms it names;
the result lists each fitted term and the error before and after, so a term that cannot explain the
data shows up as a large remaining error rather than being hidden by a global factor.

* :func:`fit_compute` — ``gemm_efficiency``, ``gemm_half_dim``, ``attention_efficiency``,
  ``attention_half_seq``, ``memory_efficiency``, ``kernel_overhead_s``, the host overheads and
  ``checkpoint_host_s`` (without it the full-recompute rows of a 4x H100 calibration were 30-38 %
  off and the held-out error 12.2 %; with it 6.8 %: tests/planner/test_calibration_h100x4.py)
  against a measured device's layer timings (its shard-only table and other widths; roofline of
  that device's catalog peaks; the live TP rows, which hold collectives, are not compute); the
  GEMM and memory efficiencies are capped by the measured ceilings (large GEMM, large copy) when
  the profile has them. Host-free rows (``"device_times": "full-queue"``, :mod:`planner.cost.pass_times`)
  are two sets of observations: their device times against the roofline's GPU time alone (the
  GPU terms), their host times against its host time alone (``host_overhead_s``,
  ``host_overhead_backward_s``, ``checkpoint_host_s``): :meth:`planner.cost.profile.DeviceProfile.roofline_split`.
  Older rows timed ``max(GPU, host)`` in one figure, and a launch-bound one (4x H100, 2026-11-27:
  almost every llama-1.3b row) fitted GPU terms to the host's issue rate; they still fit as before.
* :func:`fit_link_efficiency` — ``link_efficiency`` = measured bandwidth / nominal link bandwidth
  (the p2p and all-reduce sweeps of the profiler; the fitted latency belongs to the cluster file).
* :func:`fit_terms` — any terms against any observations, given a function that predicts them
  (the fidelity benchmark uses it for ``dp_overlap`` against measured step times and for
  ``workspace_gib``/``fragmentation`` against measured memory).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from planner.catalog import DeviceType
from planner.cost.params import CostParams
from planner.cost.pass_times import HOST_KEY, host_free, split_times
from planner.cost.profile import SpecProfile
from planner.model import ModelSpec, model_from_dict

COMPUTE_TERMS: dict[str, tuple[float, float]] = {
    "gemm_efficiency": (0.05, 1.0),
    "gemm_half_dim": (0.0, 4096.0),
    "attention_efficiency": (0.05, 1.0),
    "attention_half_seq": (0.0, 8192.0),
    "memory_efficiency": (0.05, 1.0),
    "kernel_overhead_s": (0.0, 1e-3),
    "host_overhead_s": (0.0, 1e-4),
    "host_overhead_backward_s": (0.0, 1e-4),
    "checkpoint_host_s": (0.0, 5e-3),
}


@dataclass
class FitResult:
    params: CostParams
    terms: dict[str, float]
    error_before: dict[str, float]  # mean |rel err|, max |rel err|
    error_after: dict[str, float]
    observations: int
    residuals: list[dict[str, Any]] = field(default_factory=list)
    basis: str = "pass"  # what each timing was matched to: the pass, or "device+host" apart (host-free rows)
    by_side: dict[str, dict[str, float]] = field(default_factory=dict)  # "device+host": each side's error after

    def to_dict(self) -> dict[str, Any]:
        return {"terms": self.terms, "error_before": self.error_before, "error_after": self.error_after,
                "observations": self.observations, "basis": self.basis, "by_side": self.by_side}


def _errors(log_ratios: np.ndarray) -> dict[str, float]:
    """Mean and worst relative error, and ``rms_log`` (what :func:`fit_terms` minimises: a fit never
    raises it, while the mean relative error may rise a little on noisy rows)."""
    rel = np.abs(np.exp(log_ratios) - 1.0)
    if not rel.size:
        return {"mean_abs_rel": 0.0, "max_abs_rel": 0.0, "rms_log": 0.0}
    return {"mean_abs_rel": float(rel.mean()), "max_abs_rel": float(rel.max()),
            "rms_log": float(np.sqrt(np.mean(log_ratios**2)))}


def fit_terms(base: CostParams, bounds: dict[str, tuple[float, float]],
              predict: Callable[[CostParams], Sequence[float]], measured: Sequence[float]) -> FitResult:
    """Fit the terms named in ``bounds`` so ``predict(params)`` matches ``measured`` (relative error).
    A term whose bounds leave no room (a measured ceiling below the range) is set to that value."""
    pinned: dict[str, Any] = {n: float(lo) for n, (lo, hi) in bounds.items() if hi <= lo}
    base = replace(base, **pinned) if pinned else base
    names = [n for n in bounds if n not in pinned]
    if not names:
        res = np.log(np.maximum(np.asarray(predict(base), dtype=float), 1e-30) / np.asarray(measured, dtype=float))
        return FitResult(params=base, terms=dict(pinned), error_before=_errors(res), error_after=_errors(res),
                         observations=len(measured))
    meas = np.asarray(measured, dtype=float)
    if meas.size == 0 or np.any(meas <= 0):
        raise ValueError("measurements must be positive and non-empty")
    lo = np.array([bounds[n][0] for n in names])
    hi = np.array([bounds[n][1] for n in names])
    x0 = np.clip(np.array([float(getattr(base, n)) for n in names]), lo, hi)
    # scale each term to O(1) so the solver's steps are balanced
    scale = np.where(hi - lo > 0, hi - lo, 1.0)

    def make(x: np.ndarray) -> CostParams:
        values: dict[str, Any] = {n: float(v) for n, v in zip(names, x)}
        return replace(base, **values)

    def resid(z: np.ndarray) -> np.ndarray:
        pred = np.asarray(predict(make(lo + z * scale)), dtype=float)
        return np.log(np.maximum(pred, 1e-30) / meas)

    from scipy.optimize import least_squares

    z0 = (x0 - lo) / scale
    before = resid(z0)
    start = np.clip(z0, 0.01, 0.99)  # strictly inside the box: a start on a bound can stall there
    sol = least_squares(resid, start, bounds=(np.zeros_like(z0), np.ones_like(z0)), method="trf", x_scale="jac")
    after = resid(sol.x)
    if np.sum(after**2) > np.sum(before**2):  # never return something worse than the start
        sol.x, after = z0, before
    params = make(lo + sol.x * scale)
    return FitResult(params=params, terms={n: float(getattr(params, n)) for n in bounds},
                     error_before=_errors(before), error_after=_errors(after), observations=int(meas.size))


def compute_observations(device: DeviceType) -> list[tuple[str, ModelSpec, dict[str, Any], str, float]]:
    """``(table, model, row, phase, seconds)`` for every measured compute time (``phase``: 'forward_s',
    'backward_s', and for host-free rows their host times, 'forward_host_s', 'backward_host_s'):
    the tables, plus the layer timings of other model widths (``measured.widths``, written by
    ``hexiscale calibrate``) that make the GEMM and attention shape terms identifiable — a fit to
    one width cannot tell a small-GEMM penalty from a lower peak. Live TP rows (``collectives``) are
    left out: they hold the TP all-reduces, which the roofline's compute terms do not model (the
    shard-only rows of the same points are the compute)."""
    m = device.measured or {}
    split = host_free(m)
    sources = [(model_from_dict(m["model"]), {t: m.get(t) or [] for t in ("layer", "embedding", "head")})]
    for i, w in enumerate(m.get("widths") or []):
        sources.append((model_from_dict(w["model"], f"measured.widths[{i}].model"), {"layer": w.get("layer") or []}))
    out = []
    for model, tables in sources:
        for table, rows in tables.items():
            for row in rows:
                if row.get("collectives"):
                    continue
                for phase in ("forward_s", "backward_s"):
                    out.append((table, model, row, phase, float(row[phase])))
                    if split_times(row, phase, split) is not None:
                        out.append((table, model, row, HOST_KEY[phase], float(row[HOST_KEY[phase]])))
    return out


def layer_observations(device: DeviceType) -> list[tuple[str, ModelSpec, dict[str, Any], str, float]]:
    """The observations :func:`fit_compute` fits: the layer timings of every width."""
    return [o for o in compute_observations(device) if o[0] == "layer"]


def predict_compute(device: DeviceType, params: CostParams,
                    obs: list[tuple[str, ModelSpec, dict[str, Any], str, float]], dtype: str) -> list[float]:
    """The roofline's figure for each observation: a host-free device's timings (:func:`compute_observations`)
    against the GPU's or the host's time alone, every other's against the pass (``max(GPU, host)``)."""
    # the roofline measured tables are carried with (planner.cost.measured.MeasuredProfile: a weight cast
    # in every pass, as every calibration so far was fitted)
    prof = SpecProfile(device, replace(params, cast_once=False))
    split = host_free(device.measured)
    out = []
    for table, model, row, phase, _ in obs:
        mm = replace(model, seq_len=max(model.seq_len, int(row["seq_len"])))
        args = (mm, int(row["micro_batch"]), int(row["tp"]), dtype)
        if split:
            mode = str(row.get("recompute", "none")) if table == "layer" else "none"
            gpu, host = prof.roofline_split(table, *args, mode, int(row["seq_len"]))
            out.append({"forward_s": gpu.forward_s, "backward_s": gpu.backward_s, "forward_host_s": host.forward_s,
                        "backward_host_s": host.backward_s}[phase])
            continue
        if table == "layer":
            pt = prof.layer_time(*args, str(row.get("recompute", "none")), int(row["seq_len"]))
        elif table == "embedding":
            pt = prof.embedding_time(*args, int(row["seq_len"]))
        else:
            pt = prof.head_time(*args, int(row["seq_len"]))
        out.append(pt.forward_s if phase == "forward_s" else pt.backward_s)
    return out


def fit_compute(device: DeviceType, base: CostParams, terms: dict[str, tuple[float, float]] | None = None
                ) -> FitResult:
    """Fit the compute terms of the roofline (and the per-kernel host overheads, which set small
    shapes) to one measured device's layer timings: its table and the other widths. The embedding
    and the head are left out: their tables answer for the profiled model directly, and their
    launch-bound sub-millisecond kernels dominated a log-error fit that included them (on a 4x H200
    host, 2026-11-26, it left the layers 10-46 % over-predicted)."""
    obs = layer_observations(device)
    dtype = str((device.measured or {}).get("dtype", "bf16"))
    bounds = compute_bounds(device, terms)
    result = fit_terms(base, bounds, lambda p: predict_compute(device, p, obs, dtype), [o[4] for o in obs])
    result.basis = "device+host" if host_free(device.measured) else "pass"
    pred = predict_compute(device, result.params, obs, dtype)
    result.residuals = [{"table": t, **{k: r[k] for k in ("micro_batch", "seq_len", "tp") if k in r},
                         "recompute": r.get("recompute"), "phase": ph, "measured_s": v, "predicted_s": p}
                        for (t, _, r, ph, v), p in zip(obs, pred)]
    if result.basis != "pass":  # each side's own error: the GPU terms' and the host terms'
        result.by_side = {side: _errors(np.log(np.array([p / v for (_, _, _, ph, v), p in zip(obs, pred)
                                                          if ph.endswith("_host_s") == (side == "host")])))
                          for side in ("device", "host")}
    return result


def compute_bounds(device: DeviceType, terms: dict[str, tuple[float, float]] | None = None
                   ) -> dict[str, tuple[float, float]]:
    """The compute terms' bounds for ``device``: ``terms`` (default :data:`COMPUTE_TERMS`) capped by
    its measured ceilings."""
    dtype = str((device.measured or {}).get("dtype", "bf16"))
    bounds = dict(terms or COMPUTE_TERMS)
    ceilings = (device.measured or {}).get("ceilings") or {}
    # physical caps from the measured ceilings: no GEMM beats the large square GEMM, no memory-bound
    # kernel beats the large device copy (fractions of the catalog's peak and bandwidth)
    caps = {"gemm_efficiency": ceilings.get("gemm_tflops", 0.0) / device.peak(dtype),
            "memory_efficiency": ceilings.get("copy_GBps", 0.0) / device.memory_bandwidth_GBps}
    for name, cap in caps.items():
        if name in bounds and cap > 0:
            lo, hi = bounds[name]
            bounds[name] = (min(lo, cap), min(hi, cap))
    return bounds


def fit_link_efficiency(comm: dict[str, Any], nominal_GBps: float) -> dict[str, float]:
    """``link_efficiency`` from the profiler's communication sweep: the fitted per-link bandwidth of the
    p2p and ring all-reduce series over the link's nominal bandwidth (the larger-message series, p2p and
    all-reduce averaged in log space), capped at 1; also returns the fitted latency."""
    fits = comm.get("fit") or {}
    bws = [f["bandwidth_GBps"] for f in fits.values() if f.get("bandwidth_GBps", 0) > 0]
    lats = [f["latency_us"] for f in fits.values() if f.get("latency_us", 0) > 0]
    if not bws:
        raise ValueError("the communication sweep has no fitted bandwidth")
    bw = math.exp(sum(math.log(b) for b in bws) / len(bws))
    return {"link_efficiency": min(1.0, bw / nominal_GBps), "measured_bandwidth_GBps": bw,
            "latency_us": sum(lats) / len(lats) if lats else 0.0}
