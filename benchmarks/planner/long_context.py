"""Long context: the planner's context-parallel plan against the best TP-only plan
(``python -m benchmarks.planner.long_context [--quick]``).

Two cases (issue 35): llama-1.3b at 64K on one 4-GPU H100 host (``examples/clusters/h100x4.yaml``)
and at 128K on the mixed 3080 Ti / 3090 / 4090 cluster (``seed-40gpu-3types.yaml``). Each is
planned twice by the same search, with context parallelism and without it (TP-only), and
the cost model's prediction of both plans is printed: step time, tokens/s, peak memory. Where no
TP-only plan fits, that is the row. Both plans go into the JSON (``plan``), so the 4-GPU pair can
be trained on the host and paired with its measured step times (the issue's bar: the CP plan trains
where TP-only plans run out of memory or are >= 1.3x slower). ``--quick``: no local search or
layer polish (CPU seconds). Prints a table and writes JSON under ``benchmarks/results/``.
"""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from benchmarks.planner.common import write_result
from planner.calibration.local import resolve_profiles
from planner.cluster import load_cluster
from planner.errors import PlanInfeasible
from planner.model import PRESETS
from planner.plan import Plan, plan_to_dict
from planner.search import PlannerConfig, search

CLUSTERS = Path(__file__).resolve().parents[2] / "examples" / "clusters"
CASES = (("h100x4", 65536, 8), ("seed-40gpu-3types", 131072, 16))  # cluster, sequence length, global batch


def layout(plan: Plan) -> str:
    """Pipelines, then per stage ``tp x cp`` and its layer count."""
    pipes = [" ".join(f"{s.tp}x{s.cp}:{s.num_layers}" for s in p.stages) for p in plan.pipelines]
    return f"{len(pipes)} pipe(s) | " + " | ".join(dict.fromkeys(pipes))


def one(cluster_name: str, seq_len: int, batch: int, cp: bool, quick: bool) -> dict[str, Any]:
    cluster = load_cluster(CLUSTERS / f"{cluster_name}.yaml")
    model = dataclasses.replace(PRESETS["llama-1.3b"], seq_len=seq_len)
    config = PlannerConfig(context_parallel=cp, local_search=not quick, polish=not quick)
    row: dict[str, Any] = {"cluster": cluster_name, "seq_len": seq_len, "global_batch": batch,
                           "planner": "with CP" if cp else "TP-only"}
    try:
        res = search(cluster, model, batch, config=config, profiles=resolve_profiles(cluster).profiles)
    except PlanInfeasible as exc:
        return {**row, "fits": False, "problem": str(exc).splitlines()[0]}
    est = res.estimate
    return {**row, "fits": est.fits, "layout": layout(res.plan), "recompute": res.plan.options.recompute,
            "micro_batches": [p.micro_batches for p in res.plan.pipelines],
            "step_time_s": est.step_time_s, "tokens_per_s": est.tokens_per_s, "mfu": est.mfu,
            "peak_memory_gib": max(est.memory_gib.values()), "evaluations": res.evaluations,
            "plan": plan_to_dict(res.plan)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="no local search or layer polish")
    args = ap.parse_args()
    rows = []
    for cluster_name, seq_len, batch in CASES:
        pair = [one(cluster_name, seq_len, batch, cp, args.quick) for cp in (True, False)]
        if pair[0].get("step_time_s") and pair[1].get("step_time_s"):
            pair[0]["speedup_vs_tp_only"] = pair[1]["step_time_s"] / pair[0]["step_time_s"]
        rows += pair
    table = Table(title="llama-1.3b, long context: the planner with context parallelism vs TP-only "
                        "(cost model's prediction)", title_justify="left")
    for col in ("cluster", "seq", "planner", "layout (tp x cp:layers)", "recompute", "step", "tokens/s",
                "peak GiB", "vs TP-only"):
        table.add_column(col, justify="left" if col in ("cluster", "planner", "layout (tp x cp:layers)") else "right")
    for r in rows:
        if "step_time_s" not in r:
            table.add_row(r["cluster"], f"{r['seq_len']:,}", r["planner"], "no plan fits (out of memory)",
                          "", "", "", "", "")
            continue
        speed = r.get("speedup_vs_tp_only")
        table.add_row(r["cluster"], f"{r['seq_len']:,}", r["planner"], r["layout"], r["recompute"],
                      f"{r['step_time_s']:.2f} s", f"{r['tokens_per_s']:,.0f}", f"{r['peak_memory_gib']:.1f}",
                      f"{speed:.2f}x" if speed else ("TP-only OOM" if r["planner"] == "with CP" else ""))
    Console(width=160).print(table)
    path = write_result("long_context", {"model": "llama-1.3b", "quick": args.quick, "rows": rows})
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
