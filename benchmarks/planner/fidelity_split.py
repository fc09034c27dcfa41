"""The fidelity program in several calls: which plans each part runs, and one table from the parts.

The program fits one device call of 10 minutes on 4x H100 (:mod:`benchmarks.planner.fidelity_budget`);
a shorter call can run it in parts. ``--part K/N`` runs the K-th of N parts, balanced by each plan's
expected device seconds (:func:`expected_s`, longest first onto the lightest part), with the
calibration of the first part passed to the others (``--calibration``); ``--merge A.json B.json``
then makes one result file and one table of them (:func:`merge_results`), refusing parts measured
with different calibrations.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from benchmarks.planner.fidelity_budget import CALIBRATE_S, SEARCH_S, plan_s
from benchmarks.planner.fidelity_plans import Case, Launch


def expected_s(case: Case) -> float:
    """The expected device seconds of ``case`` (:func:`benchmarks.planner.fidelity_budget.plan_s`), its
    search included for a planner's case."""
    return plan_s(case) + (SEARCH_S if case.planner else 0.0)


def parse_part(text: str) -> tuple[int, int]:
    """``"K/N"`` -> ``(K, N)`` with ``1 <= K <= N``; ValueError with the fix otherwise."""
    try:
        k, n = (int(x) for x in text.split("/"))
    except ValueError:
        raise ValueError(f"--part: expected K/N (e.g. 1/2), got {text!r}") from None
    if not 1 <= k <= n:
        raise ValueError(f"--part: K must be in 1..N, got {text!r}")
    return k, n


def part_names(launches: Sequence[Launch], k: int, n: int) -> list[str]:
    """Plan names of part ``k`` of ``n`` (1-based): every plan in exactly one part, the parts'
    expected seconds balanced (longest plan first onto the lightest part; ties by plan order), part 1
    starting with the calibration's :data:`CALIBRATE_S`. Every call computes the same split."""
    cases = [c for launch in launches for c in launch.cases]
    load = [CALIBRATE_S] + [0.0] * (n - 1)
    owner: dict[str, int] = {}
    for i in sorted(range(len(cases)), key=lambda i: (-expected_s(cases[i]), i)):
        j = min(range(n), key=lambda j: (load[j], j))
        owner[cases[i].name] = j
        load[j] += expected_s(cases[i])
    return [c.name for c in cases if owner[c.name] == k - 1]


def _calibration_of(data: dict[str, Any]) -> tuple[Any, Any]:
    meta = data.get("meta", {})
    return Path(str(meta.get("calibration_file", ""))).name, meta.get("calibration_provenance")


def merge_results(paths: Sequence[Path]) -> dict[str, Any]:
    """The result files at ``paths`` as one (rows and runs in order, ``meta`` of the first with
    ``merged_from`` and the summed ``wall_s``); ValueError naming the file where two parts used
    different calibrations or measured the same plan. ``summary`` is left to the caller."""
    if len(paths) < 2:
        raise ValueError("--merge: pass two or more result files (fidelity_<device>_<date>.json)")
    datas = []
    for p in paths:
        try:
            datas.append(json.loads(Path(p).read_text()))
        except (OSError, ValueError) as exc:
            raise ValueError(f"--merge: {p}: not a fidelity result file ({exc})") from None
    first = _calibration_of(datas[0])
    seen: dict[str, Path] = {}
    for p, d in zip(paths, datas):
        if d.get("benchmark") != "planner.fidelity":
            raise ValueError(f"--merge: {p}: not written by benchmarks.planner.fidelity")
        if _calibration_of(d) != first:
            raise ValueError(f"--merge: {p}: measured with calibration {_calibration_of(d)[0]!r} of another run than "
                             f"{paths[0]}; run every part with --calibration of the first part's file")
        for r in d.get("rows", []):
            if r["plan"] in seen:
                raise ValueError(f"--merge: {p}: plan {r['plan']} is also in {seen[r['plan']]}; merge each part once")
            seen[r["plan"]] = p
    meta = {**datas[0]["meta"], "merged_from": [str(p) for p in paths],
            "wall_s": sum(float(d["meta"].get("wall_s", 0.0)) for d in datas)}
    rows = [r for d in datas for r in d.get("rows", [])]
    runs = [r for d in datas for r in d.get("runs", [])]
    return {"benchmark": "planner.fidelity", "partial": any(d.get("partial") for d in datas), "meta": meta,
            "rows": rows, "runs": runs}
