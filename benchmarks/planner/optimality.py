"""Planner vs the exhaustive optimum on clusters of <= 16 GPUs (``python -m benchmarks.planner.optimality``).

For each case the enumerator (:mod:`planner.search.enumerate`) scores every point of the plan
space the planner searches (every way to cut each node into TP groups, every multiset partition
of the groups into pipelines, every setting; exact layer and batch splits for each) and the
planner runs its heuristic search over the same space (same ``PlannerConfig``). Both answers are
scored by the full cost model; the table reports ``optimum step time / planner step time``
(the planner's share of the optimal throughput; target >= 99 % on every case) and the same
ratio under the planner's surrogate, which is what the enumeration ranks by.
"""

from __future__ import annotations

import argparse
import time
from dataclasses import replace
from typing import Any

from rich.console import Console
from rich.table import Table

from benchmarks.planner.common import write_result
from planner.cluster import ClusterSpec, load_cluster, parse_cluster
from planner.model import PRESETS, ModelSpec
from planner.search import PlannerConfig, search
from planner.search.enumerate import enumerate_plans

NV = {"kind": "nvlink", "bandwidth_GBps": 300, "latency_us": 3}
PCIE = {"kind": "pcie", "bandwidth_GBps": 20, "latency_us": 10}
IB = {"kind": "infiniband", "bandwidth_GBps": 12.5, "latency_us": 5}
ETH = {"kind": "ethernet", "bandwidth_GBps": 3.125, "latency_us": 50}
SPACE = PlannerConfig(micro_batch_sizes=(1, 2), recompute=("none", "full"), zero=(1,), schedules=("1f1b",))
SMALL_SPACE = replace(SPACE, micro_batch_sizes=(1,), recompute=("none",))


def _cluster(name: str, nodes: list[tuple[str, str, int, dict[str, Any]]], inter: dict[str, Any]) -> ClusterSpec:
    return parse_cluster({"name": name, "nodes": [{"name": n, "gpu": g, "gpus": c, "intra_link": lk}
                                                  for n, g, c, lk in nodes], "inter_node": inter})


def cases() -> list[tuple[str, ClusterSpec, ModelSpec, int, PlannerConfig]]:
    seq1k = replace(PRESETS["llama-1.3b"], seq_len=1024)
    return [
        ("4: 2 A100 + 2 RTX4090", _cluster("c4", [("a", "a100-sxm-80g", 2, NV), ("r", "rtx4090", 2, PCIE)], ETH),
         seq1k, 32, SPACE),
        ("6: demo-cpu-6 (capped GPU)", load_cluster("examples/clusters/demo-cpu-6.yaml"), PRESETS["llama2-7b"], 16,
         SPACE),
        ("8: 4 H100 + 4 RTX3090", _cluster("c8a", [("h", "h100-sxm", 4, NV), ("r", "rtx3090", 4, PCIE)], IB),
         PRESETS["llama2-7b"], 32, SPACE),
        ("8: 4 A100-40G + 4 RTX3080Ti", _cluster("c8b", [("a", "a100-pcie-40g", 4, PCIE),
                                                        ("r", "rtx3080ti", 4, PCIE)], ETH), seq1k, 64, SPACE),
        ("12: 4 H800 + 4 A10 + 4 RTX4090", _cluster("c12", [("h", "h800", 4, NV), ("a", "a10", 4, PCIE),
                                                           ("r", "rtx4090", 4, PCIE)], IB),
         PRESETS["llama2-7b"], 48, SPACE),
        ("16: 8 A100 + 8 RTX4090", _cluster("c16", [("a", "a100-sxm-80g", 8, NV), ("r", "rtx4090", 8, PCIE)], IB),
         PRESETS["llama2-7b"], 64, SMALL_SPACE),
    ]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--only", type=int, nargs="*", help="case indices to run (default: all)")
    args = ap.parse_args()
    rows = []
    for i, (name, cluster, model, batch, cfg) in enumerate(cases()):
        if args.only and i not in args.only:
            continue
        t0 = time.process_time()
        planned = search(cluster, model, batch, config=cfg)
        t_plan = time.process_time() - t0
        t0 = time.process_time()
        opt = enumerate_plans(cluster, model, batch, config=cfg)
        t_enum = time.process_time() - t0
        best = opt.best
        row = {
            "case": name, "gpus": cluster.num_devices, "model": model.name, "seq_len": model.seq_len,
            "global_batch": batch, "space": {"micro_batch_sizes": cfg.micro_batch_sizes, "recompute": cfg.recompute,
                                             "zero": cfg.zero, "schedules": cfg.schedules},
            "planner_step_s": planned.estimate.step_time_s, "optimum_step_s": best.estimate.step_time_s,
            "ratio": best.estimate.step_time_s / planned.estimate.step_time_s,
            "planner_surrogate_s": planned.candidate.step_s, "optimum_surrogate_s": best.candidate.step_s,
            "surrogate_ratio": best.candidate.step_s / planned.candidate.step_s,
            "points": opt.points, "structures": opt.structures, "planner_cpu_s": round(t_plan, 3),
            "enumeration_cpu_s": round(t_enum, 1), "planner_evaluations": planned.evaluations,
        }
        rows.append(row)
        print(f"{name}: ratio {row['ratio'] * 100:.2f} % ({opt.points} points, {t_enum:.0f} s)", flush=True)
    table = Table(title="planner vs exhaustive optimum (same plan space, same cost model)", title_justify="left")
    for col in ("case", "model", "batch", "planner s", "optimum s", "planner/optimum", "surrogate ratio",
                "points", "enum CPU s", "planner CPU s"):
        table.add_column(col, justify="left" if col in ("case", "model") else "right")
    for r in rows:
        table.add_row(r["case"], f"{r['model']} s={r['seq_len']}", str(r["global_batch"]), f"{r['planner_step_s']:.4f}",
                      f"{r['optimum_step_s']:.4f}", f"{r['ratio'] * 100:.2f} %", f"{r['surrogate_ratio'] * 100:.2f} %",
                      str(r["points"]), f"{r['enumeration_cpu_s']:.0f}", f"{r['planner_cpu_s']:.2f}")
    Console(width=160).print(table)
    path = write_result("planner_optimality", {"rows": rows, "target": ">= 99 % on every case"})
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
