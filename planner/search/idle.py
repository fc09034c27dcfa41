"""Which devices a plan leaves out, and why (:func:`idle_note`, printed by ``hexiscale plan --explain``).

The search may leave devices idle for four reasons, told apart here: the global batch times the
layer count cannot use them (:meth:`.planner.Search.usable`); the batch split gave the pipelines
holding them no samples (they would only slow the step); the fastest structure found does not
contain them (e.g. a node kind or group left out by :meth:`.planner.Search.leave_out`, behind a
slow link), in which case the note quotes the best step time found with every device; or no
structure that uses them all fits."""

from __future__ import annotations

import math
from collections.abc import Collection, Sequence

from planner.cluster import ClusterSpec
from planner.plan import Plan

LIST_NODES = 6


def device_list(cluster: ClusterSpec, ids: Sequence[str]) -> str:
    """``nv:0-3,6 (a100-sxm-80g), pc:0-7 (h100-pcie)``: devices grouped by node, runs collapsed; above
    ``LIST_NODES`` nodes, counts per GPU type and the first nodes (``128 rtx4090 on 32 nodes: ...``)."""
    by_node: dict[str, list[int]] = {}
    for d in ids:
        dev = cluster.device(d)
        by_node.setdefault(dev.node, []).append(dev.local_index)
    parts = []
    for node, idx in by_node.items():
        idx.sort()
        runs: list[str] = []
        start = prev = idx[0]
        for i in [*idx[1:], None]:
            if i is not None and i == prev + 1:
                prev = i
                continue
            runs.append(str(start) if start == prev else f"{start}-{prev}")
            if i is not None:
                start = prev = i
        parts.append(f"{node}:{','.join(runs)} ({cluster.node(node).gpu})")
    if len(parts) <= LIST_NODES:
        return ", ".join(parts)
    per_gpu: dict[str, tuple[int, set[str]]] = {}
    for d in ids:
        dev = cluster.device(d)
        n, nodes = per_gpu.get(dev.gpu, (0, set()))
        per_gpu[dev.gpu] = (n + 1, nodes | {dev.node})
    counts = ", ".join(f"{n} {gpu} on {len(nodes)} nodes" for gpu, (n, nodes) in per_gpu.items())
    return f"{counts} ({', '.join(parts[:3])}, ...)"


def idle_note(cluster: ClusterSpec, plan: Plan, *, structure: Collection[str], capped: bool, best_all_s: float,
              chosen_s: float, global_batch: int) -> str | None:
    """One line naming the devices ``plan`` does not use and why (None when it uses every one).
    ``structure``: the devices of the chosen structure (before pipelines without samples were
    dropped); ``capped``: the batch cap left units out; ``best_all_s``: the best surrogate step time
    of a structure using every device (inf: none fitted); ``chosen_s``: the chosen one's."""
    used = {d for p in plan.pipelines for s in p.stages for d in s.devices}
    idle = [d.id for d in cluster.devices if d.id not in used]
    if not idle:
        return None
    unfed = [d for d in idle if d in structure]
    rest = [d for d in idle if d not in structure]
    why = []
    if unfed:
        why.append(f"{device_list(cluster, unfed)}: the batch split gave their pipelines no samples (they would "
                   "slow the step)")
    if rest:
        if capped:
            reason = (f"global batch {global_batch} x {plan.model.num_layers} layers cannot use them all (at most "
                      "one stage per layer and one pipeline per sample)")
        elif math.isfinite(best_all_s):
            reason = (f"faster without them: the best plan found with every device takes {best_all_s:.4f} s per step "
                      f"under the search's cost model, this one {chosen_s:.4f} s")
        else:
            reason = "no structure found with every device fits in memory"
        why.append(f"{device_list(cluster, rest)}: {reason}")
    return f"left out {len(idle)} of {cluster.num_devices} devices: " + "; ".join(why)
