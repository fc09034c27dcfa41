"""The cost model reads what the profiler writes: run ``hexiscale profile`` (CPU mode, tiny shapes)
into a catalog entry, load it, and estimate a plan on a cluster of that device type."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from planner.catalog import Catalog, parse_device_entry
from planner.cluster import parse_cluster
from planner.cost import MeasuredProfile, ProfileSet, estimate
from planner.cost.measured_tables import LIGHTER, isotonic
from planner.model import PRESETS
from planner.plan import Pipeline, Plan, PlanOptions, Stage

pytestmark = pytest.mark.slow


def test_profiler_output_drives_the_cost_model(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    from executor.profiler.runner import ProfileConfig, run_profile

    model = PRESETS["tiny"]
    cfg = ProfileConfig(model=model, dtype="fp32", micro_batches=[1, 2], seq_lens=[model.seq_len], tps=[1, 2],
                        recompute_points=[(1, 1)], optimizer_layers=[1, 2], warmup=0, repeats=1, cpu=True,
                        gemm_dim=64, copy_mib=1)
    out = tmp_path / "cpu-test.json"
    run_profile(cfg, out, key="cpu-test", progress=False)
    entry = parse_device_entry(json.loads(out.read_text()))
    catalog = Catalog([entry])
    profiles = ProfileSet(catalog)
    prof = profiles.get("cpu-test")
    assert isinstance(prof, MeasuredProfile)

    rows = {(r["micro_batch"], r["tp"], r["recompute"]): r for r in entry.measured["layer"]}  # type: ignore[index]
    # the tables are the rows made monotone in tokens (isotonic: the rows themselves where they already are)
    fitted = {(mb, c.tp, c.recompute): (c.fwd[j], c.bwd[j]) for c in prof.tables.curves["layer"]
              for j, mb in enumerate(c.mbs)}
    for (tp, rc) in {(tp, rc) for _, tp, rc in rows}:
        mbs = sorted(mb for mb, t, r in rows if (t, r) == (tp, rc))
        raw = [(rows[(mb, tp, rc)]["forward_s"], rows[(mb, tp, rc)]["backward_s"]) for mb in mbs]
        assert [fitted[(mb, tp, rc)] for mb in mbs] == [
            tuple(isotonic([r[k] for r in raw])[i] for k in (0, 1)) for i in range(len(mbs))]
    for (mb, tp, rc) in rows:
        got = prof.layer_time(model, mb, tp, "fp32", rc)
        lighter = prof.layer_time(model, mb, tp, "fp32", LIGHTER[rc]) if rc != "none" else None
        assert got.forward_s == pytest.approx(max(fitted[(mb, tp, rc)][0], lighter.forward_s if lighter else 0.0))
        assert got.backward_s == pytest.approx(max(fitted[(mb, tp, rc)][1], lighter.backward_s if lighter else 0.0))
    assert prof.tables.optimizer_fit is not None

    cluster = parse_cluster({"nodes": [{"name": "c", "gpu": "cpu-test", "gpus": 3,
                                        "intra_link": {"kind": "other", "bandwidth_GBps": 5}}],
                             "inter_node": {"bandwidth_GBps": 1}}, catalog)
    plan = Plan(model, 4, (Pipeline(4, 2, (Stage(("c:0", "c:1"), 2, (0, 2)), Stage(("c:2",), 1, (2, 4)))),),
                PlanOptions(dtype="fp32"))
    est = estimate(plan, cluster, profiles)
    assert est.sources == {"cpu-test": "measured"}
    layer2 = prof.layer_time(model, 2, 2, "fp32").forward_s
    assert est.pipelines[0].stages[0].forward_s >= 2 * layer2
