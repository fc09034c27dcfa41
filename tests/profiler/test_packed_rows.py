"""``hexiscale calibrate``'s packed rows (executor/profiler/packed.py): each total token count cut into
full-length to short documents (same tokens, falling ``Σs²``), each timed as one layer on one packed
row under the executor's packed attention, and the fit of :mod:`planner.calibration.packed` reads them."""

from __future__ import annotations

import torch

from executor.profiler.packed import SPLITS, measure_packed_layer, packed_kernel, packed_rows, row_totals
from planner.model import PRESETS


def test_rows_keep_each_total_and_vary_the_documents() -> None:
    rows = packed_rows(2048, (2048, 4096))
    assert len(rows) == 2 * len(SPLITS)
    assert sorted({sum(r) for r in rows}) == [2048, 4096] and max(max(r) for r in rows) == 2048
    for total in (2048, 4096):
        squares = [sum(x * x for x in r) for r in rows if sum(r) == total]
        assert squares == sorted(squares, reverse=True) and len(set(squares)) == len(SPLITS)
    assert packed_rows(24, (30,)) == [[24, 6], [12, 12, 6], [6] * 5, [3] * 10]


def test_row_totals_leave_the_launch_floor() -> None:
    """2K-token rows of llama-1.3b were launch-bound on H100 (the same row: 2.7 ms, then 4.6 ms):
    rows hold at least 4K tokens, and twice that, so the per-token term is told from the constants."""
    assert row_totals(2048) == (4096, 8192)
    assert row_totals(8192) == (8192, 16384)
    assert row_totals(64, min_tokens=64) == (64, 128)  # a CPU calibration keeps its rows small
    rows = packed_rows(2048, row_totals(2048))
    assert sorted({len(r) for r in rows}) == [2, 4, 8, 16, 32]  # documents per row: d is identifiable


def test_a_packed_layer_is_timed_on_cpu() -> None:
    assert packed_kernel("fp32", torch.device("cpu")) == "sdpa + document mask"
    model = PRESETS["tiny"]
    rows = packed_rows(model.seq_len, (model.seq_len,))[:2]
    out = measure_packed_layer(model, rows, dtype="fp32", device=torch.device("cpu"), warmup=1, repeats=1, chain=2)
    assert [r["lengths"] for r in out] == rows
    assert all(r["forward_s"] > 0 and r["backward_s"] > 0 for r in out)
    assert all(r["forward_host_s"] == r["forward_s"] and r["backward_host_s"] == r["backward_s"] for r in out)
