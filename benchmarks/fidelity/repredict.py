"""A fidelity run's estimates made again with today's cost model, beside the ones the run made.

Input: a ``benchmarks/fidelity/host4.py`` JSON (plans, measured step times and memory) and the
host's measured profile and calibration, which ``hexiscale calibrate`` wrote there: the JSON's
``meta.host_home`` (runs since session 7 carry it), or ``--home`` (a ``*.home.json`` of those files,
as committed beside older results, or the run's ``hexiscale-home`` folder). Checks a model change
against GPU measurements without a GPU:

    python -m benchmarks.fidelity.repredict benchmarks/results/fidelity_host2_h200_20261126T172837Z.json
"""

from __future__ import annotations

import argparse
import json
import sys
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from benchmarks.fidelity.host_home import installed, read_home

# When the engine began multiplying with one cast-once weight copy per stage (executor.model.cast_once):
# runs recorded before it ran autocast's casts, per micro-batch in flight (CostParams.cast_once off)
CAST_ONCE_SINCE = datetime(2026, 11, 27, 1, 25, tzinfo=timezone.utc)


def home_files(results: dict[str, Any], home: Path | None) -> dict[str, Any]:
    if home is not None:
        return read_home(home) if home.is_dir() else json.loads(home.read_text())
    files = (results.get("meta") or {}).get("host_home")
    if not files:
        raise SystemExit("repredict: this run carries no host profile (meta.host_home); pass --home with its "
                         "*.home.json or hexiscale-home folder")
    return files


def as_run(files: dict[str, Any], date: str | None) -> dict[str, Any]:
    """The host's files describing the executor that ran on ``date``: before cast-once, its
    calibrations' params say so (``cast_once: false``), so the memory model prices the casts that
    run kept per micro-batch in flight."""
    if not date or datetime.fromisoformat(date) >= CAST_ONCE_SINCE:
        return files
    return {rel: ({**data, "params": {**data["params"], "cast_once": False}}
                  if rel.startswith("calibration/") and isinstance(data.get("params"), dict) else data)
            for rel, data in files.items()}


def repredict(results: dict[str, Any], files: dict[str, Any]) -> list[dict[str, Any]]:
    """The run's rows estimated again (``host4.predict_rows``) with the host's files as its home,
    as the executor of the run's date ran (:func:`as_run`)."""
    from benchmarks.fidelity.host4 import predict_rows

    [key] = [rel.split("/")[1].removesuffix(".json") for rel in files if rel.startswith("calibration/")]
    meta = results.get("meta") or {}
    cpu = meta.get("gpu") == "cpu"  # a CPU rehearsal (host4 --cpu): one measured type for every share
    fits = meta.get("fits") or {}
    latency = (fits.get("link") or {}).get("latency_us") or 10.0
    context = (fits.get("framework_gib") or {}).get("measured_context_gib")
    with installed(as_run(files, meta.get("date"))):
        return predict_rows(results["runs"], key, cpu, latency, context)


def compare(old: list[dict[str, Any]], new: list[dict[str, Any]]) -> str:
    was = {r["plan"]: r for r in old}
    out = ["| plan | step error then | now | memory errors then -> now |", "|---|---:|---:|---|"]
    for r in new:
        o = was.get(r["plan"], {})
        if "time_err" not in r:
            out.append(f"| {r['plan']} | failed | | |")
            continue
        mem = ", ".join(f"{a['err'] * 100:+.1f} -> {b['err'] * 100:+.1f} %"
                        for a, b in zip(o.get("memory", []), r["memory"]))
        out.append(f"| {r['plan']} | {o.get('time_err', float('nan')) * 100:+.1f} % | {r['time_err'] * 100:+.1f} % "
                   f"| {mem} |")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("results", help="a host4 fidelity JSON")
    ap.add_argument("--home", default=None, help="the host's *.home.json or hexiscale-home folder")
    args = ap.parse_args(argv)
    path = Path(args.results)
    if not path.is_file():
        ap.error(f"results: no file {path}")
    results = json.loads(path.read_text())
    home = Path(args.home) if args.home else None
    if home is None and not (results.get("meta") or {}).get("host_home"):
        beside = path.with_suffix(".home.json")
        home = beside if beside.is_file() else None
    rows = repredict(results, home_files(results, home))
    from benchmarks.fidelity.host4 import table

    print(compare(results.get("rows", []), rows))
    print(table(rows).splitlines()[-1])
    return 0


if __name__ == "__main__":
    sys.exit(main())
