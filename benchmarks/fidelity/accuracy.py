"""Cost-model fidelity: measured step time and peak memory per GPU of >= 12 plans on one and two H100s
(1 GPU, TP2, PP2, DP2, asymmetric plans, one GPU throttled with MPS, different micro-batch counts) beside
the cost model's predictions from the measured profiles, with the error of each.

The device run (``benchmarks/fidelity/device_run.py``: ``profile`` then ``runs``) writes the measured profiles and
``runs.json``; this program (no GPU needed) calibrates the named terms and prints the table:

1. compute terms (``gemm_efficiency`` ... ``kernel_overhead_s``) fitted to the 100 % profile's tables
   (they shape the roofline between and beyond the measured points; the tables set the level);
2. ``link_efficiency`` from the measured p2p/all-reduce sweep over the nominal NVLink bandwidth, and the
   link latency from the same sweep (a cluster-file figure);
3. ``framework_gib`` = the measured device memory of a fresh CUDA context; ``workspace_gib`` and
   ``fragmentation`` fitted to the measured memory of the calibration plans only (``CALIBRATION_PLANS``);
   every other plan is held out, and the summary gives the held-out errors separately.

    python -m benchmarks.fidelity.accuracy --runs RUNS.json --profiles DIR [--write-calibration FILE]
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import statistics
from dataclasses import replace
from pathlib import Path
from typing import Any

from benchmarks.fidelity.model import NVLINK_NOMINAL_GBPS, catalog_with, device_key, pair_cluster, predict
from planner.calibration.fit import fit_compute, fit_link_efficiency, fit_terms
from planner.catalog import Catalog, profiles_dir
from planner.cost.params import DEFAULT_PARAMS, CostParams
from planner.plan import plan_from_dict

CALIBRATION_PLANS = ("1gpu-m4", "pp2-even-m4", "dp2-even")
MEMORY_TERMS = {"workspace_gib": (0.0, 8.0), "fragmentation": (0.0, 0.5)}


def _cluster_for(rec: dict[str, Any], catalog: Catalog, link: dict[str, float], cpu: bool):  # type: ignore[no-untyped-def]
    sm = rec["sm"]
    return pair_cluster((device_key(sm[0], cpu), device_key(sm[1] if len(sm) > 1 else sm[0], cpu)), catalog,
                        bandwidth_GBps=NVLINK_NOMINAL_GBPS, latency_us=link.get("latency_us", 10.0))


def device_memory(rank: dict[str, Any], context_gib: float | None = None) -> float:
    """Device memory a plan needs on one GPU, counted per process (what the cost model predicts):
    the allocator's peak reserve (``max_memory_reserved``) + the plan's NCCL communicators outside
    the allocator (``comm_gib``, benchmarks/fidelity/worker.py) + one CUDA context. The context is
    ``context_gib`` when given — measured by a process alone on its GPU (``hexiscale calibrate``'s
    ``framework_gib``) — else the worker's own reading at its start. Device-wide "in use" figures
    are not used: under MPS they include the server and the other clients (4 x H200, 2026-11-26:
    MPS plans read 32-155 % under the estimate that way).

    Records without ``comm_gib`` (older runs) fall back to the device-wide figure less what earlier
    plans of the same process left behind: ``in_use - (in_use_before - context)``."""
    if "comm_gib" in rank and "max_reserved_gib" in rank:
        ctx = float(rank.get("context_gib", 0.0)) if context_gib is None else context_gib
        # the peak counts whatever earlier plans of the process still held (0 since the leak fix)
        earlier = float(rank.get("allocated_before_gib", 0.0))
        return float(rank["max_reserved_gib"]) - earlier + float(rank["comm_gib"]) + ctx
    leftover = max(0.0, rank.get("in_use_before_gib", 0.0) - rank.get("context_gib", 0.0))
    return float(rank["in_use_gib"]) - leftover


def measured_plans(runs: dict[str, Any]) -> list[dict[str, Any]]:
    out = []
    for launch in runs["launches"]:
        for p in launch["plans"]:
            out.append({**p, "launch": launch["name"], "sm": p.get("sm") or launch["sm"]})
    return out


def calibrate(runs: dict[str, Any], catalog: Catalog, cpu: bool, start: CostParams = DEFAULT_PARAMS
              ) -> tuple[CostParams, dict[str, Any], dict[str, float]]:
    """Fit the named terms (see the module docstring); returns params, a report of each fit, the link.
    Terms without data in ``runs`` keep their value in ``start``."""
    fits: dict[str, Any] = {}
    params = start
    base = catalog.get(device_key(100, cpu))
    if base.measured:
        res = fit_compute(base, params)
        params = res.params
        fits["compute"] = {**res.to_dict(), "device": base.key}
    link: dict[str, float] = {}
    comm = (base.measured or {}).get("comm")
    if comm:
        link = fit_link_efficiency(comm, NVLINK_NOMINAL_GBPS)
        params = replace(params, link_efficiency=link["link_efficiency"])
        fits["link"] = link
    contexts = [r["context_gib"] for p in measured_plans(runs) for r in p.get("ranks", []) if r.get("context_gib")]
    if contexts:
        params = replace(params, framework_gib=statistics.median(contexts))
        fits["framework_gib"] = {"measured_context_gib": statistics.median(contexts), "samples": len(contexts)}
    cal = [p for p in measured_plans(runs) if p["name"] in CALIBRATION_PLANS and p["launch"] == "sm100-100"
           and "error" not in p and all(r.get("in_use_gib") for r in p["ranks"])]
    if cal:
        obs = [(p, r) for p in cal for r in p["ranks"]]

        def mem_pred(pp: CostParams) -> list[float]:
            out = []
            for p, r in obs:
                pred = predict(plan_from_dict(p["plan"]), _cluster_for(p, catalog, link, cpu), pp)
                out.append(pred["memory_gib"][r["device"]])
            return out

        res = fit_terms(params, MEMORY_TERMS, mem_pred, [device_memory(r) for _, r in obs])
        params = res.params
        fits["memory"] = {**res.to_dict(), "plans": list(CALIBRATION_PLANS)}
    return params, fits, link


def evaluate(runs: dict[str, Any], catalog: Catalog, params: CostParams, link: dict[str, float],
             cpu: bool) -> list[dict[str, Any]]:
    rows = []
    for p in measured_plans(runs):
        plan = plan_from_dict(p["plan"])
        row: dict[str, Any] = {"plan": p["name"], "launch": p["launch"], "sm": p["sm"],
                               "calibration": p["name"] in CALIBRATION_PLANS and p["launch"] == "sm100-100"}
        pred = predict(plan, _cluster_for(p, catalog, link, cpu), params)
        row.update(predicted_s=pred["step_time_s"], breakdown=pred["breakdown"], bottleneck=pred["bottleneck"])
        if "error" in p:
            row["error"] = p["error"].strip().splitlines()[-1][:200]
            rows.append(row)
            continue
        row["measured_s"] = p["step_time_s"]
        row["time_err"] = pred["step_time_s"] / p["step_time_s"] - 1.0
        mems = []
        for r in p["ranks"]:
            if r.get("in_use_gib"):
                pm = pred["memory_gib"][r["device"]]
                mm = device_memory(r)
                mems.append({"device": r["device"], "measured_gib": mm, "predicted_gib": pm,
                             "err": pm / mm - 1.0, "max_allocated_gib": r.get("max_allocated_gib")})
        row["memory"] = mems
        rows.append(row)
    return rows


def summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
    def stats(sel: list[dict[str, Any]]) -> dict[str, Any]:
        t = [abs(r["time_err"]) for r in sel if "time_err" in r]
        m = [abs(x["err"]) for r in sel for x in r.get("memory", [])]
        return {"plans": len(t), "time_mean_abs": statistics.mean(t) if t else None,
                "time_max_abs": max(t, default=None), "memory_mean_abs": statistics.mean(m) if m else None,
                "memory_max_abs": max(m, default=None)}

    return {"all": stats(rows), "held_out": stats([r for r in rows if not r["calibration"]]),
            "failed": [r["plan"] for r in rows if "error" in r]}


def markdown(rows: list[dict[str, Any]], summ: dict[str, Any], fits: dict[str, Any], meta: dict[str, Any]) -> str:
    lines = [f"Measured on {meta.get('gpus', '?')}, torch {meta.get('torch', '?')}, {meta.get('date', '?')[:10]}; "
             "model llama-1.3b cut to 8 layers, seq 2048, bf16 autocast; median of 5 steps after 2 warm-up steps.", "",
             "| plan | SM % (g0, g1) | measured ms | predicted ms | error | memory GiB measured → predicted (error) "
             "| dominant term |",
             "|---|---|---:|---:|---:|---|---|"]
    for r in rows:
        sm = "/".join(str(s) for s in r["sm"])
        name = r["plan"] + (" (fit)" if r["calibration"] else "")
        if "error" in r:
            lines.append(f"| {name} | {sm} | failed: {r['error'][:60]} | {r['predicted_s'] * 1e3:.1f} | | | |")
            continue
        mem = "; ".join(f"{m['device'][:2]} {m['measured_gib']:.2f} → {m['predicted_gib']:.2f} "
                        f"({m['err'] * 100:+.1f} %)" for m in r["memory"])
        lines.append(f"| {name} | {sm} | {r['measured_s'] * 1e3:.1f} | {r['predicted_s'] * 1e3:.1f} | "
                     f"{r['time_err'] * 100:+.1f} % | {mem} | {r['bottleneck'].get('term')} |")
    a, h = summ["all"], summ["held_out"]

    def pct(x: float | None) -> str:
        return "n/a" if x is None else f"{x * 100:.1f} %"

    lines += ["", f"Step time: mean |error| {pct(a['time_mean_abs'])}, worst {pct(a['time_max_abs'])} over "
              f"{a['plans']} plans (held out: mean {pct(h['time_mean_abs'])}, worst {pct(h['time_max_abs'])}). "
              f"Memory: mean |error| {pct(a['memory_mean_abs'])}, worst {pct(a['memory_max_abs'])} "
              f"(held out: mean {pct(h['memory_mean_abs'])}, worst {pct(h['memory_max_abs'])}).", "",
              "Calibrated terms: " + json.dumps({k: (v.get("terms") if isinstance(v, dict) and "terms" in v else v)
                                                 for k, v in fits.items()}, default=float)]
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", required=True)
    ap.add_argument("--profiles", default=str(profiles_dir() / "devices"))
    ap.add_argument("--cpu", action="store_true", help="the runs came from the CPU rehearsal")
    ap.add_argument("--device-prefix", default="h100-sxm", help="catalog keys <prefix>-measured, <prefix>-mps<N>")
    ap.add_argument("--write-calibration", help="write the calibrated terms here "
                    "(planner/profiles/calibration/h100.json)")
    ap.add_argument("--start-from", help="calibration file whose terms start the fit (e.g. the memory terms "
                    "fitted on another device of the same software)")
    ap.add_argument("--json-out", default=str(Path(__file__).resolve().parents[1] / "results" / "fidelity.json"))
    args = ap.parse_args()
    from benchmarks.fidelity.model import DEVICE_PREFIX

    DEVICE_PREFIX["prefix"] = args.device_prefix
    runs = json.loads(Path(args.runs).read_text())
    catalog = catalog_with(sorted(Path(args.profiles).glob("*.json")))
    start = DEFAULT_PARAMS
    if args.start_from:
        from planner.calibration.store import load_params

        start = load_params(Path(args.start_from))
    params, fits, link = calibrate(runs, catalog, args.cpu, start)
    rows = evaluate(runs, catalog, params, link, args.cpu)
    summ = summary(rows)
    meta = runs.get("device_meta") or {}
    print(markdown(rows, summ, fits, meta))
    result = {"meta": {**meta, "report_date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
                       "runs": args.runs}, "params": params.to_dict(), "fits": fits, "rows": rows, "summary": summ}
    Path(args.json_out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json_out).write_text(json.dumps(result, indent=1, default=float) + "\n")
    if args.write_calibration:
        from planner.calibration.store import save_calibration

        fitted = {k: v for f in fits.values() if isinstance(f, dict) and "terms" in f for k, v in f["terms"].items()}
        fitted.update(link_efficiency=params.link_efficiency, framework_gib=params.framework_gib)
        prov = {**meta, "runs": Path(args.runs).name, "calibration_plans": list(CALIBRATION_PLANS),
                "started_from": args.start_from}
        save_calibration(Path(args.write_calibration), params, fitted=fitted, fits=fits, provenance=prov)


if __name__ == "__main__":
    main()
