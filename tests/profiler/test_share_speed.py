"""The judgement of tests/gpu/test_calibrate_share_gpu.py (tests/support/share_speed.py), held to the
figures of 4x H100, 2026-11-27 17:53 UTC: llama-1.3b at 1K tokens, one layer forward + backward, a 50 %
MPS share {1: 2.25, 2: 3.15, 4: 5.73} ms and the whole GPU {1: 2.88, 2: 3.83, 4: 3.78} ms per micro-batch.
The whole GPU's host times were not recorded then; the ones below say what those figures imply (slower
at 1 and 2 than at 4: launch-bound there) and are the test's assumption, not a measurement."""

from __future__ import annotations

import pytest

from tests.support.share_speed import LayerTime, layer_times, share_faults

MS = 1e-3
SHARE = {1: 2.25, 2: 3.15, 4: 5.73}
WHOLE = {1: 2.88, 2: 3.83, 4: 3.78}
HOST = {1: 2.80, 2: 3.70, 4: 2.90}  # launch-bound at 1 and 2 (>= 0.8x), device-bound at 4


def _times(seconds: dict[int, float], host: dict[int, float] | None = None) -> dict[int, LayerTime]:
    return {mb: LayerTime(s * MS, (host or seconds)[mb] * MS) for mb, s in seconds.items()}


def test_the_figures_of_2026_11_27_are_faults_where_the_whole_gpu_beat_its_own_share() -> None:
    faults = share_faults(_times(SHARE), _times(WHOLE, HOST))
    assert [f.split(":")[0] for f in faults] == ["micro-batch 1", "micro-batch 2"]  # 4 is 1.5x slower: sound
    assert all("over 10% faster" in f for f in faults)


def test_a_share_as_fast_as_the_launch_bound_whole_gpu_and_slower_where_it_is_device_bound_passes() -> None:
    assert share_faults(_times({1: 2.85, 2: 3.80, 4: 5.73}), _times(WHOLE, HOST)) == []


def test_a_device_bound_micro_batch_must_show_the_share_slower() -> None:
    faults = share_faults(_times({**SHARE, 1: 2.85, 2: 3.80, 4: 4.20}), _times(WHOLE, HOST))
    assert len(faults) == 1 and faults[0].startswith("micro-batch 4") and "device-bound" in faults[0]
    assert "not 1.2x slower" in faults[0]


def test_no_device_bound_micro_batch_proves_nothing() -> None:
    faults = share_faults(_times({1: 2.85, 2: 3.80, 4: 3.78}), _times(WHOLE))  # host == time everywhere
    assert len(faults) == 1 and "no micro-batch of [1, 2, 4] is device-bound" in faults[0]


def test_the_micro_batches_must_match() -> None:
    assert share_faults(_times({1: 2.85}), _times(WHOLE, HOST)) == [
        "the share's micro-batches [1] are not the whole GPU's [1, 2, 4]"]
    assert share_faults({}, {}) != []


def test_layer_times_read_the_single_gpu_layer_rows_with_their_host_times() -> None:
    row = {"micro_batch": 2, "tp": 1, "recompute": "none", "forward_s": 1.0, "backward_s": 2.0,
           "forward_host_s": 0.25, "backward_host_s": 0.5}
    entry = {"measured": {"layer": [row, {**row, "tp": 2}, {**row, "recompute": "full"},
                                    {**row, "micro_batch": 4, "collectives": True}]}}
    assert layer_times(entry) == {2: LayerTime(3.0, 0.75)}
    assert layer_times(entry)[2].device_bound
    old = {k: v for k, v in row.items() if not k.endswith("_host_s")}
    with pytest.raises(KeyError, match="forward_host_s"):
        layer_times({"measured": {"layer": [old]}})
