"""``executor.state.state_pieces``: the rectangle view every switch copy goes through, and the held
state read in place."""

from __future__ import annotations

import pytest
import torch
from exec_jobs import ORACLE_OPTIM

from executor.state.state_pieces import held_tensors, narrow
from executor.train.engine import Engine
from planner.chunks import Chunk
from planner.layout import build_topology
from planner.state_layout import MOMENTS, rank_states
from tests.support.random_plans import TINY, named_plan


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


def test_zero1_moments_are_held_as_views_of_the_live_state() -> None:
    """What the switch sends or keeps of ZeRO-1's moments is read in place, not from a concatenated
    copy of the rank's parts (2.7 GB of drain on the 4x H100 leave, benchmarks/README.md)."""
    plan = named_plan(TINY, [(2, [([d], TINY.num_layers)]) for d in ("a:0", "a:1", "a:2")], zero=1)
    engine = Engine(plan, build_topology(plan), None, rank=0, device=torch.device("cpu"), optim=ORACLE_OPTIM)
    assert engine.zero is not None
    engine.zero.set_part_moments([{k: torch.rand(p.numel) for k in MOMENTS} for p in engine.zero.parts], 3)
    state = rank_states(plan)[0]
    held = held_tensors(engine, state)
    live = {engine.optimizer.state[m][k].untyped_storage().data_ptr()
            for part in engine.zero.parts for m in part.masters for k in MOMENTS}
    moments = [(h, t) for h, t in zip(state.holdings, held) if h.part is not None]
    assert moments and all(t.untyped_storage().data_ptr() in live for _, t in moments)
    concatenated = engine.zero.part_moments()
    for h, t in moments:
        key = h.tensor.split("/")[1]
        assert torch.equal(t.reshape(-1), concatenated[h.part][key][h.at:h.at + h.numel]), h
