"""Cost-model fidelity on the user's own host, in one command (issue 32): calibrate (the whole GPU and
the MPS share the plans run under), then 18 plans — the planner's and uniform DP / PP / TP, llama-1.3b
to llama2-13b, MPS shares, compiled, packed — each estimated as ``hexiscale estimate`` would on this
host, then measured (median of 3-5 timed steps after 2 warm-up steps), and the table of predicted
against measured with the errors, mean and worst.

    python -m benchmarks.planner.fidelity                         # 4 GPUs: about 8.5 min on 4x H100
    python -m benchmarks.planner.fidelity --calibration FILE      # reuse a calibration (saves ~2 min)
    python -m benchmarks.planner.fidelity --quick                 # CPU smoke: tiny models, gloo, seconds
    python -m benchmarks.planner.fidelity --part 1/2               # a shorter device call: calibrate + half,
    python -m benchmarks.planner.fidelity --part 2/2 --calibration OUT/hexiscale-home/calibration/KEY.json
    python -m benchmarks.planner.fidelity --merge OUT/fidelity_A.json OUT/fidelity_B.json   # one table

The expected time per phase is printed when the run starts (:mod:`benchmarks.planner.fidelity_budget`
says where each figure comes from): ``hexiscale calibrate --sm-percent 100,50`` ~2.3 min, the
planner's searches ~10 s (at once, one process each), then two launches of one process per GPU (full
SMs; GPUs 2-3 at 50 % under MPS), each training its plans one after the other (each plan's process
group and communicators made and destroyed, its memory peak reset): ~3.5 and ~2.5 min. The MPS rows
are priced from this host's measured share (:mod:`benchmarks.planner.fidelity_calibrate`); a node
that is not is named in a warning. Time cuts: the initial weights drawn on the GPU once per model
(:mod:`benchmarks.fidelity.engine_start`), and a plan's timing stops after 3 steps once their spread
is within 5 % (:mod:`benchmarks.fidelity.steady`; at most ``--steps``). The table is followed by the
device time per phase over all plans (``phases_s``), so a run shows where its minutes went. Each plan
also runs one untimed traced step (``traced_s``: forward, backward, p2p, gradient sync, optimizer,
uncovered time) recorded beside the estimate's same terms (``model_spans_s``), which puts a plan's
error on a term. The plans and why: :mod:`benchmarks.planner.fidelity_plans`; packed rows:
:mod:`benchmarks.planner.fidelity_packed`. The run itself comes from ``benchmarks/fidelity/worker.py``
(one process per GPU, SM share set before its CUDA context); memory is compared per process as in
``benchmarks.fidelity.host4``.

Prints a markdown table and writes ``OUT/fidelity_<device>_<date>.json`` (device, versions, date,
the calibrations used, which calibration priced each node, every row, the summary). ``--quick``
measures nothing worth reading: it checks that the program runs end to end.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.planner.fidelity_calibrate import calibrate, install_calibration, read_calibration, unpriced_here

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "benchmarks" / "results"


def error_row(name: str, sm: list[int], error: str) -> dict[str, Any]:
    return {"plan": name, "sm": sm, "predicted_s": float("nan"), "error": error}


def measure_row(case: Any, entry: dict[str, Any], result: dict[str, Any], cluster: Any, profiles: Any,
                sm: list[int], context_gib: float | None) -> dict[str, Any]:
    """Predicted beside measured for one plan (step time; memory per GPU, per process)."""
    from benchmarks.fidelity.accuracy import device_memory
    from benchmarks.planner.fidelity_packed import predict_packed
    from planner.cost import estimate
    from planner.plan import plan_from_dict

    plan = plan_from_dict(entry["plan"])
    est = estimate(plan, cluster, profiles)
    predicted = predict_packed(plan, cluster, profiles, entry["packed"]) if case.packed else est.step_time_s
    row: dict[str, Any] = {"plan": case.name, "sm": sm, "predicted_s": predicted, "term": est.bottleneck["term"],
                           "breakdown": est.breakdown, "planner": case.planner, "packed": case.packed,
                           "compile": plan.options.compile, "model": plan.model.name}
    if "phases_s" in result:  # where the plan's wall time went on the device (benchmarks.fidelity.phases)
        row["phases_s"] = result["phases_s"]
    if "traced_s" in result:  # one more step span by span, beside the estimate's same terms
        row["traced_s"] = result["traced_s"]
        row["model_spans_s"] = model_spans(est, plan)
    if "error" in result:
        row["error"] = result["error"].strip().splitlines()[-1][:200]
        return row
    row["measured_s"] = result["step_time_s"]
    row["time_err"] = predicted / result["step_time_s"] - 1.0
    row["memory"] = [{"device": r["device"], "measured_gib": device_memory(r, context_gib),
                      "predicted_gib": est.memory_gib[r["device"]],
                      "err": est.memory_gib[r["device"]] / device_memory(r, context_gib) - 1.0}
                     for r in result["ranks"] if r.get("in_use_gib")]
    return row


def model_spans(est: Any, plan: Any) -> dict[str, float]:
    """The estimate in the kinds of a traced step (:mod:`benchmarks.fidelity.traced_step`), for the
    slowest pipeline's bottleneck stage: its micro-batches' forward and backward (TP all-reduces in,
    p2p out; unpacked micro-batches: a packed row's total is ``predicted_s``), the gradient sync and
    the optimizer step, and the whole step."""
    pi = max(range(len(est.pipelines)), key=lambda i: est.pipelines[i].time_s)
    pe = est.pipelines[pi]
    st = pe.stages[pe.bottleneck_stage]
    n = plan.pipelines[pi].micro_batches
    return {"forward": n * st.forward_s, "backward": n * st.backward_s, "p2p": st.pp_comm_s,
            "grad_sync": est.breakdown.get("dp_sync", 0.0), "optimizer": est.breakdown.get("optimizer", 0.0),
            "micro_batches": float(n), "step_s": est.step_time_s}


def summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Mean and worst |step-time error|, the packed rows' worst, memory's most under-predicted."""
    t = [abs(r["time_err"]) for r in rows if "time_err" in r]
    packed = [abs(r["time_err"]) for r in rows if "time_err" in r and r.get("packed")]
    mem = [m["err"] for r in rows for m in r.get("memory", [])]
    return {"plans": len(t), "failed": [r["plan"] for r in rows if "error" in r],
            "time_mean_abs": statistics.mean(t) if t else None, "time_max_abs": max(t) if t else None,
            "packed_max_abs": max(packed) if packed else None, "memory_most_under": min(mem) if mem else None}


def record(quick: bool) -> dict[str, Any]:
    """Device and versions: the planner benchmarks' machine record + torch, CUDA, NCCL, the GPU."""
    import torch

    from benchmarks.planner.common import machine

    cuda = torch.cuda.is_available() and not quick
    return {**machine(), "torch": torch.__version__, "cuda": torch.version.cuda,
            "nccl": ".".join(map(str, torch.cuda.nccl.version())) if cuda else None,
            "gpu": torch.cuda.get_device_name(0) if cuda else "cpu",
            "gpus": torch.cuda.device_count() if cuda else 0}


def run(args: argparse.Namespace) -> Path:
    out = Path(args.out)
    home = out / "hexiscale-home"
    if args.calibration and Path(args.calibration).resolve().is_relative_to(home.resolve()):
        # the first part's calibration, reused by a later part with the same --out: kept aside before
        # this run's home is made afresh
        kept = Path(tempfile.mkdtemp(prefix="fidelity-cal-"))
        shutil.copytree(home, kept / "home")
        args.calibration = str(kept / "home" / Path(args.calibration).resolve().relative_to(home.resolve()))
    if home.exists():
        shutil.rmtree(home)
    os.environ["HEXISCALE_HOME"] = str(home)  # before the planner reads its catalog
    t_start = time.perf_counter()
    from benchmarks.planner.fidelity_budget import budget
    from benchmarks.planner.fidelity_plans import launches

    wanted = [c.name for launch in launches(args.quick) for c in launch.cases if not args.plans or c.name in args.plans]
    mps = not args.quick and shutil.which("nvidia-cuda-mps-control") is not None
    # the MPS shares the plans run under, calibrated here too (fidelity_calibrate's docstring)
    shares = sorted({s for launch in launches(args.quick) if any(c.name in wanted for c in launch.cases)
                     for s in launch.sm if s < 100}) if mps else []
    expected = budget(launches(args.quick), wanted, shares=shares, calibrating=not args.calibration)
    if not args.quick:  # the GPU run's budget (a CPU smoke takes seconds whatever it says)
        print(expected.line(), flush=True)
    if args.calibration:
        install_calibration(Path(args.calibration), home)
        cal_run: dict[str, Any] = {"wall_s": 0.0, "reused": args.calibration}
    else:
        cal_run = calibrate(home, args.quick, args.force_calibration, shares)
    cal = read_calibration(home)
    key = cal["applies_to"][0]
    context = (cal.get("fits", {}).get("framework_gib") or {}).get("measured_context_gib")
    latency = (cal.get("fits", {}).get("link") or {}).get("latency_us") or 10.0

    from benchmarks.fidelity.host4 import cluster_for, leaks
    from benchmarks.fidelity.worker import run_launch
    from benchmarks.planner.fidelity_packed import packed_micro_batches
    from benchmarks.planner.fidelity_search import search_all
    from planner.calibration.local import resolve_profiles
    from planner.plan import plan_from_dict, plan_to_dict

    meta: dict[str, Any] = {**record(args.quick), "quick": args.quick, "calibration": cal_run,
                            "calibration_file": cal["file"], "share_calibrations": cal["shares"],
                            "measured_key": key, "calibration_provenance": cal.get("provenance"),
                            "warmup": args.warmup, "steps": args.steps, "min_steps": args.min_steps, "plans": wanted,
                            "expected": dict(expected.phases)}
    rows: list[dict[str, Any]] = []
    runs: list[dict[str, Any]] = []
    if mps:
        subprocess.run(["nvidia-cuda-mps-control", "-d"], check=False)
    t_plan = time.perf_counter()  # the planner's searches: device idle, inside the 10 minutes too
    searched = search_all(wanted, key, latency, args.quick)
    meta["planning_s"] = time.perf_counter() - t_plan
    print(f"planner: {len(searched)} searches in {meta['planning_s']:.0f} s", flush=True)
    try:
        for launch in launches(args.quick):
            sm = list(launch.sm)
            cluster = cluster_for(launch.sm, key, args.quick, latency)
            resolved = resolve_profiles(cluster)
            resolved.say(sys.stdout)
            elsewhere = [] if args.quick else unpriced_here(resolved.priced_by)
            if elsewhere:  # e.g. no MPS daemon here: a share priced from a shipped profile of another host
                print(f"warning: launch {launch.name}: not priced by this host's calibration: {', '.join(elsewhere)}",
                      flush=True)
            entries, cases = [], []
            t_plan = time.perf_counter()
            for case in (c for c in launch.cases if c.name in wanted):
                found = searched.get(case.name, {})
                if "error" in found:
                    rows.append(error_row(case.name, sm, found["error"]))
                    continue
                entry: dict[str, Any] = {"name": case.name,
                                         "plan": found["plan"] if case.plan is None else plan_to_dict(case.plan)}
                plan = plan_from_dict(entry["plan"])
                if case.packed:
                    entry["packed"] = packed_micro_batches(plan)
                entries.append(entry)
                cases.append(case)
            if not entries:
                continue
            t0 = time.perf_counter()
            res = run_launch(entries, [100] * len(sm) if args.quick else sm, cpu=args.quick, warmup=args.warmup,
                             steps=args.steps, min_steps=args.min_steps, trace=not args.no_trace)
            res.update(name=launch.name, seconds=time.perf_counter() - t0, planning_s=t0 - t_plan,
                       priced_by=resolved.priced_by)
            runs.append(res)
            print(f"launch {launch.name}: {len(entries)} plans in {res['seconds']:.0f} s (planned in "
                  f"{res['planning_s']:.0f} s)", flush=True)
            for leak in leaks(res):
                print(leak, flush=True)
            for case, entry, result in zip(cases, entries, res["plans"]):
                rows.append(measure_row(case, entry, result, cluster, resolved.profiles, sm, context))
            write_result(out, meta, rows, runs, t_start, final=False)  # a run cut short keeps what it measured
    finally:
        if mps:
            subprocess.run(["bash", "-c", "echo quit | nvidia-cuda-mps-control"], check=False, timeout=60)
    path = write_result(out, meta, rows, runs, t_start, final=True)
    report(rows, meta, path)
    return path


def report(rows: list[dict[str, Any]], meta: dict[str, Any], path: Path) -> None:
    """The table, the packed rows' worst error, the total time and where the devices' time went."""
    from benchmarks.fidelity.host4 import table
    from benchmarks.fidelity.traced_step import spans_table

    stats = summary(rows)
    print(table(rows), flush=True)
    print(f"packed rows: worst |error| {_pct(stats['packed_max_abs'])}; total {meta['wall_s']:.0f} s", flush=True)
    spans = spans_table(rows)
    if spans:  # one traced step per plan beside the estimate: which term a plan's error sits in
        print(spans, flush=True)
    spent = phase_totals(rows)
    if spent:
        print("device time by phase, all plans: " + ", ".join(f"{k} {v:.0f} s" for k, v in spent.items()), flush=True)
    print(f"wrote {path}", flush=True)


def phase_totals(rows: list[dict[str, Any]]) -> dict[str, float]:
    """Seconds per phase (:mod:`benchmarks.fidelity.phases`) summed over the rows, largest first."""
    out: dict[str, float] = {}
    for r in rows:
        for k, v in r.get("phases_s", {}).items():
            out[k] = out.get(k, 0.0) + float(v)
    return dict(sorted(out.items(), key=lambda kv: -kv[1]))


def merge(paths: list[Path], out: Path) -> Path:
    """``--merge``: the parts' result files as one (:func:`benchmarks.planner.fidelity_split.merge_results`),
    written beside them as ``fidelity_<device>_<first part's date>_merged.json``, and its table."""
    from benchmarks.planner.fidelity_split import merge_results

    try:
        data = merge_results(paths)
    except ValueError as exc:
        raise SystemExit(str(exc)) from None
    data["summary"] = summary(data["rows"])
    meta = data["meta"]
    device = "cpu" if meta.get("quick") else f"{gpu_label(str(meta.get('gpu')))}x{meta.get('gpus')}"
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"fidelity_{device}_{meta.get('started', 'merged')}_merged.json"
    path.write_text(json.dumps(data, indent=1, default=float) + "\n")
    report(data["rows"], meta, path)
    return path


def write_result(out: Path, meta: dict[str, Any], rows: list[dict[str, Any]], runs: list[dict[str, Any]],
                 t_start: float, *, final: bool) -> Path:
    """The JSON of the rows so far (one file per run, rewritten after every launch; ``partial``
    until the last)."""
    meta["wall_s"] = time.perf_counter() - t_start
    meta.setdefault("started", _dt.datetime.now(_dt.timezone.utc).strftime("%Y%m%dT%H%M%SZ"))
    meta["date"] = _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")
    out.mkdir(parents=True, exist_ok=True)
    device = "cpu" if meta["quick"] else f"{gpu_label(str(meta['gpu']))}x{meta['gpus']}"
    path = out / f"fidelity_{device}_{meta['started']}.json"
    path.write_text(json.dumps({"benchmark": "planner.fidelity", "partial": not final, "meta": meta,
                                "summary": summary(rows), "rows": rows, "runs": runs}, indent=1, default=float) + "\n")
    return path


def gpu_label(name: str) -> str:
    """``NVIDIA H100 80GB HBM3`` -> ``h100``: the first word with a digit after the vendor."""
    words = [w.lower() for w in name.replace("-", " ").split() if w.lower() not in ("nvidia", "tesla", "geforce")]
    return next((w for w in words if any(c.isdigit() for c in w)), "gpu")


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{x * 100:.1f} %"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0], epilog="Expected time: about 8.5 minutes "
                                 "on 4x H100 (calibration of the whole GPU and its 50 %% MPS share ~2.3 min, 18 plans "
                                 "~6 min; printed per phase when it starts); --quick: a few minutes on CPU, its test "
                                 "runs two plans.")
    ap.add_argument("--out", default=str(RESULTS), help="folder for the JSON (default benchmarks/results)")
    ap.add_argument("--calibration", help="a calibration file written by 'hexiscale calibrate' "
                    "(HOME/calibration/<key>.json; its HOME/devices entry comes with it): skip calibrating")
    ap.add_argument("--force-calibration", action="store_true", help="install the calibration even where its "
                    "held-out error is above calibrate's gate (the table then shows what that fit predicts)")
    ap.add_argument("--quick", action="store_true", help="CPU smoke test: tiny models on gloo ranks")
    ap.add_argument("--warmup", type=int, help="untimed steps per plan (default 2; --quick: 1)")
    ap.add_argument("--steps", type=int, help="timed steps per plan at most, median taken (default 5: steps 3-7; "
                    "--quick: 1)")
    ap.add_argument("--min-steps", type=int, help="stop timing a plan after this many steps once its last 3 agree "
                    "within 5 %% (default 3; --quick: 1; = --steps: always --steps)")
    ap.add_argument("--no-trace", action="store_true", help="skip the one traced step per plan (forward, backward, "
                    "grad sync, optimizer and uncovered time beside the estimate's, in traced_s / model_spans_s)")
    ap.add_argument("--plans", default="", help="comma list of plan names to run (default: all)")
    ap.add_argument("--part", help="K/N: run the K-th of N parts of the plans, balanced by expected time (run the "
                    "others with --calibration of the first part's HOME/calibration file, then --merge)")
    ap.add_argument("--merge", nargs="+", metavar="JSON", help="merge the result files of the parts into one "
                    "(written to --out) and print its table; runs nothing")
    args = ap.parse_args(argv)
    if args.merge:
        merge([Path(p) for p in args.merge], Path(args.out))
        return 0
    args.warmup = (1 if args.quick else 2) if args.warmup is None else args.warmup
    args.steps = (1 if args.quick else 5) if args.steps is None else args.steps
    args.min_steps = (1 if args.quick else min(3, args.steps)) if args.min_steps is None else args.min_steps
    if args.warmup < 0 or args.steps < 1 or not 1 <= args.min_steps <= args.steps:
        ap.error(f"--warmup must be >= 0, --steps >= 1 and --min-steps in 1..--steps, got {args.warmup}, "
                 f"{args.steps} and {args.min_steps}")
    from benchmarks.planner.fidelity_plans import launches
    from benchmarks.planner.fidelity_split import parse_part, part_names

    names = [c.name for launch in launches(args.quick) for c in launch.cases]
    args.plans = [x for x in args.plans.split(",") if x]
    unknown = [x for x in args.plans if x not in names]
    if unknown:
        ap.error(f"--plans: no plan named {unknown[0]}; choose from {', '.join(names)}")
    if args.part:
        try:
            k, n = parse_part(args.part)
        except ValueError as exc:
            ap.error(str(exc))
        mine = part_names(launches(args.quick), k, n)
        args.plans = [x for x in mine if not args.plans or x in args.plans]
        if not args.plans:
            ap.error(f"--part {args.part}: no plan of --plans falls in this part")
        print(f"part {k}/{n}: {', '.join(args.plans)}", flush=True)
    run(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
