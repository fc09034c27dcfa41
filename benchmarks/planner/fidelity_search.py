"""The planner's plans of the fidelity program (:mod:`benchmarks.planner.fidelity`), searched at once.

Each planner's case is searched on the cluster its launch stands for, with this host's calibration
(``HEXISCALE_HOME`` is inherited), each in a process of its own: the searches are independent and each
runs to its time limit, so one after the other they took ~40 s of the device's 10 minutes with the
GPUs idle; at once, about one search's time.
"""

from __future__ import annotations

from typing import Any


def planner_plan(case: Any, cluster: Any, profiles: Any, quick: bool) -> Any:
    from planner.search import PlannerConfig, make_plan

    return make_plan(cluster, case.model, case.global_batch, profiles=profiles,
                     config=PlannerConfig(time_limit_s=1.0 if quick else 10.0))


def _search(launch_index: int, name: str, key: str, latency: float, quick: bool) -> dict[str, Any]:
    """The planner's plan of case ``name`` of launch ``launch_index`` (in a process of its own):
    ``{"plan": plan-dict}`` or ``{"error": line}``."""
    from benchmarks.fidelity.host4 import cluster_for
    from benchmarks.planner.fidelity_plans import launches
    from planner.calibration.local import resolve_profiles
    from planner.plan import plan_to_dict

    launch = launches(quick)[launch_index]
    case = next(c for c in launch.cases if c.name == name)
    cluster = cluster_for(launch.sm, key, quick, latency)
    try:
        return {"plan": plan_to_dict(planner_plan(case, cluster, resolve_profiles(cluster).profiles, quick))}
    except Exception as exc:  # noqa: BLE001 - a plan the planner cannot make is a row, not the end
        return {"error": f"planner: {exc}"}


def search_all(wanted: list[str], key: str, latency: float, quick: bool) -> dict[str, dict[str, Any]]:
    """Every planner's case in ``wanted`` searched at once, one process each (module docstring):
    case name -> ``{"plan": plan-dict}`` or ``{"error": line}``."""
    import concurrent.futures as cf
    import multiprocessing as mp

    from benchmarks.planner.fidelity_plans import launches

    jobs = [(i, c.name) for i, launch in enumerate(launches(quick)) for c in launch.cases
            if c.planner and c.name in wanted]
    if not jobs:
        return {}
    with cf.ProcessPoolExecutor(max_workers=len(jobs), mp_context=mp.get_context("spawn")) as pool:
        futures = {name: pool.submit(_search, i, name, key, latency, quick) for i, name in jobs}
        return {name: f.result() for name, f in futures.items()}
