"""`make demo`: the main job on the bundled default example.

1. Validate and show the bundled heterogeneous cluster and a hand-written plan for it.
"""

from __future__ import annotations

import sys
from pathlib import Path

from planner.cli.main import main as cli

HERE = Path(__file__).resolve().parent
CLUSTER = HERE / "clusters" / "seed-32gpu-4types.yaml"
PLAN = HERE / "plans" / "seed-32gpu-4types-llama2-7b.json"


def run(*argv: str) -> None:
    print(f"\n$ hexiscale {' '.join(argv)}", flush=True)
    code = cli(list(argv))
    if code:
        sys.exit(code)


def main() -> None:
    run("show", str(CLUSTER))
    run("validate", str(PLAN), "--cluster", str(CLUSTER))
    run("show", str(PLAN), "--cluster", str(CLUSTER))


if __name__ == "__main__":
    main()
