"""Long context on 4 GPUs (issue 35): llama-1.3b at 64K tokens per sequence, the planner's plan
against fixed plans with and without context parallelism, each predicted by the cost model (as
``hexiscale estimate`` prices it on this host) and measured in the same run.

    python -m benchmarks.executor.long_context --out $OUT            # 4 GPUs, one call of < 5 min
    python -m benchmarks.executor.long_context --smoke --out /tmp/lc  # CPU, gloo, tiny model: seconds
    python -m benchmarks.executor.long_context --dry-run --out /tmp/lc  # estimates only, no launch

Plans (:mod:`benchmarks.executor.long_context_plans`): the planner's (``make_plan`` on four one-GPU
nodes of this machine's GPU type), no-CP layouts (tp4, tp2xdp2, tp2xpp2, pp4, dp4) and CP layouts
(cp4, cp2xtp2), each with the least recompute predicted to fit. A plan predicted over the card's
memory is reported "predicted OOM, not run"; one that runs out of memory anyway is "OOM (measured)".
CP plans run only once the executor lays out cp ranks (:func:`~long_context_plans.cp_refusal`);
until then they are estimated and reported "not run".

Prices: this host's calibration as ``hexiscale estimate`` finds it (``$HEXISCALE_HOME``, else the
packaged one), or ``--calibration FILE`` (e.g. from ``benchmarks.planner.fidelity`` on the same host);
the JSON names what priced the run (``priced_by``).

Measurement: :func:`benchmarks.fidelity.worker.run_launch` (one process per GPU, all plans in one
launch, ``--warmup`` untimed steps, the median of ``--steps`` timed ones, peak memory per process).
Budget: the cost model prices a step of 4 x 64K tokens at 8-15 s on 4x H100 (full recompute), so the
default is 1 warm-up + 2 timed steps and ``--budget-s 180`` of predicted GPU time (steps + 10 s of
build per plan), the slowest no-CP plans dropped first: with start-up about 4 minutes in all.
``--dry-run`` prints what would run and its predicted time on any machine. Prints the phase times
(planning, estimates, the launch; per plan on every rank: groups, build, warm-up, steps).

Prints the table and the Done-when lines (:mod:`benchmarks.executor.long_context_report`) and
writes ``OUT/long_context_<cuda|cpu-smoke|dry-run>_<date>.json`` (device, versions, date, every row with
its plan, the summary). ``--smoke`` measures nothing worth reading.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "benchmarks" / "results"
LAYOUT_NAMES = ("planner", "cp4", "cp2xtp2", "tp4", "tp2xdp2", "tp2xpp2", "pp4", "dp4")


def gpu_key(cuda: bool) -> str:
    """The measured catalog entry of this machine's GPU (as ``benchmarks.executor.peers``), read with
    ``nvidia-smi``: the driver process makes no CUDA context on GPU 0 that rank 0's memory would share."""
    name = ""
    if cuda:
        try:
            name = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True,
                                  text=True, check=False, timeout=60).stdout
        except (OSError, subprocess.TimeoutExpired):  # no driver here (a --dry-run on a CPU machine)
            name = ""
    return "h200-measured" if "H200" in name else "h100-sxm-measured"


def check_gpus() -> None:
    import torch

    if not torch.cuda.is_available() or torch.cuda.device_count() < 4:
        raise SystemExit(f"long_context: needs 4 GPUs, found {torch.cuda.device_count()}; run with --smoke "
                         "(CPU) or --dry-run (estimates only)")


def one_node_twin(cluster: Any) -> Any:
    """The worker's four one-GPU nodes ``g0..g3`` as one node ``g`` of four GPUs on the same link:
    the search keeps TP and CP groups inside a node, and these nodes are one host's GPUs."""
    from planner.cluster import parse_cluster

    node = cluster.nodes[0]
    link = {"kind": node.intra_link.kind, "bandwidth_GBps": node.intra_link.bandwidth_GBps,
            "latency_us": node.intra_link.latency_us}
    return parse_cluster({"name": "host4-one-node", "inter_node": link, "nodes": [{"name": "g", "gpu": node.gpu,
                                                                "gpus": len(cluster.nodes), "intra_link": link}]})


def on_nodes(plan: Any) -> Any:
    """``plan`` with the twin's devices ``g:k`` renamed to the worker's ``gk:0``."""
    from dataclasses import replace as _replace

    def name(d: str) -> str:
        node, k = d.split(":")
        return f"g{k}:0" if node == "g" else d

    pipes = tuple(_replace(p, stages=tuple(_replace(st, devices=tuple(map(name, st.devices))) for st in p.stages))
                  for p in plan.pipelines)
    return _replace(plan, pipelines=pipes)


