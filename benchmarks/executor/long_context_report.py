"""Rows, table and verdict of :mod:`benchmarks.executor.long_context`.

A row is a plan's prediction beside its measurement (or why it was not measured). The verdict is the
issue-35 claim: the planner's CP plan trains where every no-CP ("TP-only") plan runs out of memory
or is >= 1.3x slower than it, and the cost model predicts both within 10 %. When the planner's plan
uses no CP, the fastest measured hand-written CP plan stands in, and the verdict says so.
"""

from __future__ import annotations

import statistics
from typing import Any

from benchmarks.executor.long_context_plans import PREDICTED_OOM, PREDICTED_TIGHT, Candidate, describe

TARGET_RATIO = 1.3
TARGET_ERROR = 0.10
MEASURED = "measured"
OOM_MEASURED = "OOM (measured)"


def is_oom(error: str) -> bool:
    return "OutOfMemoryError" in error or "out of memory" in error


def result_row(cand: Candidate, result: dict[str, Any] | None) -> dict[str, Any]:
    """One table row: ``cand``'s prediction and, when it ran, the fidelity worker's ``result`` (median
    step time; per-process peak memory as :func:`benchmarks.fidelity.accuracy.device_memory` counts it)."""
    from benchmarks.fidelity.accuracy import device_memory
    from planner.plan import plan_to_dict

    row: dict[str, Any] = {"plan": cand.name, "source": cand.source, **describe(cand.plan),
                           "predicted_s": cand.predicted_s, "predicted_peak_gib": cand.predicted_peak_gib,
                           "capacity_gib": cand.capacity_gib, "status": cand.status, "layout": plan_to_dict(cand.plan)}
    if result is None:
        return row
    if "phases_s" in result:
        row["phases_s"] = result["phases_s"]
    if "error" in result:
        last = result["error"].strip().splitlines()[-1][:200]
        row.update(status=OOM_MEASURED if is_oom(result["error"]) else f"failed: {last}", error=last)
        return row
    row.update(status=MEASURED, measured_s=result["step_time_s"],
               time_err=cand.predicted_s / result["step_time_s"] - 1.0)
    peaks = [device_memory(r) for r in result["ranks"] if "max_reserved_gib" in r]
    if peaks:
        row["measured_peak_gib"] = max(peaks)
    # the allocator's peak of live tensors beside its reserve: what the reserve adds (fragmentation)
    allocated = [r["max_allocated_gib"] - r.get("allocated_before_gib", 0.0) for r in result["ranks"]
                 if "max_allocated_gib" in r]
    if allocated:
        row["measured_allocated_gib"] = max(allocated)
    return row


def add_ratios(rows: list[dict[str, Any]]) -> None:
    """``vs_planner``: each measured row's step time over the planner's (> 1: slower than the planner's)."""
    base = next((r for r in rows if r["source"] == "planner" and r["status"] == MEASURED), None)
    for r in rows:
        if base is not None and r["status"] == MEASURED:
            r["vs_planner"] = r["measured_s"] / base["measured_s"]


def summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """The verdict's figures (module docstring)."""
    measured = [r for r in rows if r["status"] == MEASURED]
    planner = next((r for r in rows if r["source"] == "planner"), None)
    cp_rows = [r for r in measured if r["uses_cp"]]
    if planner is not None and planner["uses_cp"]:
        cp_best = planner if planner["status"] == MEASURED else None
    else:
        cp_best = min(cp_rows, key=lambda r: r["measured_s"], default=None)
    no_cp = [r for r in rows if not r["uses_cp"]]
    no_cp_best = min((r for r in no_cp if r["status"] == MEASURED), key=lambda r: r["measured_s"], default=None)
    errs = [abs(r["time_err"]) for r in measured]
    out: dict[str, Any] = {
        "planner_plan": _layout(planner) if planner else None,
        "planner_uses_cp": bool(planner and planner["uses_cp"]),
        "cp_plan": cp_best["plan"] if cp_best else None,
        "best_no_cp_plan": no_cp_best["plan"] if no_cp_best else None,
        "no_cp_oom": sorted(r["plan"] for r in no_cp if r["status"] == OOM_MEASURED),
        "no_cp_predicted_oom": sorted(r["plan"] for r in no_cp if r["status"] == PREDICTED_OOM),
        "no_cp_tight": sorted(r["plan"] for r in no_cp if r["status"] == PREDICTED_TIGHT),
        "no_cp_skipped": sorted(r["plan"] for r in no_cp if r["status"].startswith("skipped")),
        "time_mean_abs_err": statistics.mean(errs) if errs else None,
        "time_max_abs_err": max(errs) if errs else None,
    }
    if cp_best is not None:
        out["cp_time_err"] = cp_best["time_err"]
        if no_cp_best is not None:
            out["no_cp_over_cp"] = no_cp_best["measured_s"] / cp_best["measured_s"]
            out["best_no_cp_time_err"] = no_cp_best["time_err"]
        out["met_speed"] = no_cp_best is None or out["no_cp_over_cp"] >= TARGET_RATIO
        both = [out["cp_time_err"]] + ([out["best_no_cp_time_err"]] if no_cp_best else [])
        out["met_prediction"] = all(abs(e) <= TARGET_ERROR for e in both)
    return out


