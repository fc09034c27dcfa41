"""The time of the engine's cast-once weight copies (executor/model/cast_once.py): made once per step
in each stage's first forward, (4 + e) bytes per matmul parameter at the memory bandwidth, whatever
the number of micro-batches; autocast's path (``CostParams.cast_once`` off, runs recorded before
2026-11-27 01:25 UTC) casts in every pass. Spec roofline and measured tables (rows marked
``cast_once`` were timed with the copies made beforehand: the copies are added once per step)."""

from __future__ import annotations

import dataclasses

import pytest
from _cost_fixtures import CATALOG, FAST, MODEL, cluster, plan

from planner.catalog import Catalog
from planner.cost import CostParams, ProfileSet, estimate, stage_time
from planner.layout import layer_numel

GPU_BOUND = CostParams(host_overhead_s=0.0, host_overhead_backward_s=0.0)  # no pass hides a copy
LAYERS = MODEL.num_layers
# one stage holding every layer and the LM head: its matmul parameters, copied in bf16 (e = 2)
MATMUL = LAYERS * layer_numel(MODEL)[0] + MODEL.hidden_size * MODEL.vocab_size
ONE_COPY = (4 + 2) * MATMUL / (FAST.memory_bandwidth_GBps * 1e9 * GPU_BOUND.memory_efficiency) + (
    LAYERS + 1) * GPU_BOUND.kernel_overhead_s  # one _foreach_copy_ per layer and one for the head


def cast_term(micro_batches: int, params: CostParams, catalog: Catalog | None = None) -> float:
    """A lone one-stage pipeline's time with the weight casts or copies less without any."""
    c = cluster([("a", "fast", 1, 100.0)])
    catalog = catalog or c.catalog
    p = plan([(micro_batches, micro_batches, [(["a:0"], LAYERS)])])
    with_casts = estimate(p, c, ProfileSet(catalog, params)).pipelines[0].time_s
    without = ProfileSet(catalog, dataclasses.replace(params, autocast_weight_copies=False))
    return with_casts - estimate(p, c, without).pipelines[0].time_s


def test_the_copies_are_priced_once_per_step_not_per_micro_batch() -> None:
    assert cast_term(1, GPU_BOUND) == pytest.approx(ONE_COPY, rel=1e-9)
    assert cast_term(8, GPU_BOUND) == pytest.approx(ONE_COPY, rel=1e-9)


def test_autocast_path_still_casts_in_every_pass() -> None:
    """Runs recorded before cast-once: each forward casts the weights (7 kernels a layer, 1 for the
    head) and each backward casts their gradients back, per micro-batch."""
    old = dataclasses.replace(GPU_BOUND, cast_once=False)
    per_pass = ONE_COPY + (7 * LAYERS + 1 - LAYERS - 1) * GPU_BOUND.kernel_overhead_s
    assert cast_term(1, old) == pytest.approx(2 * per_pass, rel=1e-9)
    assert cast_term(8, old) == pytest.approx(8 * 2 * per_pass, rel=1e-9)


def test_a_launch_bound_first_forward_hides_the_copy_in_idle_gpu_time() -> None:
    """Only issuing the copies (one launch per layer and the head) adds to a host-bound forward."""
    host_bound = dataclasses.replace(GPU_BOUND, host_overhead_s=1e-3, host_overhead_backward_s=1e-3)
    prof = ProfileSet(CATALOG, host_bound).get("fast")
    st = stage_time(MODEL, layers=LAYERS, first=True, last=True, micro_batch=1, tp=1, devices=[(prof, 1.0)],
                    tp_link=None, params=host_bound)
    assert st.copy_s == pytest.approx((LAYERS + 1) * 1e-3, rel=1e-9)


def test_cast_once_linears_keep_the_host_cost_of_the_casts_they_replace() -> None:
    """A launch-bound pass issues as many calls either way (a cast kernel or a ``CastOnceLinear``)."""
    host_bound = dataclasses.replace(GPU_BOUND, host_overhead_s=1e-3, host_overhead_backward_s=1e-3)
    now = ProfileSet(CATALOG, host_bound).get("fast").layer_time(MODEL, 1)
    before = ProfileSet(CATALOG, dataclasses.replace(host_bound, cast_once=False)).get("fast").layer_time(MODEL, 1)
    assert now.forward_s == pytest.approx(before.forward_s) and now.backward_s == pytest.approx(before.backward_s)


def _measured(cast_once: bool) -> Catalog:
    """FAST with layer and head rows timed on the cast-once path (or on autocast's)."""
    def rows(kind: str) -> list[dict]:
        return [{"micro_batch": mb, "seq_len": MODEL.seq_len, "tp": 1, "forward_s": 1e-3 * mb, "backward_s": 2e-3 * mb,
                 **({"recompute": "none"} if kind == "layer" else {}), **({"cast_once": True} if cast_once else {})}
                for mb in (1, 2)]
    measured = {"format": "hexiscale.measured/1", "meta": {"mode": "gpu"}, "model": MODEL.to_dict(), "dtype": "bf16",
                "layer": rows("layer"), "embedding": [], "head": rows("head"), "optimizer": []}
    return Catalog([dataclasses.replace(FAST, derived="measured", measured=measured)])


def test_tables_timed_with_the_copies_made_before_add_them_once_per_step() -> None:
    assert cast_term(1, GPU_BOUND, _measured(True)) == pytest.approx(ONE_COPY, rel=1e-9)
    assert cast_term(2, GPU_BOUND, _measured(True)) == pytest.approx(ONE_COPY, rel=1e-9)


def test_tables_timed_on_autocasts_path_hold_their_casts() -> None:
    """Their rows were timed with a cast in every pass: nothing is added on top."""
    assert cast_term(2, GPU_BOUND, _measured(False)) == pytest.approx(0.0, abs=1e-12)


def test_the_packed_path_prices_the_copies_once_per_step() -> None:
    """The varlen/packed pipeline cost (planner.varlen.seq_cost) adds them once, however many
    micro-batches (lists of document lengths) the step runs."""
    from planner.varlen.seq_cost import pipeline_costs

    c = cluster([("a", "fast", 1, 100.0)])
    p = plan([(4, 4, [(["a:0"], LAYERS)])])
    with_copies = pipeline_costs(p, c, profiles=ProfileSet(c.catalog, GPU_BOUND))[0]
    without = pipeline_costs(p, c, profiles=ProfileSet(c.catalog, dataclasses.replace(
        GPU_BOUND, autocast_weight_copies=False)))[0]
    for mbs in ([[MODEL.seq_len]], [[MODEL.seq_len]] * 4, [[64, 128], [256]] * 3):
        assert with_copies.time(mbs) - without.time(mbs) == pytest.approx(ONE_COPY, rel=1e-6)
