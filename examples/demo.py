"""`make demo`: the main job on the bundled default example.

1. Plan llama2-7b on the bundled heterogeneous cluster (8x RTX 3080 Ti + 8x RTX 3090 + 8x RTX 4090 +
   8x A100) and show the plan with its estimate and seed-style flags.
2. Estimate a hand-written plan for the same cluster, for comparison.
3. Train a few CPU steps (one gloo process per device) from a small asymmetric plan: a TP-2 pipeline
   beside a 3-stage TP 1 -> 2 -> 1 pipeline with a different batch size and micro-batch count,
   tracing their per-micro-batch events. Skipped, with one line saying so, under ``--planner-only``
   or where torch is not installed (``make test-py312`` runs steps 1-2 so: the planner without torch).

Pictures (PNG) go to ``demo-output/`` (``HEXISCALE_DEMO_OUT`` overrides): the planned plan's map
and simulated step in ``planned/``, the CPU plan's map and measured step in ``measured/``;
``docs/pictures/`` holds copies that README shows.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import sys
import tempfile
from pathlib import Path

from hexiscale.cli.main import main as cli

HERE = Path(__file__).resolve().parent
CLUSTER = HERE / "clusters" / "seed-32gpu-4types.yaml"
HAND_PLAN = HERE / "plans" / "seed-32gpu-4types-llama2-7b.json"
CPU_PLAN = HERE / "plans" / "demo-cpu-6-tiny.json"
OUT = Path(os.environ.get("HEXISCALE_DEMO_OUT", HERE.parent / "demo-output"))


def run(*argv: str) -> None:
    shown = [a.replace(str(HERE.parent) + "/", "") for a in argv]
    print(f"\n$ hexiscale {' '.join(shown)}", flush=True)
    code = cli(list(argv))
    if code:
        sys.exit(code)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m examples.demo",
                                     description="make demo: plan, estimate, train a few CPU steps")
    parser.add_argument("--planner-only", action="store_true", help="steps 1-2 only (plan, estimate): no torch needed")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        planned = str(Path(tmp) / "plan.json")
        # --plot: where the plan's stages sit, and its step as the cost model simulates it (PNGs)
        run("plan", str(CLUSTER), "--model", "llama2-7b", "--global-batch-size", "64", "--time-limit", "5",
            "-o", planned, "--plot", str(OUT / "planned"))
        print("\n# For comparison: a hand-written plan for the same cluster. The estimate shows where it is slow")
        print("# and which devices it would run out of memory on (the planner's plan above fits).")
        run("estimate", str(HAND_PLAN), "--cluster", str(CLUSTER))
        if args.planner_only or importlib.util.find_spec("torch") is None:
            why = "--planner-only" if args.planner_only else "torch is not installed (pip install -e '.[train]')"
            print(f"\n# Step 3, CPU training, skipped: {why}.")
            return
        print("\n# Train 4 CPU steps from a small asymmetric plan, one gloo process per device; trace steps 2-4.")
        cpu_cluster = str(HERE / "clusters" / "demo-cpu-6.yaml")
        run("show", str(CPU_PLAN), "--cluster", cpu_cluster)
        trace = str(OUT / "trace.json")
        run("launch", str(CPU_PLAN), "--local", "--device", "cpu", "--", "--steps", "4", "--synthetic",
            "--trace", trace)
        run("show", trace, "--cluster", cpu_cluster, "--plot", str(OUT / "measured"))


if __name__ == "__main__":
    main()
