"""The split-backward memory rule: planner.schedules.held (what a ZB-H1 stage holds op by op) and
planner.cost.memory.stage_memory's peak from it (planner.cost.wgrad_memory). The bytes themselves
are counted against the executor's queue in tests/executor/test_wgrad_memory_count.py."""

from __future__ import annotations

import pytest

from planner.cost.memory import stage_memory
from planner.cost.schedule import held_with_grads, in_flight, split_backward_held
from planner.cost.wgrad_memory import deferred_wgrad_bytes
from planner.hf_config import resolve_model
from planner.schedules import StageOp, schedule_named
from planner.schedules.held import Held, held_moments


def test_moments_of_zb_h1_by_hand() -> None:
    ops = schedule_named("zb-h1").ops(2, 1, 3)  # F0 B0 F1 B1 W0 F2 B2 W1 W2
    held = held_moments(ops, False)
    assert [h.full for h in held] == [1, 1, 1, 1, 0, 1, 1, 0, 0]
    assert [h.deferred for h in held] == [0, 0, 1, 1, 2, 1, 1, 2, 1]
    assert [h.grads for h in held] == [False, False] + [True] * 7


def test_an_inlined_w_holds_nothing_deferred() -> None:
    ops = [StageOp("F", 0), StageOp("F", 1), StageOp("B", 0), StageOp("W", 0), StageOp("B", 1), StageOp("W", 1)]
    assert [(h.full, h.deferred) for h in held_moments(ops, True)] == [(1, 0), (2, 0), (2, 0), (1, 0), (1, 0), (0, 0)]
    # a later stage defers them: each micro-batch holds its queued operands through its W
    assert [(h.full, h.deferred) for h in held_moments(ops, False)] == [(1, 0), (2, 0), (2, 0), (1, 1), (1, 0), (0, 1)]


@pytest.mark.parametrize("stages,m", [(4, 8), (3, 5)])
def test_zb_h1_stage_i_peaks_at_s_minus_i_whole_and_i_deferred(stages: int, m: int) -> None:
    for i in range(stages):
        held = split_backward_held("zb-h1", stages, i, m)
        assert held is not None
        assert max(held, key=lambda h: (h.full, h.deferred, h.grads)) == Held(stages - i, i, True)
    assert split_backward_held("1f1b", stages, 0, m) is None
    assert split_backward_held("interleaved-1f1b", 4, 0, 8) is None


def test_zb_h1_charges_1f1b_plus_the_deferred_operands_of_the_held_back_w() -> None:
    """ZB-H1's stage i (m >= S) peaks with 1F1B's S - i micro-batches whole plus i queued ones:
    its activations are 1F1B's plus exactly i · D; the first stage (every W inlined) is 1F1B's."""
    model = resolve_model("llama-1.3b", 2048)
    stages, m, layers = 4, 8, [8, 8, 5, 3]
    for i, n in enumerate(layers):
        kw = dict(layers=n, tp=1, first=i == 0, last=i == stages - 1, micro_batch=2, dtype="bf16")
        base = stage_memory(model, in_flight=in_flight("1f1b", stages, i, m),
                            held_with_grads=held_with_grads("1f1b", stages, i, m), **kw)  # type: ignore[arg-type]
        zb = stage_memory(model, in_flight=in_flight("zb-h1", stages, i, m),
                          held=split_backward_held("zb-h1", stages, i, m), **kw)  # type: ignore[arg-type]
        d = deferred_wgrad_bytes(model, micro_batch=2, tp=1, dtype="bf16", layers=n, last=i == stages - 1)
        assert zb.gradients == base.gradients
        assert zb.activations == pytest.approx(base.activations + i * d, rel=1e-12)