def candidates(args: argparse.Namespace, model: Any, cluster: Any, profiles: Any,
               cp_reason: str | None) -> tuple[list[Any], dict[str, Any]]:
    """Every row before the run (the planner's first) and what planning took."""
    from benchmarks.executor.long_context_plans import CP_LAYOUTS, TP_LAYOUTS, Candidate, ladder, predictor, same_layout
    from planner.errors import SpecError
    from planner.search import PlannerConfig, make_plan

    predict = predictor(cluster, profiles)
    notes: dict[str, Any] = {"skipped_layouts": {}}
    rows: list[Candidate] = []
    t0 = time.perf_counter()
    if "planner" in args.plans:
        try:  # searched on the host as one 4-GPU node (CP groups stay inside a node), run on g0..g3
            twin = one_node_twin(cluster)
            plan = on_nodes(make_plan(twin, model, args.global_batch_size, profiles=profiles,
                                      config=PlannerConfig(time_limit_s=1.0 if args.smoke else 10.0)))
            step, peak, cap, _ = predict(plan)
            uses_cp = any(st.cp > 1 for p in plan.pipelines for st in p.stages)
            rows.append(Candidate("planner", plan, "planner", step, peak, cap,
                                  f"not run: {cp_reason}" if uses_cp and cp_reason else ""))
        except SpecError as exc:  # PlanInfeasible and friends: a finding, not the end of the run
            notes["planner_error"] = str(exc)
            print(f"planner: {exc}", flush=True)
    notes["planning_s"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    cp_layouts = CP_LAYOUTS if not args.smoke or cp_reason is None else ()
    for layout in (*cp_layouts, *TP_LAYOUTS):
        if layout.name not in args.plans:
            continue
        try:
            rungs = ladder(model, layout, args.global_batch_size, predict)
        except SpecError as exc:  # e.g. dp does not divide the global batch
            notes["skipped_layouts"][layout.name] = str(exc)
            print(f"{layout.name}: not built: {exc}", flush=True)
            continue
        for rung in rungs:
            if rows and rows[0].source == "planner" and same_layout(rows[0].plan, rung.plan):
                notes["planner_same_as"] = rung.name  # measured once, as the planner's row
                continue
            if layout.cp > 1 and cp_reason and not rung.status:
                rung = replace(rung, status=f"not run: {cp_reason}")
            rows.append(rung)
    notes["estimates_s"] = time.perf_counter() - t0
    return rows, notes


def run(args: argparse.Namespace) -> Path:
    from benchmarks.executor.long_context_plans import cp_refusal, smoke_model, within_budget
    from benchmarks.executor.long_context_report import add_ratios, result_row, summary, summary_lines, table
    from benchmarks.executor.run_meta import run_versions
    from benchmarks.fidelity.host4 import cluster_for
    from benchmarks.fidelity.worker import run_launch
    from planner.calibration.local import resolve_profiles
    from planner.model import PRESETS
    from planner.plan import plan_to_dict

    t_start = time.perf_counter()
    if args.calibration:  # before the planner reads its catalog: this run's home holds the calibration
        from benchmarks.planner.fidelity import install_calibration

        home = Path(args.out) / "hexiscale-home"
        os.environ["HEXISCALE_HOME"] = str(home)
        install_calibration(Path(args.calibration), home)
    cuda = not args.smoke and not args.dry_run
    if cuda:
        check_gpus()
    model = smoke_model(args.seq_len) if args.smoke else replace(PRESETS[args.model], seq_len=args.seq_len)
    cluster = cluster_for((100,) * 4, gpu_key(not args.smoke), cpu=args.smoke)
    resolved = resolve_profiles(cluster)
    print(resolved.line, flush=True)
    cp_reason = cp_refusal()
    if cp_reason:
        print(f"CP plans: {cp_reason}", flush=True)
    cands, notes = candidates(args, model, cluster, resolved.profiles, cp_reason)
    cands = within_budget(cands, args.warmup + args.steps, args.budget_s)
    todo = [c for c in cands if not c.status]
    gpu_s = sum((args.warmup + args.steps) * c.predicted_s for c in todo)
    print(f"planning {notes['planning_s']:.1f} s, estimates {notes['estimates_s']:.1f} s; running {len(todo)} of "
          f"{len(cands)} plans, predicted GPU time {gpu_s:.0f} s plus build", flush=True)
    t0 = time.perf_counter()
    results: dict[str, Any] = {}
    if todo and not args.dry_run:
        launch = run_launch([{"name": c.name, "plan": plan_to_dict(c.plan)} for c in todo], [100] * 4, cpu=args.smoke,
                            warmup=args.warmup, steps=args.steps)
        results = {p["name"]: p for p in launch["plans"]}
    notes["launch_s"] = time.perf_counter() - t0
    print("dry run: nothing launched" if args.dry_run else f"launch: {len(todo)} plans in {notes['launch_s']:.0f} s",
          flush=True)
    if args.dry_run:
        cands = [c if c.status else replace(c, status="would run (dry run)") for c in cands]
    rows = [result_row(c, results.get(c.name)) for c in cands]
    for r in rows:
        if r["source"] == "planner" and "planner_same_as" in notes:
            r["same_as"] = notes["planner_same_as"]
    add_ratios(rows)
    stats = summary(rows)
    notes["wall_s"] = time.perf_counter() - t_start
    meta = {**run_versions(cuda), "model": model.to_dict(), "global_batch_size": args.global_batch_size,
            "warmup": args.warmup, "steps": args.steps, "budget_s": args.budget_s, "priced_by": resolved.line,
            "cp_refusal": cp_reason, "smoke": args.smoke, **notes}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    label = "cpu-smoke" if args.smoke else "dry-run" if args.dry_run else "cuda"
    path = out / f"long_context_{label}_{stamp}.json"
    path.write_text(json.dumps({"benchmark": "executor.long_context", "meta": meta, "summary": stats, "rows": rows},
                               indent=1, default=_json_float) + "\n")
    print(table(rows), flush=True)
    for line in summary_lines(stats):
        print(line, flush=True)
    print(f"total {notes['wall_s']:.0f} s; wrote {path}", flush=True)
    return path


def _json_float(x: Any) -> Any:
    return None if isinstance(x, float) and not math.isfinite(x) else float(x)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                 epilog="Expected time: 4-5 minutes on 4x H100 (one call); --smoke: seconds on CPU.")
    ap.add_argument("--out", default=str(RESULTS), help="folder for the JSON (default benchmarks/results)")
    ap.add_argument("--smoke", action="store_true", help="CPU, gloo, tiny model (tiny-8l), short sequences")
    ap.add_argument("--model", default="llama-1.3b", help="a model preset (default llama-1.3b)")
    ap.add_argument("--seq-len", type=int, help="tokens per sequence (default 65536; --smoke: 64)")
    ap.add_argument("--global-batch-size", type=int, default=4, help="sequences per step (default 4)")
    ap.add_argument("--warmup", type=int, default=1, help="untimed steps per plan (default 1)")
    ap.add_argument("--steps", type=int, default=2, help="timed steps per plan, median taken (default 2)")
    ap.add_argument("--budget-s", type=float, default=180.0, help="predicted GPU seconds for all plans' steps "
                    "and builds (default 180): plans past it are skipped, the slowest no-CP ones first")
    ap.add_argument("--calibration", help="a calibration written by 'hexiscale calibrate' "
                    "(HOME/calibration/<key>.json) to price the plans with; default: this host's, as "
                    "'hexiscale estimate' finds it")
    ap.add_argument("--dry-run", action="store_true", help="plan and estimate only: the table of predictions and "
                    "what would run, no launch (64K on a CPU machine, to size a GPU call)")
    ap.add_argument("--plans", default=",".join(LAYOUT_NAMES), help=f"comma list of {', '.join(LAYOUT_NAMES)} "
                    "(default: all)")
    args = ap.parse_args(argv)
    args.seq_len = (64 if args.smoke else 65536) if args.seq_len is None else args.seq_len
    args.plans = [x for x in args.plans.split(",") if x]
    from planner.model import PRESETS

    bad = [x for x in args.plans if x not in LAYOUT_NAMES]
    if bad:
        ap.error(f"--plans: no plan named {bad[0]!r}; choose from {', '.join(LAYOUT_NAMES)}")
    if args.model not in PRESETS:
        ap.error(f"--model: no preset {args.model!r}; choose from {', '.join(sorted(PRESETS))}")
    if args.seq_len < 16 or args.global_batch_size < 1 or args.warmup < 0 or args.steps < 1:
        ap.error(f"--seq-len must be >= 16, --global-batch-size and --steps >= 1, --warmup >= 0 (got "
                 f"{args.seq_len}, {args.global_batch_size}, {args.steps}, {args.warmup})")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")  # multicast off on multi-GPU hosts (benchmarks/README.md)
    run(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
