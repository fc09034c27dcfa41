"""``executor.switch.keep_local``: the state a process keeps across a switch is adopted by the new
engine where it stays in place (no byte copied), copied only where it changes place — one process,
two engines without groups, no exchange (the switch oracle covers the whole switch)."""

from __future__ import annotations

import pytest
import torch
from exec_jobs import ORACLE_OPTIM

from executor.state.state_pieces import NewState, held_tensors, narrow
from executor.switch.keep_local import keep
from executor.switch.state_move import holdings
from executor.train.engine import Engine
from planner.layout import build_topology
from planner.plan import Plan
from planner.state_layout import MOMENTS
from planner.state_move_plan import reshard_plan
from tests.support.random_plans import TINY, named_plan


def _dp(devices: list[str], zero: int) -> Plan:
    return named_plan(TINY, [(2, [([d], TINY.num_layers)]) for d in devices], zero=zero)


def _engine(plan: Plan, me: str, *, init: bool) -> Engine:
    return Engine(plan, build_topology(plan), None, rank=plan.devices.index(me), device=torch.device("cpu"),
                  optim=ORACLE_OPTIM, init=init)


def _trained_state(engine: Engine) -> None:
    """Moments of a few steps (random values), so that what is kept is told apart from zeros."""
    g = torch.Generator().manual_seed(engine.rank + 3)
    if engine.zero is not None:
        engine.zero.set_part_moments([{k: torch.rand(p.numel, generator=g) for k in MOMENTS}
                                      for p in engine.zero.parts], 3)
        return
    engine.set_optimizer_state({k: {n: torch.rand(p.shape, generator=g) for n, p in engine.params.items()}
                                for k in MOMENTS}, 3)


THREE, TWO = ["a:0", "a:1", "a:2"], ["a:0", "a:1"]


@pytest.mark.parametrize("before,after,zero,moments_in_place", [
    (THREE, TWO, 0, "all"),  # a:2 leaves; without ZeRO-1 every moment is whole too
    (THREE, TWO, 1, "none"),  # ZeRO-1: a:0's owned ranges grow (3 owners -> 2): its moments are copied
    (TWO, THREE, 1, "none"),  # a:2 joins: a:0's owned ranges shrink, copied (no larger old moment kept)
    (TWO, ["a:0", "a:2"], 1, "all"),  # a:1 hands over to a:2: a:0 owns the same ranges as before
    # a lone pipeline, no ZeRO-1: the weights' views of the old buckets adopted, and the moments of
    # the parameters whose every element a:0 owned (whole in its old part)
    (TWO, ["a:0"], 1, "some"),
])
def test_a_dp_change_copies_none_of_what_stays_in_place(before: list[str], after: list[str], zero: int,
                                                        moments_in_place: str) -> None:
    """a:0 keeps every weight where it was (TP 1, the same layers): adopted, not copied, and so are
    the moments that stay in place. The new engine holds the kept values, its weights in the old
    storage."""
    old, new = _dp(before, zero), _dp(after, zero)
    me = "a:0"
    rp = reshard_plan(old, new)
    old_state, new_state = holdings(rp, me)
    assert old_state is not None and new_state is not None
    engine = _engine(old, me, init=True)
    _trained_state(engine)
    held = held_tensors(engine, old_state)
    before = [t.clone() for t in held]
    into = NewState(new_state, _engine(new, me, init=False))
    local = rp.local(me)
    kept = keep(local, old=engine, held=held, src=old_state.holdings, new=into)

    weights = sum(p.nbytes for p in local if p.tensor.startswith("model/"))
    assert weights == sum(p.numel() for p in engine.params.values()) * 4 > 0
    moments = sum(p.nbytes for p in local) - weights
    assert moments > 0
    assert kept.adopted_bytes + kept.copied_bytes == weights + moments
    adopted = {"all": weights + moments, "none": weights}.get(moments_in_place)
    assert kept.adopted_bytes == adopted if adopted is not None else weights < kept.adopted_bytes < weights + moments
    after = held_tensors(into.engine, new_state)
    for p in local:
        src, dst = old_state.holdings[p.src_slot].chunk, new_state.holdings[p.dst_slot].chunk
        assert torch.equal(narrow(after[p.dst_slot], dst, p.chunk), narrow(before[p.src_slot], src, p.chunk)), p
    for n, w in into.engine.params.items():  # adopted: the old engine's storage, not a copy of it
        assert w.data_ptr() == engine.params[n].data_ptr(), n
    assert torch.equal(torch.cat([t.reshape(-1) for t in held]), torch.cat([t.reshape(-1) for t in before]))
