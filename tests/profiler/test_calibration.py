"""Calibration recovers known terms from synthetic measurements; the planner uses measured profiles."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from planner.calibration.fit import COMPUTE_TERMS, fit_compute, fit_link_efficiency, fit_terms
from planner.calibration.store import calibrated_profile_set, load_params, save_calibration
from planner.catalog import Catalog, default_catalog, parse_device_entry
from planner.cluster import parse_cluster
from planner.cost import ProfileSet, SpecProfile, estimate
from planner.cost.params import DEFAULT_PARAMS, CostParams
from planner.errors import SpecError
from planner.model import PRESETS
from planner.plan import Pipeline, Plan, Stage

MODEL = replace(PRESETS["llama-1.3b"], num_layers=4, seq_len=2048)
TRUE = replace(DEFAULT_PARAMS, gemm_efficiency=0.62, gemm_half_dim=180.0, attention_efficiency=0.45,
               attention_half_seq=700.0, memory_efficiency=0.55, kernel_overhead_s=7e-6)


def synthetic_entry(params: CostParams, key: str = "h100-synthetic") -> dict[str, Any]:
    """A measured catalog entry whose tables are the roofline under ``params`` (known answer), rows
    unmarked: timed on autocast's path, a weight cast in every pass."""
    base = default_catalog().get("h100-sxm")
    prof = SpecProfile(base, replace(params, cast_once=False))
    tables: dict[str, list[dict[str, Any]]] = {"layer": [], "embedding": [], "head": []}
    for tp in (1, 2):
        for seq in (512, 1024, 2048, 4096):
            for mb in (1, 2, 4):
                m = replace(MODEL, seq_len=max(MODEL.seq_len, seq))
                pt = prof.layer_time(m, mb, tp, "bf16", "none", seq)
                tables["layer"].append({"micro_batch": mb, "seq_len": seq, "tp": tp, "recompute": "none",
                                        "forward_s": pt.forward_s, "backward_s": pt.backward_s})
                for kind, fn in (("embedding", prof.embedding_time), ("head", prof.head_time)):
                    e = fn(m, mb, tp, "bf16", seq)
                    tables[kind].append({"micro_batch": mb, "seq_len": seq, "tp": tp,
                                         "forward_s": e.forward_s, "backward_s": e.backward_s})
    return {"key": key, "name": "synthetic", "memory_gib": 80, "peak_tflops": dict(base.peak_tflops),
            "memory_bandwidth_GBps": base.memory_bandwidth_GBps, "source": "test", "derived": "measured",
            "base": "h100-sxm",
            "measured": {"format": "hexiscale.measured/1", "meta": {}, "model": MODEL.to_dict(), "dtype": "bf16",
                         **tables, "optimizer": [{"layers": 1, "tp": 1, "seconds": 1e-3, "num_params": 5e7,
                                                  "num_tensors": 9}]}}


def test_fit_compute_recovers_known_terms() -> None:
    device = parse_device_entry(synthetic_entry(TRUE))
    res = fit_compute(device, DEFAULT_PARAMS)
    assert res.error_before["mean_abs_rel"] > 0.05  # the defaults are visibly off ...
    assert res.error_after["max_abs_rel"] < 0.01  # ... the fitted terms reproduce every point
    assert res.terms["gemm_efficiency"] == pytest.approx(TRUE.gemm_efficiency, rel=0.05)
    assert res.terms["memory_efficiency"] == pytest.approx(TRUE.memory_efficiency, rel=0.10)
    assert set(res.terms) == set(COMPUTE_TERMS)  # only named physical terms move
    untouched = {k: v for k, v in res.params.to_dict().items() if k not in COMPUTE_TERMS}
    assert untouched == {k: v for k, v in DEFAULT_PARAMS.to_dict().items() if k not in COMPUTE_TERMS}


def test_fit_terms_fits_only_what_it_is_told() -> None:
    # step time = 1 + (1 - overlap) * 2: the data say overlap = 0.25
    meas = [2.5]
    res = fit_terms(DEFAULT_PARAMS, {"dp_overlap": (0.0, 1.0)}, lambda p: [1 + (1 - p.dp_overlap) * 2], meas)
    assert res.terms["dp_overlap"] == pytest.approx(0.25, abs=1e-4)
    assert res.params.gemm_efficiency == DEFAULT_PARAMS.gemm_efficiency
    with pytest.raises(ValueError):
        fit_terms(DEFAULT_PARAMS, {"dp_overlap": (0.0, 1.0)}, lambda p: [1.0], [0.0])


