"""Shared builders for the cost-model tests: a synthetic catalog with round numbers, so hand
computations stay simple, and small clusters/plans over it."""

from __future__ import annotations

from typing import Any

from planner.catalog import Catalog, DeviceType
from planner.cluster import ClusterSpec, parse_cluster
from planner.model import ModelSpec
from planner.plan import Pipeline, Plan, PlanOptions, Stage

FAST = DeviceType(key="fast", name="Fast GPU", memory_gib=80, peak_tflops={"bf16": 100.0, "fp32": 25.0},
                  memory_bandwidth_GBps=1000, source="test", derived="spec")
SLOW = DeviceType(key="slow", name="Slow GPU", memory_gib=24, peak_tflops={"bf16": 50.0, "fp32": 12.5},
                  memory_bandwidth_GBps=500, source="test", derived="spec")
CATALOG = Catalog([FAST, SLOW])

MODEL = ModelSpec("m", num_layers=8, hidden_size=1024, ffn_hidden_size=2816, num_heads=16, num_kv_heads=8,
                  vocab_size=8192, seq_len=512)


def cluster(nodes: list[tuple[str, str, int, float]], inter_bw: float = 10.0, inter_lat: float = 10.0,
            **extra: Any) -> ClusterSpec:
    """``nodes``: (name, gpu, gpus, intra-node GB/s), intra latency 2 us."""
    data: dict[str, Any] = {
        "name": "test",
        "nodes": [{"name": n, "gpu": g, "gpus": k, "intra_link": {"kind": "nvlink", "bandwidth_GBps": bw,
                                                                   "latency_us": 2}} for n, g, k, bw in nodes],
        "inter_node": {"kind": "infiniband", "bandwidth_GBps": inter_bw, "latency_us": inter_lat},
    }
    data.update(extra)
    return parse_cluster(data, CATALOG)


def plan(pipelines: list[tuple[int, int, list[tuple[list[str], int]]]], model: ModelSpec = MODEL,
         schedule: str = "1f1b", **options: Any) -> Plan:
    """``pipelines``: (batch, micro_batches, [(devices, n_layers), ...])."""
    pipes = []
    for batch, m, stages in pipelines:
        st, start = [], 0
        for devs, n in stages:
            st.append(Stage(tuple(devs), len(devs), (start, start + n)))
            start += n
        pipes.append(Pipeline(batch, m, tuple(st), schedule))
    return Plan(model, sum(p.batch_size for p in pipes), tuple(pipes), PlanOptions(**options))
