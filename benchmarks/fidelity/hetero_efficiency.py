"""Heterogeneous efficiency: the planned plan on a GPU pair {100 %, 50 % SMs} against the best plan on a
pair {75 %, 75 %} — the same total compute (MPS SM shares on two H100s).

Plans are chosen with the cost model directly (measured profiles of each SM share, calibrated terms)
among every PP split (either GPU first), every DP batch split and TP2 (``benchmarks.fidelity.plans.hetero_candidates``;
global batch 24, micro-batches of 4 samples). The device run (``device_run.py runs``) measures the cost
model's top two of each pair; this report takes the cost model's first choice of each pair, and::

    gap = 1 - throughput(pick on {100, 50}) / throughput(pick on {75, 75})

(also shown with the best measured candidate of each pair, which tells a planning miss from a true gap).

    python -m benchmarks.fidelity.hetero_efficiency --runs RUNS.json --profiles DIR [--calibration FILE]
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
from pathlib import Path
from typing import Any

from benchmarks.fidelity.model import catalog_with, device_key, pair_cluster, predict
from benchmarks.fidelity.plans import hetero_candidates
from planner.catalog import profiles_dir
from planner.cost.params import DEFAULT_PARAMS, CostParams
from planner.cost.pass_times import host_free, pass_seconds
from planner.model import ModelSpec
from planner.plan import Plan, plan_from_dict

HETERO_PAIRS = ((100, 50), (75, 75))


def choose_candidates(model: ModelSpec, pair: tuple[int, int], prof_dir: Path, *, cpu: bool, top: int,
                      params: CostParams = DEFAULT_PARAMS, micro: int = 4) -> list[tuple[str, Plan, float]]:
    """The ``top`` candidates on ``pair`` ranked by the cost model's step time (OOM plans dropped)."""
    catalog = catalog_with(sorted(Path(prof_dir).glob("*.json")))
    cluster = pair_cluster((device_key(pair[0], cpu), device_key(pair[1], cpu)), catalog)
    scored = []
    from planner.cost import ProfileSet, estimate

    profiles = ProfileSet(catalog, params)
    for name, plan in hetero_candidates(model, pair, micro):
        est = estimate(plan, cluster, profiles)
        if est.fits:
            scored.append((name, plan, est.step_time_s))
    scored.sort(key=lambda x: x[2])
    return scored[:top]


def report(runs: dict[str, Any], prof_dir: Path, params: CostParams, cpu: bool) -> dict[str, Any]:
    from planner.model import model_from_dict

    model = model_from_dict(runs["model"])
    catalog = catalog_with(sorted(Path(prof_dir).glob("*.json")))
    rows, picks = [], {}
    for pair in HETERO_PAIRS:
        tag = f"{pair[0]}-{pair[1]}"
        launch = next((x for x in runs["launches"] if x["name"] == f"hetero-{tag}"), None)
        if launch is None:
            continue
        cluster = pair_cluster((device_key(pair[0], cpu), device_key(pair[1], cpu)), catalog)
        measured = []
        for p in launch["plans"]:
            plan = plan_from_dict(p["plan"])
            pred = predict(plan, cluster, params)["step_time_s"]
            meas = p.get("step_time_s")
            tokens = plan.global_batch_size * model.seq_len
            rows.append({"pair": tag, "plan": p["name"], "predicted_s": pred, "measured_s": meas,
                         "measured_tokens_per_s": tokens / meas if meas else None})
            if meas:
                measured.append((pred, meas, p["name"], tokens))
        if measured:
            pick = min(measured)  # the cost model's choice
            best = min(measured, key=lambda x: x[1])
            picks[tag] = {"pick": pick[2], "pick_tokens_per_s": pick[3] / pick[1],
                          "best_measured": best[2], "best_tokens_per_s": best[3] / best[1]}
    out: dict[str, Any] = {"rows": rows, "picks": picks}
    if "100-50" in picks and "75-75" in picks:
        h, o = picks["100-50"], picks["75-75"]
        out["gap_planned"] = 1.0 - h["pick_tokens_per_s"] / o["pick_tokens_per_s"]
        out["gap_best_measured"] = 1.0 - h["best_tokens_per_s"] / o["best_tokens_per_s"]
        mb = plan_from_dict(runs["launches"][-1]["plans"][0]["plan"]).pipelines[0].micro_batch_sizes()[0]
        speed = {sm: layer_speed(catalog, device_key(sm, cpu), mb, model.seq_len) for sm in (100, 50, 75)}
        if all(v is not None for v in speed.values()):
            ratio = (speed[100] + speed[50]) / (2 * speed[75])  # type: ignore[operator]
            out["measured_compute"] = {"layer_speed_per_s": speed, "pair_ratio_100_50_over_75_75": ratio}
            out["gap_planned_compute_normalised"] = 1.0 - (1.0 - out["gap_planned"]) / ratio
    return out


