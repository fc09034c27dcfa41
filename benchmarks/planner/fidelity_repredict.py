"""A recorded run of :mod:`benchmarks.planner.fidelity` estimated again with today's cost model, from
the run's own host calibrations (its ``hexiscale-home``, committed beside the run as
``<run>.home.json``): so CPU tests hold the model to what a GPU measured, and a model change shows
what it does to a recorded run.

    python -m benchmarks.planner.fidelity_repredict benchmarks/results/fidelity_h200x4_20261127T124458Z.json

Each row is priced as the program priced it (:func:`benchmarks.planner.fidelity.measure_row`: the
launch's cluster of this host's measured types, a packed row by its own micro-batches) and compared
with the measured step time and per-process memory the run recorded.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from benchmarks.fidelity.host_home import installed


def repredict(path: Path, home: Path | None = None) -> list[dict[str, Any]]:
    """The rows of the run at ``path`` priced again (``home``: its ``.home.json``, by default beside it)."""
    from benchmarks.fidelity.host4 import cluster_for
    from benchmarks.planner.fidelity import measure_row
    from benchmarks.planner.fidelity_calibrate import read_calibration
    from benchmarks.planner.fidelity_packed import packed_micro_batches
    from benchmarks.planner.fidelity_plans import launches
    from planner.calibration.local import resolve_profiles
    from planner.plan import plan_from_dict

    results = json.loads(path.read_text())
    home = home or path.with_name(path.name.removesuffix(".json") + ".home.json")
    if not home.exists():
        raise SystemExit(f"fidelity_repredict: no host home {home} beside the run (its hexiscale-home as JSON)")
    files = json.loads(home.read_text())
    quick = bool(results["meta"].get("quick"))
    cases = {c.name: c for launch in launches(quick) for c in launch.cases}
    rows: list[dict[str, Any]] = []
    with installed(files) as folder:
        cal = read_calibration(folder)
        key = cal["applies_to"][0]
        fits = cal.get("fits", {})
        context = (fits.get("framework_gib") or {}).get("measured_context_gib")
        latency = (fits.get("link") or {}).get("latency_us") or 10.0
        for run in results["runs"]:
            cluster = cluster_for(tuple(run["sm"]), key, quick, latency)
            profiles = resolve_profiles(cluster).profiles
            for res in run["plans"]:
                case = cases[res["name"]]
                entry: dict[str, Any] = {"name": res["name"], "plan": res["plan"]}
                if case.packed:
                    entry["packed"] = packed_micro_batches(plan_from_dict(res["plan"]))
                rows.append(measure_row(case, entry, res, cluster, profiles, list(run["sm"]), context))
    return rows


def main(argv: list[str] | None = None) -> int:
    from benchmarks.fidelity.host4 import table
    from benchmarks.planner.fidelity import summary

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("run", help="a fidelity_<device>_<date>.json written by benchmarks.planner.fidelity")
    ap.add_argument("--home", help="its host home (default: <run>.home.json beside it)")
    args = ap.parse_args(argv)
    path = Path(args.run)
    if not path.exists():
        raise SystemExit(f"fidelity_repredict: no file {path}")
    rows = repredict(path, Path(args.home) if args.home else None)
    print(table(rows))
    print(json.dumps(summary(rows)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
