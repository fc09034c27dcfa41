"""What an estimate says about ``options.compile``: compiled blocks are priced from a measured
compiled/eager layer-time ratio per GPU type (``CostParams.compiled_layer_ratio``, written by
``hexiscale calibrate``); a type without one is priced as eager for time — no invented speed-up —
and the estimate's notes say which (the memory model counts the compiled path's activations either
way, :mod:`planner.cost.memory`)."""

from __future__ import annotations

from planner.cluster import ClusterSpec
from planner.cost.profile_set import ProfileSet
from planner.plan import Plan


def compile_notes(plan: Plan, cluster: ClusterSpec, profiles: ProfileSet) -> list[str]:
    """One line per GPU type of ``plan`` when its blocks are compiled; nothing for an eager plan."""
    if not plan.options.compile:
        return []
    notes = []
    for gpu in sorted({cluster.device(d).gpu for d in plan.devices}):
        ratio = profiles.params_for(gpu).compiled_layer_ratio
        if ratio > 0:
            notes.append(f"options.compile: {gpu} layers priced at {ratio:.3f} x their eager time (measured "
                         f"compiled/eager ratio, {profiles.terms_of(gpu)})")
        else:
            notes.append(f"options.compile: no measured compiled/eager ratio for {gpu} (run 'hexiscale calibrate' "
                         "on a CUDA host of that type): its step time is priced as eager, its memory as compiled")
    return notes
