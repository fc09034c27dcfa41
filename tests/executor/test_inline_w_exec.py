"""A ZB-H1 ``B`` whose ``W`` is the very next op (planner.schedules.inline_w) runs the plain backward:
nothing reaches the WeightGradStore, and the gradients are bit-equal to deferring them (one
process; a one-stage pipeline, where every W follows its B, run by the schedule interpreter)."""

from __future__ import annotations

import contextlib
from typing import Any

import torch
from exec_jobs import TINY
from test_weight_grad_store import _stage

from executor.parallel.schedules import MicroBatch, _Runner, run_ops
from executor.parallel.weight_grad_store import WeightGradStore, install
from planner.schedules import schedule_named
from planner.schedules.inline_w import inline_w


class _NoPeers:
    """A one-stage pipeline's StageComm: no neighbour to send to or receive from."""

    def __getattr__(self, name: str) -> Any:
        return lambda *args: None


class _CountingStore(WeightGradStore):
    def __init__(self) -> None:
        super().__init__()
        self.puts = 0

    def put(self, weight: torch.nn.Parameter, x: torch.Tensor, dy: torch.Tensor) -> None:
        self.puts += 1
        super().put(weight, x, dy)


def _step(inline: frozenset[tuple[int, int]]) -> tuple[dict[str, torch.Tensor], int]:
    mod = _stage()
    gen = torch.Generator().manual_seed(1)
    micro = [MicroBatch(t[:, :-1], t[:, 1:]) for t in
             (torch.randint(0, TINY.vocab_size, (2, TINY.seq_len + 1), generator=gen) for _ in range(3))]
    ops = schedule_named("zb-h1").ops(1, 0, len(micro))
    store = _CountingStore()
    install(mod, store)
    run_ops(_Runner(mod, micro, 0.01, contextlib.nullcontext, wgrad=store, inline=inline),
            _NoPeers(), ops)  # type: ignore[arg-type]
    assert store.pending() == []
    return {n: p.grad for n, p in mod.named_parameters() if p.grad is not None}, store.puts


def test_inlined_w_computes_weight_grads_in_the_backward_bit_equal_to_deferring() -> None:
    ops = schedule_named("zb-h1").ops(1, 0, 3)
    fused = inline_w(ops, True)
    assert fused == {(0, 0), (1, 0), (2, 0)}
    deferred, puts = _step(frozenset())
    inlined, inline_puts = _step(fused)
    assert puts == 3 * (7 * TINY.num_layers + 1) and inline_puts == 0
    assert deferred.keys() == inlined.keys() and len(inlined) == sum(1 for _ in _stage().parameters())
    for n, g in deferred.items():
        torch.testing.assert_close(inlined[n], g, rtol=0, atol=0, msg=n)