def layer_speed(catalog: Any, key: str, micro_batch: int, seq_len: int) -> float | None:
    """Layers per second (forward + backward, TP 1, no recompute) of a measured device at this micro-batch:
    the measured compute of an MPS share, which is not proportional to the share."""
    measured = catalog.get(key).measured or {}
    full_queue = host_free(measured)  # a pass costs max(device, host) of host-free rows
    for r in measured.get("layer", []):
        if (r["micro_batch"], r["seq_len"], r["tp"], r["recompute"]) == (micro_batch, seq_len, 1, "none"):
            return 1.0 / (pass_seconds(r, "forward_s", full_queue) + pass_seconds(r, "backward_s", full_queue))
    return None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", required=True)
    ap.add_argument("--profiles", default=str(profiles_dir() / "devices"))
    ap.add_argument("--calibration", help="calibrated CostParams file "
                    "(default: planner/profiles/calibration/h100.json)")
    ap.add_argument("--cpu", action="store_true")
    ap.add_argument("--device-prefix", default="h100-sxm", help="catalog keys <prefix>-measured, <prefix>-mps<N>")
    ap.add_argument("--json-out",
                    default=str(Path(__file__).resolve().parents[1] / "results" / "hetero_efficiency.json"))
    args = ap.parse_args()
    from planner.calibration.store import default_calibration_path, load_params

    cal = Path(args.calibration) if args.calibration else default_calibration_path()
    params = load_params(cal) if cal.exists() else DEFAULT_PARAMS
    from benchmarks.fidelity.model import DEVICE_PREFIX

    DEVICE_PREFIX["prefix"] = args.device_prefix
    runs = json.loads(Path(args.runs).read_text())
    res = report(runs, Path(args.profiles), params, args.cpu)
    from rich.table import Table

    from hexiscale.cli.output import console

    t = Table(title="Heterogeneous efficiency: {100 %, 50 %} vs {75 %, 75 %} SMs")
    for c in ("pair", "plan", "predicted ms", "measured ms", "tokens/s"):
        t.add_column(c, justify="right")
    for r in res["rows"]:
        t.add_row(r["pair"], r["plan"], f"{r['predicted_s'] * 1e3:.1f}",
                  f"{r['measured_s'] * 1e3:.1f}" if r["measured_s"] else "-",
                  f"{r['measured_tokens_per_s']:.0f}" if r["measured_tokens_per_s"] else "-")
    console.print(t)
    for tag, p in res["picks"].items():
        console.print(f"{tag}: cost-model pick {p['pick']} {p['pick_tokens_per_s']:.0f} tok/s; "
                      f"best measured {p['best_measured']} {p['best_tokens_per_s']:.0f} tok/s")
    if "gap_planned" in res:
        console.print(f"gap (planned) = {res['gap_planned'] * 100:.2f} %, "
                      f"gap (best measured) = {res['gap_best_measured'] * 100:.2f} %")
    if "gap_planned_compute_normalised" in res:
        mc = res["measured_compute"]
        console.print(f"measured layer speed (1/s) {mc['layer_speed_per_s']}: the {{100, 50}} pair has "
                      f"{mc['pair_ratio_100_50_over_75_75'] * 100:.1f} % of the {{75, 75}} pair's compute; "
                      f"gap normalised by it = {res['gap_planned_compute_normalised'] * 100:.2f} %")
    res["meta"] = {"runs": args.runs, "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
                   "device_meta": runs.get("device_meta")}
    Path(args.json_out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json_out).write_text(json.dumps(res, indent=1) + "\n")


if __name__ == "__main__":
    main()
