"""planner.cost.wgrad_memory.deferred_wgrad_bytes against the executor: the bytes a deferring ``B``
leaves queued in the WeightGradStore until its ``W`` (every distinct storage of the queued inputs
and output gradients), on CPU in fp32 and under bf16 autocast (fp32 residual: the norm outputs cast
per linear), TP 1, for a whole stage with the head and for one without."""

from __future__ import annotations

import contextlib

import pytest
import torch
from exec_jobs import TINY

from executor.model.init import logical_init
from executor.model.llama import StageModule
from executor.parallel.weight_grad_store import WeightGradStore, install
from planner.cost.wgrad_memory import deferred_wgrad_bytes
from planner.layout import stage_params


def _queued_bytes(last: bool, dtype: str) -> int:
    layers = (0, TINY.num_layers)
    mod = StageModule(TINY, layers=layers, first=True, last=last, tp=1, tp_rank=0, group=None)
    dims = {p.name: p.shard_dim for p in stage_params(TINY, layers, True, last)}
    mod.load_logical(logical_init(TINY, 0, dims), dims)
    store = WeightGradStore()
    install(mod, store)
    tokens = torch.randint(0, TINY.vocab_size, (2, TINY.seq_len + 1), generator=torch.Generator().manual_seed(0))
    autocast = torch.autocast("cpu", dtype=torch.bfloat16) if dtype == "bf16" else contextlib.nullcontext()
    with autocast:  # as the schedule's runner: the forward and the loss
        out = mod(tokens[:, :-1])
        if last:
            out = mod.loss(out, tokens[:, 1:]).sum()
    with store.deferring(0):
        out.backward(torch.ones_like(out))
    storages = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes()
                for d in store._queues[0] for t in (d.x, d.dy)}
    return sum(storages.values())


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
@pytest.mark.parametrize("last", [True, False])
def test_deferred_bytes_are_what_the_store_queues(last: bool, dtype: str) -> None:
    predicted = deferred_wgrad_bytes(TINY, micro_batch=2, tp=1, dtype=dtype, layers=TINY.num_layers, last=last)
    assert _queued_bytes(last, dtype) == predicted
