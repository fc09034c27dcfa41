"""Host-free measured rows (``"device_times": "full-queue"``, :mod:`planner.cost.pass_times`): the profiler
timed the device from a full queue and the host's issue time beside it, so a pass costs
``max(device, host)`` and splits into exactly those GPU and host shares (:mod:`planner.cost.measured`
rule 9). Rows without the mark price their own figure, as every calibration from before."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from planner.catalog import DeviceType, default_catalog
from planner.cost.measured import MeasuredProfile
from planner.model import PRESETS

MODEL = PRESETS["llama-1.3b"]
MS = 1e-3
# micro-batch: (forward device, forward host, backward device, backward host), ms
ROWS = {1: (0.5, 1.0, 0.8, 1.3), 2: (1.2, 1.0, 2.0, 1.3), 4: (2.4, 1.1, 4.1, 1.4)}


def _device(meta: dict[str, Any]) -> DeviceType:
    layer = [{"micro_batch": mb, "seq_len": MODEL.seq_len, "tp": 1, "recompute": "none", "forward_s": fd * MS,
              "forward_host_s": fh * MS, "backward_s": bd * MS, "backward_host_s": bh * MS}
             for mb, (fd, fh, bd, bh) in ROWS.items()]
    measured = {"format": "hexiscale.measured/1", "meta": meta, "dtype": "bf16", "model": MODEL.to_dict(),
                "layer": layer}
    return replace(default_catalog().get("h100-sxm-measured"), measured=measured)


FULL_QUEUE = _device({"device_times": "full-queue"})
OLD = _device({})


@pytest.mark.parametrize("mb", sorted(ROWS))
def test_a_host_free_row_prices_the_larger_of_its_device_and_host_times(mb: int) -> None:
    fd, fh, bd, bh = ROWS[mb]
    got = MeasuredProfile(FULL_QUEUE).layer_time(MODEL, mb)
    assert got.forward_s == pytest.approx(max(fd, fh) * MS) and got.backward_s == pytest.approx(max(bd, bh) * MS)


def test_a_launch_bound_row_splits_into_its_device_time_on_the_gpu_and_its_host_time_on_the_host() -> None:
    gpu, host = MeasuredProfile(FULL_QUEUE).pass_split("layer", MODEL, 1)
    assert (gpu.forward_s, host.forward_s) == pytest.approx((0.5 * MS, 1.0 * MS))
    assert (gpu.backward_s, host.backward_s) == pytest.approx((0.8 * MS, 1.3 * MS))


def test_a_device_bound_row_splits_into_its_device_and_host_times() -> None:
    gpu, host = MeasuredProfile(FULL_QUEUE).pass_split("layer", MODEL, 4)
    assert (gpu.forward_s, host.forward_s) == pytest.approx((2.4 * MS, 1.1 * MS))
    assert (gpu.backward_s, host.backward_s) == pytest.approx((4.1 * MS, 1.4 * MS))


def test_between_rows_the_split_stays_consistent_with_the_priced_time() -> None:
    prof = MeasuredProfile(FULL_QUEUE)
    t = prof.layer_time(MODEL, 3)
    gpu, host = prof.pass_split("layer", MODEL, 3)
    assert max(gpu.forward_s, host.forward_s) == pytest.approx(t.forward_s)
    assert max(gpu.backward_s, host.backward_s) == pytest.approx(t.backward_s)


def test_rows_without_the_mark_price_their_own_figure_as_before() -> None:
    got = MeasuredProfile(OLD).layer_time(MODEL, 1)
    assert (got.forward_s, got.backward_s) == pytest.approx((0.5 * MS, 0.8 * MS))


def test_carried_to_another_tp_the_host_time_follows_the_rooflines_host_not_its_gpu() -> None:
    prof = MeasuredProfile(FULL_QUEUE)
    roof1 = prof.roofline_split("layer", MODEL, 4, 1, "bf16", "none", MODEL.seq_len)
    roof2 = prof.roofline_split("layer", MODEL, 4, 2, "bf16", "none", MODEL.seq_len)
    gpu, host = prof.pass_split("layer", MODEL, 4, tp=2)
    fd, fh = ROWS[4][:2]
    assert host.forward_s == pytest.approx(fh * MS * roof2[1].forward_s / roof1[1].forward_s)
    assert roof2[0].forward_s < 0.7 * roof1[0].forward_s  # the GPU's share halves, the host's does not
    assert gpu.forward_s == pytest.approx(prof.layer_time(MODEL, 4, tp=2).forward_s)


def _compiled(prof_device: DeviceType, **ratios: float) -> MeasuredProfile:
    from planner.cost.params import DEFAULT_PARAMS

    return MeasuredProfile(prof_device, replace(DEFAULT_PARAMS, layers_compiled=True, **ratios))


@pytest.mark.parametrize("mb", sorted(ROWS))
def test_a_compiled_layer_scales_its_gpu_and_host_shares_by_their_own_ratios(mb: int) -> None:
    """Compiling cuts launches (host) more than GPU time: a launch-bound eager layer speeds up by the
    host's ratio until its GPU side bounds it, a GPU-bound one by the GPU's ratio."""
    fd, fh, bd, bh = ROWS[mb]
    got = _compiled(FULL_QUEUE, compiled_layer_ratio=0.75, compiled_device_ratio=0.8,
                    compiled_host_ratio=0.2).layer_time(MODEL, mb)
    assert got.forward_s == pytest.approx(max(0.8 * fd, 0.2 * fh) * MS)
    assert got.backward_s == pytest.approx(max(0.8 * bd, 0.2 * bh) * MS)


def test_a_compiled_layer_without_side_ratios_scales_the_pass_time_by_the_one_ratio() -> None:
    fd, fh, bd, bh = ROWS[1]
    for device, ratios in ((FULL_QUEUE, {"compiled_layer_ratio": 0.75}),
                           (OLD, {"compiled_layer_ratio": 0.75, "compiled_device_ratio": 0.8,
                                  "compiled_host_ratio": 0.2})):  # rows from before: one figure per pass
        got = _compiled(device, **ratios).layer_time(MODEL, 1)
        eager = MeasuredProfile(device).layer_time(MODEL, 1)
        assert got.forward_s == pytest.approx(0.75 * eager.forward_s)
        assert got.backward_s == pytest.approx(0.75 * eager.backward_s)
