"""Shared helpers of the planner benchmarks: generated mixed clusters, the machine record, JSON out.

Not a test: the planner benchmarks are programs (``python -m benchmarks.planner.scaling`` etc.)
that print a table and write ``benchmarks/results/<name>_<date>.json``.
"""

from __future__ import annotations

import datetime as _dt
import importlib.metadata
import json
import os
import platform
import sys
from pathlib import Path
from typing import Any

from planner.cluster import ClusterSpec, parse_cluster

RESULTS = Path(__file__).resolve().parents[1] / "results"

# One 32-GPU "block" of the generated clusters: four GPU types, nodes of 8 and of 4.
BLOCK = (
    ("h100", "h100-sxm", 8, {"kind": "nvlink", "bandwidth_GBps": 450, "latency_us": 3}),
    ("a100", "a100-sxm-80g", 8, {"kind": "nvlink", "bandwidth_GBps": 300, "latency_us": 3}),
    ("r4090", "rtx4090", 4, {"kind": "pcie", "bandwidth_GBps": 20, "latency_us": 10}),
    ("r4090", "rtx4090", 4, {"kind": "pcie", "bandwidth_GBps": 20, "latency_us": 10}),
    ("l40s", "l40s", 4, {"kind": "pcie", "bandwidth_GBps": 24, "latency_us": 10}),
    ("l40s", "l40s", 4, {"kind": "pcie", "bandwidth_GBps": 24, "latency_us": 10}),
)
RACK_LINK = {"kind": "infiniband", "bandwidth_GBps": 25, "latency_us": 5}  # fast tier: inside a rack
SITE_LINK = {"kind": "ethernet", "bandwidth_GBps": 6.25, "latency_us": 30}  # slow tier: between racks
BLOCKS_PER_RACK = 4


def mixed_cluster(num_gpus: int) -> ClusterSpec:
    """``num_gpus`` (a multiple of 32) GPUs: blocks of 8x H100 + 8x A100 (NVLink nodes of 8),
    2x4 RTX 4090 + 2x4 L40S (PCIe nodes of 4); racks of 4 blocks (128 GPUs) on 25 GB/s InfiniBand,
    6.25 GB/s Ethernet between racks (two bandwidth tiers)."""
    if num_gpus % 32:
        raise ValueError("num_gpus must be a multiple of 32")
    nodes: list[dict[str, Any]] = []
    racks: dict[int, list[str]] = {}
    for b in range(num_gpus // 32):
        for i, (prefix, gpu, gpus, link) in enumerate(BLOCK):
            name = f"{prefix}-b{b}-{i}"
            nodes.append({"name": name, "gpu": gpu, "gpus": gpus, "intra_link": link})
            racks.setdefault(b // BLOCKS_PER_RACK, []).append(name)
    groups = [{"name": f"rack{r}", "nodes": members, "link": RACK_LINK} for r, members in racks.items()]
    data: dict[str, Any] = {"name": f"mixed-{num_gpus}", "nodes": nodes, "inter_node": SITE_LINK}
    if len(groups) > 1:
        data["groups"] = groups
    else:
        data["inter_node"] = RACK_LINK
    return parse_cluster(data)


def machine() -> dict[str, Any]:
    """Where and with what the benchmark ran."""
    versions = {}
    for pkg in ("networkx", "pymetis", "highspy", "scipy", "numpy"):
        try:
            versions[pkg] = importlib.metadata.version(pkg)
        except importlib.metadata.PackageNotFoundError:
            versions[pkg] = None
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {
        "hostname": platform.node(), "platform": platform.platform(), "cpu": cpu,
        "cpu_count": os.cpu_count(),
        "affinity": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
        "loadavg": os.getloadavg() if hasattr(os, "getloadavg") else None,
        "python": sys.version.split()[0], "versions": versions,
    }


def write_result(name: str, payload: dict[str, Any]) -> Path:
    """``benchmarks/results/<name>_<UTC date>.json`` with the machine record added."""
    RESULTS.mkdir(parents=True, exist_ok=True)
    now = _dt.datetime.now(_dt.timezone.utc)
    path = RESULTS / f"{name}_{now.strftime('%Y%m%dT%H%M%SZ')}.json"
    body = {"benchmark": name, "date": now.isoformat(timespec="seconds"), "machine": machine(), **payload}
    path.write_text(json.dumps(body, indent=2) + "\n")
    return path
