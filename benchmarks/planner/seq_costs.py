"""Per-sequence cost ``a·s² + b·s + c`` and token caps per (GPU type, TP, PP)
(``python -m benchmarks.planner.seq_costs [--model M] [--context C] [--gpu TYPE]``).

For a pipeline of ``PP`` equal stages of ``TP`` GPUs of one type (NVLink host), the fit of
:func:`planner.varlen.seq_cost.stage_cost` on the bottleneck stage (the cost model's figures: the
measured profile of the type where one exists) and the largest micro-batch in tokens that fits
(1F1B in flight, ZeRO-1 off). Prints a table and writes JSON under ``benchmarks/results/``.
"""

from __future__ import annotations

import argparse
from dataclasses import replace

from rich.console import Console
from rich.table import Table

from benchmarks.planner.common import write_result
from planner.calibration.local import resolve_profiles
from planner.cluster import parse_cluster
from planner.hf_config import resolve_model
from planner.plan import Pipeline, Plan, PlanOptions, Stage
from planner.varlen.seq_cost import pipeline_costs


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="llama-1.3b")
    ap.add_argument("--context", type=int, default=32768)
    ap.add_argument("--gpu", default="h100-sxm")
    ap.add_argument("--recompute", default="none", choices=("none", "selective", "full"))
    args = ap.parse_args()
    model = resolve_model(args.model, args.context)
    cluster = parse_cluster({"name": "one-host", "nodes": [{"name": "n", "gpu": args.gpu, "gpus": 8, "intra_link": {
        "kind": "nvlink", "bandwidth_GBps": 450, "latency_us": 10}}], "inter_node": {"kind": "nvlink",
                                                                                     "bandwidth_GBps": 450}})
    profiles = resolve_profiles(cluster).profiles
    rows = []
    for tp in (1, 2, 4):
        for pp in (1, 2, 4):
            if tp * pp > 8 or model.num_heads % tp or model.num_layers % pp:
                continue
            per = model.num_layers // pp
            stages = tuple(Stage(tuple(f"n:{s * tp + i}" for i in range(tp)), tp, (s * per, (s + 1) * per))
                           for s in range(pp))
            plan = Plan(replace(model), 1, (Pipeline(1, 1, stages),), PlanOptions(recompute=args.recompute))
            [cost] = pipeline_costs(plan, cluster, profiles=profiles)
            k = cost.bottleneck()
            rows.append({"tp": tp, "pp": pp, "a": k.a, "b": k.b, "c": k.c, "d": k.d, "fit_error": k.fit_error,
                         "token_cap": cost.token_cap, "s_at_4k": k.micro_batch_s([4096]),
                         "s_at_context": k.micro_batch_s([args.context])})
    table = Table(title=f"{args.model} on {args.gpu}, context {args.context:,}, recompute {args.recompute}: "
                        "bottleneck stage, t = a·Σs² + b·Σs + c + d·documents")
    for col in ("TP", "PP", "a (s/token²)", "b (s/token)", "c (s)", "d (s/doc)", "fit error", "token cap", "t(4K)",
                "t(context)"):
        table.add_column(col, justify="right")
    for r in rows:
        table.add_row(str(r["tp"]), str(r["pp"]), f"{r['a']:.3e}", f"{r['b']:.3e}", f"{r['c']:.3e}",
                      f"{r['d']:.3e}", f"{r['fit_error']:.1%}", f"{r['token_cap']:,}", f"{r['s_at_4k']:.4f}",
                      f"{r['s_at_context']:.4f}")
    Console(width=140).print(table)
    path = write_result("seq_costs", {"model": args.model, "gpu": args.gpu, "context": args.context,
                                      "recompute": args.recompute, "rows": rows})
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
