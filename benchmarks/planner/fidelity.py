"""Cost-model fidelity on the user's own host, in one command (issue 32): calibrate, then 18 plans —
the planner's and uniform DP / PP / TP, llama-1.3b to llama2-13b, MPS shares, compiled, packed — each
estimated as ``hexiscale estimate`` would on this host, then measured (median of steps 3-8), and the
table of predicted against measured with the errors, mean and worst.

    python -m benchmarks.planner.fidelity                         # 4 GPUs: about 9 min on 4x H100
    python -m benchmarks.planner.fidelity --calibration FILE      # reuse a calibration (saves 1-1.5 min)
    python -m benchmarks.planner.fidelity --quick                 # CPU smoke: tiny models, gloo, seconds

Expected time on 4x H100: ``hexiscale calibrate`` 1-1.5 min (with its compiled layer), the planner's 4
searches <= 40 s, 11 plans at full SMs ~4.5 min (the compiled one ~1 min: its warm-up compiles), 7 under
MPS ~3 min (13B plans ~40 s each; the rest ~20 s). Over 10 min: split with ``--plans``. The plans and why:
:mod:`benchmarks.planner.fidelity_plans`; packed rows: :mod:`benchmarks.planner.fidelity_packed`.
The run itself comes from ``benchmarks/fidelity/worker.py`` (one process per GPU, SM share set before
its CUDA context); memory is compared per process as in ``benchmarks.fidelity.host4``.

Prints a markdown table and writes ``OUT/fidelity_<device>_<date>.json`` (device, versions, date,
the calibration used, every row, the summary). ``--quick`` measures nothing worth reading: it
checks that the program runs end to end.
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
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "benchmarks" / "results"


def install_calibration(path: Path, home: Path) -> None:
    """Copy a calibration written by ``hexiscale calibrate`` (``HOME/calibration/<key>.json``) into
    ``home``, with its measured device entry (``HOME/devices/<key>.json``) when that exists."""
    try:
        data = json.loads(path.read_text())
        key = str(data["applies_to"][0])
    except (OSError, ValueError, KeyError, IndexError, TypeError) as exc:
        raise SystemExit(f"--calibration: {path} is not a calibration written by 'hexiscale calibrate' ({exc}); "
                         "pass HOME/calibration/<key>.json") from None
    (home / "calibration").mkdir(parents=True, exist_ok=True)
    shutil.copyfile(path, home / "calibration" / path.name)
    entry = path.parent.parent / "devices" / f"{key}.json"
    if entry.is_file():
        (home / "devices").mkdir(parents=True, exist_ok=True)
        shutil.copyfile(entry, home / "devices" / entry.name)


def calibrate(home: Path, quick: bool, force: bool = False) -> dict[str, Any]:
    """``hexiscale calibrate`` into ``home`` (``--quick``: the CPU rehearsal, forced past its gate)."""
    cmd = [sys.executable, "-m", "hexiscale", "calibrate", "--quiet", "--home", str(home)]
    cmd += ["--cpu", "--force", "--comm-ranks", "0"] if quick else ["--model", "llama-1.3b", "--seq-len", "2048"]
    if force and not quick:
        cmd.append("--force")
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, cwd=ROOT, env={**os.environ, "HEXISCALE_HOME": str(home)}, capture_output=True,
                          text=True, timeout=900)
    print(proc.stdout + proc.stderr, flush=True)
    if proc.returncode != 0:
        raise SystemExit(f"calibrate failed ({proc.returncode})")
    return {"wall_s": time.perf_counter() - t0}


def read_calibration(home: Path) -> dict[str, Any]:
    files = sorted((home / "calibration").glob("*.json"))
    if not files:
        raise SystemExit(f"no calibration under {home}/calibration")
    return {"file": str(files[0]), **json.loads(files[0].read_text())}


def planner_plan(case: Any, cluster: Any, profiles: Any, quick: bool) -> Any:
    from planner.search import PlannerConfig, make_plan

    return make_plan(cluster, case.model, case.global_batch, profiles=profiles,
                     config=PlannerConfig(time_limit_s=1.0 if quick else 10.0))


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
    if home.exists():
        shutil.rmtree(home)
    os.environ["HEXISCALE_HOME"] = str(home)  # before the planner reads its catalog
    t_start = time.perf_counter()
    if args.calibration:
        install_calibration(Path(args.calibration), home)
        cal_run: dict[str, Any] = {"wall_s": 0.0, "reused": args.calibration}
    else:
        cal_run = calibrate(home, args.quick, args.force_calibration)
    cal = read_calibration(home)
    key = cal["applies_to"][0]
    context = (cal.get("fits", {}).get("framework_gib") or {}).get("measured_context_gib")
    latency = (cal.get("fits", {}).get("link") or {}).get("latency_us") or 10.0

    from benchmarks.fidelity.host4 import cluster_for, leaks, table
    from benchmarks.fidelity.worker import run_launch
    from benchmarks.planner.fidelity_packed import packed_micro_batches
    from benchmarks.planner.fidelity_plans import launches
    from planner.calibration.local import resolve_profiles
    from planner.plan import plan_to_dict

    meta: dict[str, Any] = {**record(args.quick), "quick": args.quick, "calibration": cal_run,
                            "calibration_file": cal["file"], "measured_key": key,
                            "calibration_provenance": cal.get("provenance"), "warmup": args.warmup,
                            "steps": args.steps}
    rows: list[dict[str, Any]] = []
    runs: list[dict[str, Any]] = []
    mps = not args.quick and shutil.which("nvidia-cuda-mps-control") is not None
    if mps:
        subprocess.run(["nvidia-cuda-mps-control", "-d"], check=False)
    try:
        for launch in launches(args.quick):
            sm = list(launch.sm)
            cluster = cluster_for(launch.sm, key, args.quick, latency)
            resolved = resolve_profiles(cluster)
            print(resolved.line, flush=True)
            entries, cases = [], []
            t_plan = time.perf_counter()  # the planner's searches: device idle, inside the 10 minutes too
            for case in (c for c in launch.cases if not args.plans or c.name in args.plans):
                try:
                    plan = case.plan or planner_plan(case, cluster, resolved.profiles, args.quick)
                except Exception as exc:  # noqa: BLE001 - a plan the planner cannot make is a row, not the end
                    rows.append(error_row(case.name, sm, f"planner: {exc}"))
                    continue
                entry: dict[str, Any] = {"name": case.name, "plan": plan_to_dict(plan)}
                if case.packed:
                    entry["packed"] = packed_micro_batches(plan)
                entries.append(entry)
                cases.append(case)
            if not entries:
                continue
            t0 = time.perf_counter()
            res = run_launch(entries, [100] * len(sm) if args.quick else sm, cpu=args.quick, warmup=args.warmup,
                             steps=args.steps)
            res.update(name=launch.name, seconds=time.perf_counter() - t0, planning_s=t0 - t_plan)
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
    stats = summary(rows)
    print(table(rows), flush=True)
    print(f"packed rows: worst |error| {_pct(stats['packed_max_abs'])}; total {meta['wall_s']:.0f} s", flush=True)
    print(f"wrote {path}", flush=True)
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
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0], epilog="Expected time: about 9 minutes "
                                 "on 4x H100 (calibration 1-1.5 min, 18 plans ~7.5 min); --quick: a few minutes on "
                                 "CPU, its test runs two plans.")
    ap.add_argument("--out", default=str(RESULTS), help="folder for the JSON (default benchmarks/results)")
    ap.add_argument("--calibration", help="a calibration file written by 'hexiscale calibrate' "
                    "(HOME/calibration/<key>.json; its HOME/devices entry comes with it): skip calibrating")
    ap.add_argument("--force-calibration", action="store_true", help="install the calibration even where its "
                    "held-out error is above calibrate's gate (the table then shows what that fit predicts)")
    ap.add_argument("--quick", action="store_true", help="CPU smoke test: tiny models on gloo ranks")
    ap.add_argument("--warmup", type=int, help="untimed steps per plan (default 2; --quick: 1)")
    ap.add_argument("--steps", type=int, help="timed steps per plan, median taken (default 6: steps 3-8; --quick: 1)")
    ap.add_argument("--plans", default="", help="comma list of plan names to run (default: all)")
    args = ap.parse_args(argv)
    args.warmup = (1 if args.quick else 2) if args.warmup is None else args.warmup
    args.steps = (1 if args.quick else 6) if args.steps is None else args.steps
    if args.warmup < 0 or args.steps < 1:
        ap.error(f"--warmup must be >= 0 and --steps >= 1, got {args.warmup} and {args.steps}")
    from benchmarks.planner.fidelity_plans import launches

    names = [c.name for launch in launches(args.quick) for c in launch.cases]
    args.plans = [x for x in args.plans.split(",") if x]
    unknown = [x for x in args.plans if x not in names]
    if unknown:
        ap.error(f"--plans: no plan named {unknown[0]}; choose from {', '.join(names)}")
    run(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
