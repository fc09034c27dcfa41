"""The search's micro-batch choice follows measured activation memory (issue 33): where a device's
measured tables give the bytes a layer keeps, the search's memory check uses them, as the full
estimate does, so a GPU that keeps less than the formula lets the planner take the larger (faster)
micro-batch that fits."""

from __future__ import annotations

import dataclasses

from _cost_fixtures import FAST, MODEL

from planner.catalog import Catalog
from planner.cluster import parse_cluster
from planner.cost import ProfileSet, layer_activation_bytes
from planner.search import PlannerConfig, search

CONFIG = PlannerConfig(time_limit_s=20, micro_batch_sizes=(1, 2), recompute=("none",), zero=(0,),
                       schedules=("1f1b",), local_search=False, polish=False)
MODEL4K = dataclasses.replace(MODEL, seq_len=4096)  # activations outweigh the fixed terms
CAPACITY_GIB = 8.0  # formula: mb 1 fits, mb 2 does not; measured (0.3x the layer bytes): mb 2 fits


def _catalog(share: float) -> Catalog:
    """A measured device whose layers keep ``share`` of the formula's bytes; per sample, micro-batch
    2 runs faster than 1 (so it wins wherever it fits)."""
    rows = [{"micro_batch": mb, "seq_len": MODEL4K.seq_len, "tp": 1, "recompute": "none", "forward_s": t,
             "backward_s": 2 * t, "activation_bytes": share * layer_activation_bytes(MODEL4K, mb, 1, "bf16", "none")}
            for mb, t in ((1, 2e-3), (2, 3e-3))]
    measured = {"format": "hexiscale.measured/1", "meta": {"mode": "gpu"}, "model": MODEL4K.to_dict(), "dtype": "bf16",
                "layer": rows, "embedding": [], "head": [], "optimizer": []}
    return Catalog([dataclasses.replace(FAST, key="meas", derived="measured", measured=measured)])


def _micro_batch(share: float) -> int:
    catalog = _catalog(share)
    c = parse_cluster({"nodes": [{"name": "a", "gpu": "meas", "gpus": 1,
                                  "intra_link": {"kind": "nvlink", "bandwidth_GBps": 100}}],
                       "inter_node": {"bandwidth_GBps": 10}, "devices": {"a:0": {"memory_gib": CAPACITY_GIB}}},
                      catalog)
    res = search(c, MODEL4K, 4, config=CONFIG, profiles=ProfileSet(catalog))
    (pipe,) = res.plan.pipelines
    assert max(m.required_gib for m in res.estimate.memory.values()) <= CAPACITY_GIB
    return pipe.batch_size // pipe.micro_batches


def test_smaller_measured_activations_pick_the_larger_micro_batch() -> None:
    assert _micro_batch(0.3) == 2


def test_formula_sized_activations_keep_the_smaller_micro_batch() -> None:
    assert _micro_batch(1.0) == 1  # the same device keeping what the formula says: mb 2 does not fit