def test_link_efficiency_from_the_sweep() -> None:
    comm = {"fit": {"p2p": {"latency_us": 10.0, "bandwidth_GBps": 360.0},
                    "allreduce": {"latency_us": 14.0, "bandwidth_GBps": 360.0}}}
    got = fit_link_efficiency(comm, 450.0)
    assert got["link_efficiency"] == pytest.approx(0.8)
    assert got["latency_us"] == pytest.approx(12.0)
    assert fit_link_efficiency({"fit": {"p2p": {"latency_us": 1, "bandwidth_GBps": 900}}}, 450)["link_efficiency"] == 1
    with pytest.raises(ValueError):
        fit_link_efficiency({"fit": {}}, 450.0)


def test_calibration_file_round_trip_and_errors(tmp_path: Path) -> None:
    p = tmp_path / "cal.json"
    params = replace(DEFAULT_PARAMS, gemm_efficiency=0.7, workspace_gib=1.25)
    save_calibration(p, params, fitted={"gemm_efficiency": 0.7}, fits={}, provenance={"test": True})
    assert load_params(p) == params
    data = json.loads(p.read_text())
    data["params"]["fudge"] = 1.8
    p.write_text(json.dumps(data))
    with pytest.raises(SpecError, match="fudge"):
        load_params(p)
    p.write_text("{")
    with pytest.raises(SpecError):
        load_params(p)
    assert calibrated_profile_set(path=tmp_path / "missing.json").params == DEFAULT_PARAMS


def test_planner_uses_a_measured_profile_when_one_exists() -> None:
    slow = replace(TRUE, gemm_efficiency=0.3)  # the "measured" device is slower than its spec roofline
    entry = parse_device_entry(synthetic_entry(slow))
    catalog = Catalog([*default_catalog().entries, entry])
    link = {"kind": "nvlink", "bandwidth_GBps": 450, "latency_us": 10}
    cluster = parse_cluster({"nodes": [{"name": "g", "gpu": entry.key, "gpus": 2, "intra_link": link}],
                             "inter_node": link}, catalog)
    plan = Plan(MODEL, 4, (Pipeline(4, 4, (Stage(("g:0",), 1, (0, 2)), Stage(("g:1",), 1, (2, 4)))),))
    measured = estimate(plan, cluster, ProfileSet(catalog))
    spec = estimate(plan, cluster, ProfileSet(catalog, prefer_measured=False))
    assert measured.sources == {entry.key: "measured"} and spec.sources == {entry.key: "spec"}
    assert measured.step_time_s > 1.3 * spec.step_time_s
    # the measured layer time is the table's value, not the roofline's
    row = next(r for r in entry.measured["layer"] if (r["micro_batch"], r["seq_len"], r["tp"]) == (1, 2048, 1))  # type: ignore[index]
    got = ProfileSet(catalog).get(entry.key).layer_time(MODEL, 1, 1, "bf16").forward_s
    assert got == pytest.approx(row["forward_s"])


def test_committed_measured_profiles_are_picked_up() -> None:
    """Every committed ``derived: measured`` entry with tables is served by a measured profile."""
    catalog = default_catalog()
    measured = [e for e in catalog.entries if e.derived == "measured" and e.measured]
    for e in measured:
        assert ProfileSet(catalog).get(e.key).source == "measured"
        assert e.measured.get("meta", {}).get("gpu_name")  # type: ignore[union-attr]


def test_a_term_pinned_by_its_ceiling_stays_there() -> None:
    """A measured ceiling below a term's range leaves it no room: it is set, not fitted (a zero-width
    box once let the solver move it anywhere in [lo, lo + 1])."""
    from planner.calibration.fit import fit_terms
    from planner.cost.params import DEFAULT_PARAMS

    res = fit_terms(DEFAULT_PARAMS, {"gemm_efficiency": (0.049, 0.049), "memory_efficiency": (0.05, 1.0)},
                    lambda p: [p.memory_efficiency * 2 + p.gemm_efficiency, p.memory_efficiency * 3], [1.0, 1.5])
    assert res.params.gemm_efficiency == 0.049 and res.terms["gemm_efficiency"] == 0.049
    assert 0.05 <= res.params.memory_efficiency <= 1.0
    only = fit_terms(DEFAULT_PARAMS, {"gemm_efficiency": (0.5, 0.5)}, lambda p: [p.gemm_efficiency], [0.5])
    assert only.params.gemm_efficiency == 0.5 and only.error_after["max_abs_rel"] < 1e-12
