"""The planner against baselines under the same cost model (``python -m benchmarks.planner.baselines``).

On the seed papers' clusters (``examples/clusters``; the two homogeneous A100 clusters as a
control) every planner is scored by :func:`planner.cost.estimate`:

* **hexiscale** — :func:`planner.search.search` with the default configuration;
* **seed-style** — the seed planner's method re-implemented (:func:`planner.search.baselines.seed_style`:
  METIS split, random pipeline count, random stage count, layers in proportion to memory, the same
  batch for every pipeline; best of ``--trials`` random draws);
* **megatron** — the best homogeneous Megatron-style plan (one TP/PP/DP degree for every device);
* **proportional** — Megatron grids with layers and batch split in proportion to compute.

Target: hexiscale >= 1.5x the seed-style baseline's estimated throughput.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

from benchmarks.planner.common import write_result
from planner.cluster import load_cluster
from planner.model import PRESETS
from planner.search import search
from planner.search.baselines import megatron_homogeneous, proportional, seed_style

ROOT = Path(__file__).resolve().parents[2]
CASES = [
    ("seed-32gpu-4types", "llama2-7b", 64),
    ("seed-40gpu-3types", "llama2-7b", 64),
    ("seed-uneven-nodes", "llama2-7b", 64),
    ("h20-h800", "llama2-13b", 128),
    ("h20-h800", "llama-30b", 128),
    ("a100-pcie-2x8-tcp", "llama2-7b", 64),
    ("a100-pcie-4x8-tcp", "llama2-7b", 64),
]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--trials", type=int, default=40, help="random draws of the seed-style baseline")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    rows = []
    for cluster_name, model_name, batch in CASES:
        cluster = load_cluster(ROOT / "examples" / "clusters" / f"{cluster_name}.yaml")
        model = PRESETS[model_name]
        t0 = time.process_time()
        ours = search(cluster, model, batch)
        t_ours = time.process_time() - t0
        base = {
            "seed-style": seed_style(cluster, model, batch, trials=args.trials, seed=args.seed),
            "megatron": megatron_homogeneous(cluster, model, batch),
            "proportional": proportional(cluster, model, batch),
        }
        tps = {name: b.tokens_per_s for name, b in base.items()}
        row = {
            "cluster": cluster_name, "gpus": cluster.num_devices, "model": model_name, "global_batch": batch,
            "hexiscale_tokens_per_s": ours.estimate.tokens_per_s, "hexiscale_mfu": ours.estimate.mfu,
            "hexiscale_step_s": ours.estimate.step_time_s, "hexiscale_cpu_s": round(t_ours, 3),
            "hexiscale_plan": {"pipelines": len(ours.plan.pipelines), "options": vars(ours.plan.options),
                               "tp": [[s.tp for s in p.stages] for p in ours.plan.pipelines],
                               "layers": [[s.num_layers for s in p.stages] for p in ours.plan.pipelines],
                               "batch": [p.batch_size for p in ours.plan.pipelines]},
            **{f"{name}_tokens_per_s": v for name, v in tps.items()},
            **{f"vs_{name}": (ours.estimate.tokens_per_s / v if v > 0 else None) for name, v in tps.items()},
        }
        rows.append(row)
        print(f"{cluster_name} {model_name}: {row['vs_seed-style'] or float('inf'):.2f}x seed-style", flush=True)
    table = Table(title="estimated throughput (tokens/s) under the same cost model", title_justify="left")
    for col in ("cluster", "model", "batch", "hexiscale", "MFU", "seed-style", "megatron", "proportional",
                "vs seed-style", "vs megatron", "vs proportional"):
        table.add_column(col, justify="left" if col in ("cluster", "model") else "right")

    def ratio(x: float | None) -> str:
        return "n/a (none fits)" if x is None else f"{x:.2f}x"

    for r in rows:
        table.add_row(r["cluster"], r["model"], str(r["global_batch"]), f"{r['hexiscale_tokens_per_s']:,.0f}",
                      f"{r['hexiscale_mfu'] * 100:.1f} %", f"{r['seed-style_tokens_per_s']:,.0f}",
                      f"{r['megatron_tokens_per_s']:,.0f}", f"{r['proportional_tokens_per_s']:,.0f}",
                      ratio(r["vs_seed-style"]), ratio(r["vs_megatron"]), ratio(r["vs_proportional"]))
    Console(width=170).print(table)
    path = write_result("planner_baselines", {"rows": rows, "seed_style_trials": args.trials, "seed": args.seed,
                                              "target": ">= 1.5x seed-style on the seed papers' clusters"})
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
