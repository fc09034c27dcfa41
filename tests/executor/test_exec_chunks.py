"""Chunk arithmetic of checkpoints (executor.chunks): shards and ZeRO-1 flat ranges as rectangles."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from executor.chunks import Chunk, flat_chunks, shard_chunk, view_chunk
from executor.topology import ParamInfo


def test_shards_and_views_in_logical_coordinates() -> None:
    col = ParamInfo("wq", (8, 6), 0)
    row = ParamInfo("wo", (6, 8), 1)
    norm = ParamInfo("norm", (6,), None)
    assert shard_chunk(col, 4, 3) == Chunk("wq", (6, 0), (2, 6))
    assert shard_chunk(row, 2, 1) == Chunk("wo", (0, 4), (6, 4))
    assert shard_chunk(norm, 4, 2) == Chunk("norm", (0,), (6,))
    assert view_chunk(row, 2, 1, 1, 1, 2) == Chunk("wo", (0, 5), (6, 2))  # columns 1-2 of rank 1's shard


def test_the_worked_example() -> None:
    view = Chunk("w", (8, 0), (4, 3))
    assert flat_chunks(view, 2, 10) == [(2, Chunk("w", (8, 2), (1, 1))), (3, Chunk("w", (9, 0), (2, 3))),
                                        (9, Chunk("w", (11, 0), (1, 1)))]


@settings(max_examples=300, deadline=None)
@given(rows=st.integers(1, 7), cols=st.integers(1, 7), r_off=st.integers(0, 5), c_off=st.integers(0, 5),
       data=st.data(), one_d=st.booleans())
def test_flat_ranges_become_exact_rectangles(rows: int, cols: int, r_off: int, c_off: int, data: st.DataObject,
                                             one_d: bool) -> None:
    view = Chunk("w", (r_off,), (rows * cols,)) if one_d else Chunk("w", (r_off, c_off), (rows, cols))
    lo = data.draw(st.integers(0, view.numel))
    hi = data.draw(st.integers(lo, view.numel))
    covered = []
    for first, c in flat_chunks(view, lo, hi):
        if one_d:
            flat = list(range(c.offsets[0] - r_off, c.offsets[0] - r_off + c.sizes[0]))
        else:
            flat = [(c.offsets[0] - r_off + i) * cols + (c.offsets[1] - c_off + j)
                    for i in range(c.sizes[0]) for j in range(c.sizes[1])]
        assert flat[0] == first and c.numel == len(flat)
        covered += flat
    assert covered == list(range(lo, hi))  # exactly the range, once, in order
    assert len(flat_chunks(view, lo, hi)) <= (1 if one_d else 3)
