"""``executor.state.state_pieces.narrow``: the rectangle view every switch copy goes through."""

from __future__ import annotations

import pytest
import torch

from executor.state.state_pieces import narrow
from planner.chunks import Chunk


def _by_narrow(t: torch.Tensor, base: Chunk, part: Chunk) -> torch.Tensor:
    for d, (o, b, n) in enumerate(zip(part.offsets, base.offsets, part.sizes)):
        t = t.narrow(d, o - b, n)
    return t


@pytest.mark.parametrize("part", [((8, 16), (4, 4)), ((10, 20), (6, 12)), ((8, 16), (8, 16)), ((9, 31), (1, 1))])
def test_the_rectangle_is_the_view_of_one_narrow_per_dimension(part) -> None:  # type: ignore[no-untyped-def]
    full = torch.arange(40 * 64, dtype=torch.float32).view(40, 64)
    held = full[8:24, 16:48]  # a strided view holding rows 8..23, columns 16..47
    base = Chunk("w", (8, 16), (16, 32))
    rect = Chunk("w", *part)
    got, want = narrow(held, base, rect), _by_narrow(held, base, rect)
    assert got.shape == want.shape and got.stride() == want.stride()
    assert got.data_ptr() == want.data_ptr() and torch.equal(got, want)
    got.fill_(-1.0)  # a view: writes land in the held tensor
    assert torch.equal(want, torch.full_like(want, -1.0))


@pytest.mark.parametrize("part", [((7, 16), (2, 2)), ((8, 16), (17, 2)), ((20, 40), (4, 9))])
def test_a_rectangle_outside_the_held_one_is_refused(part) -> None:  # type: ignore[no-untyped-def]
    held = torch.zeros(16, 32)
    with pytest.raises(ValueError, match="does not lie in"):
        narrow(held, Chunk("w", (8, 16), (16, 32)), Chunk("w", *part))
