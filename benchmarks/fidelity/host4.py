"""Cost-model fidelity on a fresh 4-GPU host after ``hexiscale calibrate`` (issue 19): held-out plans
of llama-1.3b and llama2-7b (seq 2048) — DP, PP, TP, PP with different TP per stage, asymmetric
pipelines, MPS-throttled GPUs — measured (step time, device memory) beside the estimate that
``plan``/``estimate`` would make by default on this host (its calibration found under
``HEXISCALE_HOME``). None of the plans was used to fit anything: calibration measures single layers.

    python -m benchmarks.fidelity.host4 --out DIR            # GPU machine, 4 GPUs (21 plans: over 10 min)
    ... --launches sm100x4            then   --launches sm100-100-50-50    # the same in two calls
    python -m benchmarks.fidelity.host4 --out DIR --cpu      # CPU rehearsal: tiny model, gloo
    python -m benchmarks.fidelity.host4 --out DIR --gpus 2   # a 2-GPU host: 11 plans (launches2)
    ... --alloc-conf ''                                       # torch's allocator default, not the executor's

Memory is compared per process (``benchmarks.fidelity.accuracy.device_memory``: the allocator's
peak reserve + the plan's NCCL communicators + the CUDA context measured alone by ``calibrate``),
not as the device's memory in use, which under MPS counts the other clients.

Prints a markdown table (plan, SM shares, measured, predicted, error, memory, the term that
dominates) and writes ``DIR/host4_fidelity.json`` (device, versions, date, every row).
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import statistics
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
N = 4
DEVS = tuple(f"g{k}:0" for k in range(N))


def models(cpu: bool):  # type: ignore[no-untyped-def]
    from planner.model import PRESETS

    if cpu:
        return PRESETS["tiny-8l"], replace(PRESETS["tiny-8l"], name="tiny-8l-b")
    return replace(PRESETS["llama-1.3b"], seq_len=2048), replace(PRESETS["llama2-7b"], seq_len=2048)


def _plan(model, pipes, **options):  # type: ignore[no-untyped-def]
    """``pipes``: [(batch, micro_batches, schedule, [(devices, layers), ...])]."""
    from planner.plan import Pipeline, Plan, PlanOptions, Stage

    out = []
    for bs, mb, sched, stages in pipes:
        st, lo = [], 0
        for devs, n in stages:
            st.append(Stage(tuple(devs), len(devs), (lo, lo + n)))
            lo += n
        assert lo == model.num_layers, (model.name, lo)
        out.append(Pipeline(bs, mb, tuple(st), sched))
    return Plan(model, sum(p[0] for p in pipes), tuple(out), PlanOptions(**options))


def launches(cpu: bool, gpus: int = N) -> list[tuple[str, tuple[int, ...], list[tuple[str, Any]]]]:
    """(name, SM share per GPU, [(plan name, plan)]): >= 16 plans, none used for fitting; with
    ``gpus=2`` the 2-GPU set (:func:`launches2`)."""
    if gpus == 2:
        return launches2(cpu)
    if gpus != N:
        raise ValueError(f"--gpus: {gpus} GPUs have no plan set; use 4 (the issue's) or 2")
    small, big = models(cpu)
    g0, g1, g2, g3 = DEVS
    n, m = small.num_layers, big.num_layers
    q, h = n // 4, n // 2
    d, e = max(1, q // 3), max(1, m // 12)  # layers moved from the slow GPUs to the fast ones
    full = [
        ("1.3b-1gpu-m4", _plan(small, [(8, 4, "1f1b", [([g0], n)])])),
        ("1.3b-dp4", _plan(small, [(4, 2, "1f1b", [([g], n)]) for g in DEVS])),
        ("1.3b-dp4-zero1", _plan(small, [(4, 2, "1f1b", [([g], n)]) for g in DEVS], zero=1)),
        ("1.3b-pp4-1f1b-m16", _plan(small, [(16, 16, "1f1b", [([g], q) for g in DEVS])])),
        ("1.3b-pp4-gpipe-m8", _plan(small, [(16, 8, "gpipe", [([g], q) for g in DEVS])])),
        ("1.3b-tp2xdp2", _plan(small, [(8, 4, "1f1b", [([g0, g1], n)]), (8, 4, "1f1b", [([g2, g3], n)])])),
        ("1.3b-tp4-m4", _plan(small, [(16, 4, "1f1b", [([g0, g1, g2, g3], n)])])),
        ("1.3b-tp1-2|single", _plan(small, [(10, 10, "1f1b", [([g0], h - 2), ([g1, g2], h + 2)]),
                                            (6, 3, "1f1b", [([g3], n)])])),
        ("1.3b-tp2-1-1", _plan(small, [(16, 16, "1f1b", [([g0, g1], h), ([g2], q), ([g3], q)])])),
        ("1.3b-tp2|pp2-uneven", _plan(small, [(10, 5, "1f1b", [([g0, g1], n)]),
                                              (6, 6, "1f1b", [([g2], h + 2), ([g3], h - 2)])])),
        ("1.3b-pp2xdp2-selective", _plan(small, [(8, 8, "1f1b", [([g0], h), ([g1], h)]),
                                                 (8, 8, "1f1b", [([g2], h), ([g3], h)])], recompute="selective")),
        ("7b-pp4-m8", _plan(big, [(8, 8, "1f1b", [([g], m // 4) for g in DEVS])])),
        ("7b-tp2xpp2-m8", _plan(big, [(8, 8, "1f1b", [([g0, g1], m // 2), ([g2, g3], m // 2)])])),
        ("7b-pp2xdp2-zero1", _plan(big, [(4, 4, "1f1b", [([g0], m // 2), ([g1], m // 2)]),
                                         (4, 4, "1f1b", [([g2], m // 2), ([g3], m // 2)])], zero=1)),
        # since session 7: full recompute's transient (the autocast cache of a stage's weight copies)
        # and a GPipe stage at micro-batch 1 (the allocator's reserve without expandable segments)
        ("7b-pp4-full-m8", _plan(big, [(8, 8, "1f1b", [([g], m // 4) for g in DEVS])], recompute="full")),
        ("1.3b-pp4-gpipe-m16", _plan(small, [(16, 16, "gpipe", [([g], q) for g in DEVS])])),
    ]
    mixed = [  # GPUs 2 and 3 at 50 % of the SMs
        ("mps-1.3b-dp4-12-12-4-4", _plan(small, [(12, 3, "1f1b", [([g0], n)]), (12, 3, "1f1b", [([g1], n)]),
                                                  (4, 1, "1f1b", [([g2], n)]), (4, 1, "1f1b", [([g3], n)])])),
        ("mps-1.3b-pp4-fast-first", _plan(small, [(16, 16, "1f1b", [([g0], q + d), ([g1], q + d), ([g2], q - d),
                                                                     ([g3], q - d)])])),
        ("mps-1.3b-tp2-fast|tp2-slow", _plan(small, [(20, 5, "1f1b", [([g0, g1], n)]),
                                                     (12, 3, "1f1b", [([g2, g3], n)])])),
        ("mps-1.3b-tp1-1-2", _plan(small, [(16, 16, "1f1b", [([g0], q + d), ([g1], q + d), ([g2, g3], h - 2 * d)])])),
        ("mps-7b-pp4-fast-first", _plan(big, [(8, 8, "1f1b", [([g0], m // 4 + e), ([g1], m // 4 + e),
                                                              ([g2], m // 4 - e), ([g3], m // 4 - e)])])),
    ]
    return [("sm100x4", (100,) * N, full), ("sm100-100-50-50", (100, 100, 50, 50), mixed)]


def launches2(cpu: bool) -> list[tuple[str, tuple[int, ...], list[tuple[str, Any]]]]:
    """The plans that fit 2 GPUs, for hosts lent with 2 (not the issue's >= 16-plan 4-GPU set):
    DP, ZeRO-1, PP under 1F1B and GPipe, TP 2, uneven PP, selective recompute, the 7B over two
    stages (full recompute: without it a stage needs 80.5 GiB, over an H100's 80), and an MPS 100/50
    pair."""
    small, big = models(cpu)
    g0, g1 = DEVS[:2]
    n, m = small.num_layers, big.num_layers
    h, d = n // 2, max(1, n // 12)
    full = [
        ("1.3b-1gpu-m4", _plan(small, [(8, 4, "1f1b", [([g0], n)])])),
        ("1.3b-dp2", _plan(small, [(4, 2, "1f1b", [([g], n)]) for g in (g0, g1)])),
        ("1.3b-dp2-zero1", _plan(small, [(4, 2, "1f1b", [([g], n)]) for g in (g0, g1)], zero=1)),
        ("1.3b-pp2-1f1b-m8", _plan(small, [(8, 8, "1f1b", [([g0], h), ([g1], h)])])),
        ("1.3b-pp2-gpipe-m8", _plan(small, [(8, 8, "gpipe", [([g0], h), ([g1], h)])])),
        ("1.3b-tp2-m4", _plan(small, [(8, 4, "1f1b", [([g0, g1], n)])])),
        ("1.3b-pp2-uneven", _plan(small, [(8, 8, "1f1b", [([g0], h + d), ([g1], h - d)])])),
        ("1.3b-pp2-selective", _plan(small, [(8, 8, "1f1b", [([g0], h), ([g1], h)])], recompute="selective")),
        ("7b-pp2-full", _plan(big, [(8, 8, "1f1b", [([g0], m // 2), ([g1], m // 2)])], recompute="full")),
    ]
    mixed = [  # GPU 1 at 50 % of the SMs
        ("mps-1.3b-dp2-12-4", _plan(small, [(12, 3, "1f1b", [([g0], n)]), (4, 1, "1f1b", [([g1], n)])])),
        ("mps-1.3b-pp2-fast-first", _plan(small, [(16, 16, "1f1b", [([g0], h + d), ([g1], h - d)])])),
    ]
    return [("sm100x2", (100, 100), full), ("sm100-50", (100, 50), mixed)]


def cluster_for(sm: tuple[int, ...], measured_key: str, cpu: bool, latency_us: float = 10.0):  # type: ignore[no-untyped-def]
    """Four one-GPU nodes g0..g3 on the host's NVLink; each node's type by its SM share."""
    from planner.cluster import parse_cluster

    prefix = measured_key.removesuffix("-measured")
    link = {"kind": "nvlink", "bandwidth_GBps": 450.0, "latency_us": latency_us}

    def key(s: int) -> str:
        return measured_key if cpu or s >= 100 else f"{prefix}-mps{s}"

    return parse_cluster({"name": "host4", "inter_node": link,
                          "nodes": [{"name": f"g{k}", "gpu": key(s), "gpus": 1, "intra_link": link}
                                    for k, s in enumerate(sm)]})


def calibrate(home: Path, cpu: bool, model_name: str) -> dict[str, Any]:
    env = {**os.environ, "HEXISCALE_HOME": str(home)}
    cmd = [sys.executable, "-m", "hexiscale", "calibrate", "--quiet", "--home", str(home)]
    cmd += ["--cpu"] if cpu else ["--model", model_name, "--seq-len", "2048"]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    wall = time.perf_counter() - t0
    print(proc.stdout + proc.stderr, flush=True)
    if proc.returncode != 0:
        raise SystemExit(f"calibrate failed ({proc.returncode})")
    cal_file = next((home / "calibration").glob("*.json"))
    return {"wall_s": wall, "file": str(cal_file), **json.loads(cal_file.read_text())}


def predict_rows(runs: list[dict[str, Any]], measured_key: str, cpu: bool, latency_us: float,
                 context_gib: float | None = None) -> list[dict[str, Any]]:
    """Estimate beside measurement per plan; memory per process (``device_memory``) with the CUDA
    context ``hexiscale calibrate`` measured alone on its GPU (``context_gib``), as the estimate's
    ``framework_gib`` is."""
    from benchmarks.fidelity.accuracy import device_memory
    from planner.calibration.local import resolve_profiles
    from planner.cost import estimate
    from planner.plan import plan_from_dict

    rows = []
    for launch in runs:
        for p in launch["plans"]:
            cluster = cluster_for(tuple(launch["sm"]), measured_key, cpu, latency_us)
            resolved = resolve_profiles(cluster)
            est = estimate(plan_from_dict(p["plan"]), cluster, resolved.profiles)
            row: dict[str, Any] = {"plan": p["name"], "sm": launch["sm"], "predicted_s": est.step_time_s,
                                   "breakdown": est.breakdown, "term": est.bottleneck["term"],
                                   "profiles": resolved.line}
            if "error" in p:
                row["error"] = p["error"].strip().splitlines()[-1][:200]
            else:
                row["measured_s"] = p["step_time_s"]
                row["time_err"] = est.step_time_s / p["step_time_s"] - 1.0
                row["memory"] = [{"device": r["device"], "measured_gib": device_memory(r, context_gib),
                                  "predicted_gib": est.memory_gib[r["device"]],
                                  "err": est.memory_gib[r["device"]] / device_memory(r, context_gib) - 1.0}
                                 for r in p["ranks"] if r.get("in_use_gib")]
            rows.append(row)
    return rows


def leaks(launch: dict[str, Any], limit_gib: float = 0.1) -> list[str]:
    """One warning line per plan and GPU that left memory allocated after its engine was dropped:
    every later plan of that process would read it as its own."""
    return [f"warning: {p['name']} left {r['left_allocated_gib']:.2f} GiB allocated on {r['device']} after release"
            for p in launch["plans"] for r in p["ranks"] if r.get("left_allocated_gib", 0.0) > limit_gib]


def table(rows: list[dict[str, Any]]) -> str:
    out = ["| plan | SM % | measured ms | predicted ms | error | memory error (worst device) | dominant term |",
           "|---|---|---:|---:|---:|---:|---|"]
    for r in rows:
        sm = "/".join(map(str, r["sm"]))
        if "error" in r:
            out.append(f"| {r['plan']} | {sm} | failed: {r['error'][:60]} | {r['predicted_s'] * 1e3:.1f} | | | |")
            continue
        worst = max(r["memory"], key=lambda x: abs(x["err"]), default=None)
        mem = f"{worst['err'] * 100:+.1f} % ({worst['device']})" if worst else "-"
        out.append(f"| {r['plan']} | {sm} | {r['measured_s'] * 1e3:.1f} | {r['predicted_s'] * 1e3:.1f} | "
                   f"{r['time_err'] * 100:+.1f} % | {mem} | {r['term']} |")
    t = [abs(r["time_err"]) for r in rows if "time_err" in r]
    mm = [x["err"] for r in rows for x in r.get("memory", [])]
    if t:
        out.append("")
        line = (f"step time over {len(t)} plans: mean |error| {statistics.mean(t) * 100:.1f} %, median "
                f"{statistics.median(t) * 100:.1f} %, worst {max(t) * 100:.1f} %")
        if mm:
            line += (f"; memory over {len(mm)} GPU figures: mean |error| "
                     f"{statistics.mean(abs(x) for x in mm) * 100:.1f} %, most under {min(mm) * 100:+.1f} %")
        out.append(line)
    return "\n".join(out)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--cpu", action="store_true")
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--gpus", type=int, default=N, help="4 (the issue's plan set) or 2 (a smaller set for 2-GPU hosts)")
    ap.add_argument("--launches", default="", help="comma list of launch names to run (default: all), "
                    "to split a run over calls, e.g. sm100x4 then sm100-100-50-50")
    ap.add_argument("--only", type=int, default=0, help="run only the first N plans of each launch (smoke)")
    ap.add_argument("--alloc-conf", default=None,
                    help="PYTORCH_CUDA_ALLOC_CONF for calibration and every worker; default: the executor's "
                         "(expandable_segments:True, executor/model/allocator.py); '' for torch's own default")
    args = ap.parse_args()
    try:
        todo = launches(args.cpu, args.gpus)
    except ValueError as e:
        ap.error(str(e))
    wanted = [x for x in args.launches.split(",") if x]
    unknown = sorted(set(wanted) - {name for name, _, _ in todo})
    if unknown:
        ap.error(f"--launches: no launch named {', '.join(unknown)}; choose from "
                 f"{', '.join(name for name, _, _ in todo)}")
    todo = [x for x in todo if not wanted or x[0] in wanted]
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    home = out / "hexiscale-home"
    os.environ["HEXISCALE_HOME"] = str(home)  # before planner reads its catalog
    if args.alloc_conf is not None:  # inherited by the calibration and the workers, read at their CUDA start
        os.environ["PYTORCH_CUDA_ALLOC_CONF"] = args.alloc_conf
    from executor.model import allocator
    allocator.use_default()  # what the executor's processes run with (recorded in the JSON's meta)
    cal = calibrate(home, args.cpu, "llama-1.3b")
    measured_key = cal["applies_to"][0]
    from benchmarks.fidelity.host_home import read_home
    from benchmarks.fidelity.worker import run_launch
    from planner.plan import plan_to_dict

    if not args.cpu:
        subprocess.run(["nvidia-cuda-mps-control", "-d"], check=False)
    import torch

    latency = (cal.get("fits", {}).get("link") or {}).get("latency_us") or 10.0
    context = (cal.get("fits", {}).get("framework_gib") or {}).get("measured_context_gib")
    meta = {"gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu",
            "torch": torch.__version__, "calibration_wall_s": cal["wall_s"], "calibration": cal["provenance"],
            "fitted": cal.get("fitted"), "fits": cal.get("fits"),
            "alloc_conf": os.environ.get("PYTORCH_CUDA_ALLOC_CONF", ""), "gpus": args.gpus,
            "host_home": read_home(home)}  # this host's profile and calibration (benchmarks.fidelity.repredict)

    def save(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """Estimate what ran so far and write the JSON: a run cut short keeps its launches."""
        rows = predict_rows(runs, measured_key, args.cpu, latency, context)
        meta["date"] = _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")
        (out / "host4_fidelity.json").write_text(json.dumps({"meta": meta, "runs": runs, "rows": rows}, indent=1,
                                                            default=float) + "\n")
        return rows

    runs: list[dict[str, Any]] = []
    rows: list[dict[str, Any]] = []
    try:
        for name, sm, plans in todo:
            chosen = plans[:args.only] if args.only else plans
            t0 = time.perf_counter()
            res = run_launch([{"name": pn, "plan": plan_to_dict(p)} for pn, p in chosen],
                             [100] * len(sm) if args.cpu else list(sm), cpu=args.cpu, warmup=args.warmup,
                             steps=args.steps)
            res.update(name=name, sm=list(sm), seconds=time.perf_counter() - t0)
            runs.append(res)
            print(f"launch {name}: {len(chosen)} plans in {res['seconds']:.0f} s", flush=True)
            for leak in leaks(res):
                print(leak, flush=True)
            rows = save(runs)
        print(table(rows), flush=True)  # before the MPS daemon's shutdown, which a call's time limit may cut
    finally:
        if not args.cpu:
            try:
                subprocess.run(["bash", "-c", "echo quit | nvidia-cuda-mps-control"], check=False, timeout=60)
            except subprocess.TimeoutExpired:  # the results are written; a daemon slow to stop is no error
                print("the MPS daemon did not stop within 60 s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
