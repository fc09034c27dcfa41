"""Cost-model side of the fidelity benchmarks (no torch): the two-GPU cluster, the measured device
types per MPS share, and the estimate of a plan with measured profiles and calibrated terms."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from planner.catalog import Catalog, default_catalog, parse_device_entry
from planner.cluster import ClusterSpec, parse_cluster
from planner.cost import ProfileSet, estimate
from planner.cost.params import CostParams
from planner.plan import Plan

NVLINK_NOMINAL_GBPS = 450.0  # H100 SXM NVLink 4: 900 GB/s bidirectional, 450 GB/s per direction


DEVICE_PREFIX = {"prefix": "h100-sxm"}  # "h200" for the runs the device pool placed on H200s


def device_key(sm: int, cpu: bool = False) -> str:
    if cpu:
        return "cpu-measured"
    pre = DEVICE_PREFIX["prefix"]
    return f"{pre}-measured" if sm >= 100 else f"{pre}-mps{sm}"


def catalog_with(profile_files: list[Path]) -> Catalog:
    """The default catalog plus (or overridden by) the given measured entries."""
    extra = [parse_device_entry(json.loads(Path(f).read_text())) for f in profile_files]
    keys = {e.key for e in extra}
    return Catalog([*(e for e in default_catalog().entries if e.key not in keys), *extra])


def pair_cluster(keys: tuple[str, str], catalog: Catalog, *, bandwidth_GBps: float = NVLINK_NOMINAL_GBPS,
                 latency_us: float = 10.0) -> ClusterSpec:
    """Two one-GPU nodes ``g0`` and ``g1`` joined by the machine's NVLink."""
    link = {"kind": "nvlink", "bandwidth_GBps": bandwidth_GBps, "latency_us": latency_us}
    data = {"name": "h100-pair", "inter_node": link,
            "nodes": [{"name": f"g{i}", "gpu": k, "gpus": 1, "intra_link": link} for i, k in enumerate(keys)]}
    return parse_cluster(data, catalog)


def predict(plan: Plan, cluster: ClusterSpec, params: CostParams) -> dict[str, Any]:
    est = estimate(plan, cluster, ProfileSet(cluster.catalog, params))
    return {"step_time_s": est.step_time_s, "memory_gib": est.memory_gib, "breakdown": est.breakdown,
            "bottleneck": est.bottleneck, "sources": est.sources}
