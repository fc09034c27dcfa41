"""Profiles obey physics, so timing noise cannot pick a plan: more recompute is never predicted
faster, more tokens never cheaper — on the committed measured profiles, on a deliberately noisy
table, and in what the planner then chooses."""

from __future__ import annotations

import itertools

import pytest

from planner.catalog import Catalog, default_catalog, parse_device_entry
from planner.cost import MeasuredProfile, ProfileSet
from planner.cost.measured_tables import isotonic
from planner.model import PRESETS

MODEL = PRESETS["llama-1.3b"]
GRID = list(itertools.product((1, 2, 4, 8), (1, 2, 4), (1024, 2048, 4096, 8192)))


def test_isotonic_pools_adjacent_violators() -> None:
    assert isotonic([1.0, 3.0, 2.0, 4.0]) == [1.0, 2.5, 2.5, 4.0]
    assert isotonic([5.0, 1.0, 1.0]) == pytest.approx([7 / 3] * 3)
    assert isotonic([1.0, 2.0]) == [1.0, 2.0]


@pytest.mark.parametrize("key", ["h100-sxm-measured", "h200-measured"])
def test_committed_profiles_obey_physics(key: str) -> None:
    prof = ProfileSet(default_catalog()).get(key)
    assert isinstance(prof, MeasuredProfile)
    for mb, tp, seq in GRID:
        t = {rc: prof.layer_time(MODEL, mb, tp, "bf16", rc, seq) for rc in ("none", "selective", "full")}
        assert t["none"].backward_s <= t["selective"].backward_s <= t["full"].backward_s, (mb, tp, seq)
        assert t["none"].forward_s <= t["selective"].forward_s <= t["full"].forward_s, (mb, tp, seq)
        if mb > 1:
            fewer = prof.layer_time(MODEL, mb // 2, tp, "bf16", "none", seq)
            assert fewer.forward_s <= t["none"].forward_s and fewer.backward_s <= t["none"].backward_s


def _noisy_entry() -> dict:
    """A measured table of the 1.3B layer with the noise real tables have: micro-batch 2 timed
    faster than 1, and selective recompute faster than none."""
    rows = [{"micro_batch": 1, "seq_len": 2048, "tp": 1, "recompute": "none", "forward_s": 0.010, "backward_s": 0.020},
            {"micro_batch": 2, "seq_len": 2048, "tp": 1, "recompute": "none", "forward_s": 0.009, "backward_s": 0.019},
            {"micro_batch": 4, "seq_len": 2048, "tp": 1, "recompute": "none", "forward_s": 0.040, "backward_s": 0.080},
            {"micro_batch": 1, "seq_len": 2048, "tp": 1, "recompute": "selective", "forward_s": 0.010,
             "backward_s": 0.015}]
    model = {k: getattr(MODEL, k) for k in ("name", "num_layers", "hidden_size", "ffn_hidden_size", "num_heads",
                                             "num_kv_heads", "vocab_size", "seq_len")}
    return {"key": "noisy", "name": "noisy test GPU", "memory_gib": 80, "peak_tflops": {"bf16": 989, "fp32": 67},
            "memory_bandwidth_GBps": 3350, "source": "test", "derived": "measured",
            "measured": {"format": "hexiscale.measured/1", "dtype": "bf16", "model": model, "layer": rows,
                         "embedding": [], "head": [], "optimizer": []}}


def test_noise_is_smoothed_before_anything_reads_it() -> None:
    prof = ProfileSet(Catalog([parse_device_entry(_noisy_entry())])).get("noisy")
    one, two = prof.layer_time(MODEL, 1, 1, "bf16", "none", 2048), prof.layer_time(MODEL, 2, 1, "bf16", "none", 2048)
    assert two.forward_s >= one.forward_s and two.backward_s >= one.backward_s  # pooled: 9.5 ms, 19.5 ms
    assert one.forward_s == pytest.approx(0.0095) and two.backward_s == pytest.approx(0.0195)
    sel = prof.layer_time(MODEL, 1, 1, "bf16", "selective", 2048)
    assert sel.backward_s >= one.backward_s  # measured 15 ms < none's 19.5 ms: raised to it


def test_the_planner_does_not_recompute_what_fits(tmp_path) -> None:
    """4 H200s, llama-1.3b at seq 2048, 16 samples: everything fits without recompute, and the
    H200 table's selective rows (measured at micro-batch 1 and 2 only) once extrapolated below the
    measured no-recompute forward at micro-batch 4, so the planner chose selective recompute."""
    from dataclasses import replace

    from planner.cluster import parse_cluster
    from planner.search import search

    link = {"kind": "nvlink", "bandwidth_GBps": 450, "latency_us": 10}
    cluster = parse_cluster({"name": "h200x4", "inter_node": link,
                             "nodes": [{"name": "g", "gpu": "h200-measured", "gpus": 4, "intra_link": link}]})
    plan = search(cluster, replace(MODEL, seq_len=2048), 16).plan
    assert plan.options.recompute == "none"