def _layout(r: dict[str, Any]) -> str:
    same = f" = {r['same_as']}" if "same_as" in r else ""
    return f"dp {r['dp']} x pp {r['pp']}, cp {r['cp']}, tp {r['tp']}, recompute {r['recompute']}{same}"


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{x * 100:+.1f} %"


def summary_lines(s: dict[str, Any]) -> list[str]:
    """The lines the issue's Done-when reads (speed against the best no-CP plan, prediction errors)."""
    lines = []
    who = "the planner's plan" if s["planner_uses_cp"] else "the fastest hand-written CP plan"
    if not s["planner_uses_cp"]:
        lines.append(f"the planner's plan ({s['planner_plan']}) uses no CP: the claim below is for {who}, "
                     "and the planner's plan counts as a no-CP plan")
    if s["cp_plan"] is None:
        return lines + [f"no CP plan was measured ({who}): the claim cannot be checked in this run"]
    oom = ", ".join(s["no_cp_oom"] + [f"{p} (predicted)" for p in s["no_cp_predicted_oom"]]) or "none"
    if s["best_no_cp_plan"] is None:
        lines.append(f"{who} {s['cp_plan']} trains; every no-CP plan ran out of memory or was not run "
                     f"(OOM: {oom}): met")
    else:
        lines.append(f"{who} {s['cp_plan']} against the fastest no-CP plan {s['best_no_cp_plan']}: it is "
                     f"{s['no_cp_over_cp']:.2f}x slower (target >= {TARGET_RATIO}x: "
                     f"{'met' if s['met_speed'] else 'missed'}); no-CP OOM: {oom}")
    if s["no_cp_tight"]:
        lines.append(f"{PREDICTED_TIGHT.removesuffix(', not run')}, so not run (not counted as OOM): "
                     f"{', '.join(s['no_cp_tight'])}")
    if s["no_cp_skipped"]:
        lines.append(f"not run for the GPU-time budget (predicted slower): {', '.join(s['no_cp_skipped'])}")
    lines.append(f"prediction error: {s['cp_plan']} {_pct(s['cp_time_err'])}, best no-CP "
                 f"{_pct(s.get('best_no_cp_time_err'))} (target within {TARGET_ERROR:.0%}: "
                 f"{'met' if s['met_prediction'] else 'missed'}); all measured: mean |error| "
                 f"{_pct(s['time_mean_abs_err'])}, worst {_pct(s['time_max_abs_err'])}")
    return lines


def _gib(x: float | None) -> str:
    return "-" if x is None else f"{x:.1f}"


def table(rows: list[dict[str, Any]]) -> str:
    out = ["| plan | cp | tp | dp x pp | recompute | predicted s | measured s | error | peak GiB pred / meas | "
           "vs planner | status |", "|---|---|---|---|---|---:|---:|---:|---:|---:|---|"]
    for r in rows:
        meas = f"{r['measured_s']:.3f}" if "measured_s" in r else "-"
        ratio = f"{r['vs_planner']:.2f}x" if "vs_planner" in r else "-"
        name = f"{r['plan']} (= {r['same_as']})" if "same_as" in r else r["plan"]
        out.append(f"| {name} | {r['cp']} | {r['tp']} | {r['dp']} x {r['pp']} | {r['recompute']} | "
                   f"{r['predicted_s']:.3f} | {meas} | {_pct(r.get('time_err'))} | "
                   f"{_gib(r['predicted_peak_gib'])} / {_gib(r.get('measured_peak_gib'))} | {ratio} | "
                   f"{r['status'][:70]} |")
    return "\n".join(out)
