"""What an estimate says about ``options.compile``: compiled blocks are priced from a measured
compiled/eager layer-time ratio per GPU type (``CostParams.compiled_layer_ratio``, written by
``hexiscale calibrate``; on CUDA also per side, GPU and host, which a host-free row's split takes);
a type without one is priced as eager for time — no invented speed-up — and the estimate's notes say
which (the memory model counts the compiled path's activations either way, :mod:`planner.cost.memory`)."""

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
        params = profiles.params_for(gpu)
        ratio, dev, host = params.compiled_layer_ratio, params.compiled_device_ratio, params.compiled_host_ratio
        if ratio > 0 and dev > 0 and host > 0:
            notes.append(f"options.compile: {gpu} layers priced from their eager GPU and host times at {dev:.3f} x "
                         f"and {host:.3f} x (measured compiled/eager ratios per side, {profiles.terms_of(gpu)}; "
                         f"{ratio:.3f} x where the rows hold no host times)")
        elif ratio > 0:
            notes.append(f"options.compile: {gpu} layers priced at {ratio:.3f} x their eager time (measured "
                         f"compiled/eager ratio, {profiles.terms_of(gpu)})")
        else:
            notes.append(f"options.compile: no measured compiled/eager ratio for {gpu} (run 'hexiscale calibrate' "
                         "on a CUDA host of that type): its step time is priced as eager, its memory as compiled")
    return notes
