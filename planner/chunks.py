"""Rectangles of logical tensors (torch-free): what a rank's shard or optimizer part covers, in the
coordinates of the full logical tensor, as a checkpoint stores it and a layout switch moves it
(:mod:`planner.state_layout`, :mod:`planner.state_move_plan`).

A :class:`Chunk` is ``offsets`` + ``sizes`` inside the logical tensor ``name``. A TP shard is one
chunk (:func:`shard_chunk`). A ZeRO-1 part (:mod:`executor.parallel.zero`) is a range ``[lo, hi)`` of the
concatenation of row-major flattened *views* (slices of local shards), so it becomes at most three
chunks per view (:func:`flat_chunks`): the rest of a first partial row, the whole rows, the start of
a last partial row. Worked example: a view of shape ``(4, 3)`` at logical offset ``(8, 0)``, flat
range ``[2, 10)``: row 0 columns 2-3 -> chunk ``(8, 2)+(1, 1)``; rows 1-2 -> ``(9, 0)+(2, 3)``;
row 3 column 0 -> ``(11, 0)+(1, 1)``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from planner.layout import ParamInfo, shard_range


@dataclass(frozen=True)
class Chunk:
    name: str
    offsets: tuple[int, ...]
    sizes: tuple[int, ...]

    @property
    def numel(self) -> int:
        return math.prod(self.sizes)


def view_chunk(info: ParamInfo, tp: int, tp_rank: int, dim: int | None, start: int, length: int) -> Chunk:
    """``length`` elements from ``start`` along ``dim`` of TP rank ``tp_rank``'s shard of ``info``
    (``dim`` None: the whole, replicated tensor), in logical coordinates."""
    if dim is None:
        return Chunk(info.name, (0,) * len(info.shape), info.shape)
    lo, _ = shard_range(info.shape[dim], tp, tp_rank)
    offsets = [0] * len(info.shape)
    sizes = list(info.shape)
    offsets[dim], sizes[dim] = lo + start, length
    return Chunk(info.name, tuple(offsets), tuple(sizes))


def shard_chunk(info: ParamInfo, tp: int, tp_rank: int) -> Chunk:
    """The part of ``info`` that TP rank ``tp_rank`` of ``tp`` holds (all of it if replicated)."""
    if info.shard_dim is None:
        return view_chunk(info, tp, tp_rank, None, 0, 0)
    size = info.shape[info.shard_dim] // tp
    return view_chunk(info, tp, tp_rank, info.shard_dim, 0, size)


def flat_chunks(view: Chunk, lo: int, hi: int) -> list[tuple[int, Chunk]]:
    """Rectangles covering elements ``[lo, hi)`` of ``view`` flattened row-major (1-D or 2-D), each
    with its first element's flat index; together they cover the range exactly, in order."""
    if not 0 <= lo <= hi <= view.numel:
        raise ValueError(f"range [{lo}, {hi}) is outside {view}")
    if lo == hi:
        return []
    if len(view.sizes) == 1:
        return [(lo, Chunk(view.name, (view.offsets[0] + lo,), (hi - lo,)))]
    if len(view.sizes) != 2:
        raise ValueError(f"{view.name}: only 1-D and 2-D tensors are chunked, got {len(view.sizes)}-D")
    cols = view.sizes[1]
    r0, c0 = divmod(lo, cols)
    r1, c1 = divmod(hi, cols)
    out: list[tuple[int, Chunk]] = []

    def add(row: int, col: int, rows: int, width: int) -> None:
        if rows > 0 and width > 0:
            out.append((row * cols + col, Chunk(view.name, (view.offsets[0] + row, view.offsets[1] + col),
                                                (rows, width))))

    if r0 == r1:
        add(r0, c0, 1, c1 - c0)
        return out
    if c0:
        add(r0, c0, 1, cols - c0)
        r0 += 1
    add(r0, 0, r1 - r0, cols)
    add(r1, 0, 1, c1)
    return out


def intersect(a: Chunk, b: Chunk) -> Chunk | None:
    """The common rectangle of ``a`` and ``b`` (same tensor), or None when they do not overlap."""
    lo = [max(x, y) for x, y in zip(a.offsets, b.offsets)]
    hi = [min(x + m, y + n) for x, m, y, n in zip(a.offsets, a.sizes, b.offsets, b.sizes)]
    if any(h <= low for low, h in zip(lo, hi)):
        return None
    return Chunk(a.name, tuple(lo), tuple(h - low for low, h in zip(lo, hi)))


def contains(outer: Chunk, inner: Chunk) -> bool:
    """Whether rectangle ``inner`` lies inside ``outer``."""
    return all(o <= i and i + n <= o + m
               for o, m, i, n in zip(outer.offsets, outer.sizes, inner.offsets, inner.sizes))
