"""Split backward (executor.parallel.weight_grad_store), one process: a B that defers the linear layers'
weight gradients plus its W give the gradients, and the post-accumulate hooks, of a plain backward."""

from __future__ import annotations

import contextlib

import pytest
import torch
from exec_jobs import TINY
from torch.testing import assert_close

from executor.model.init import logical_init
from executor.model.llama import StageModule
from executor.parallel.weight_grad_store import WeightGradStore, install, store_linear
from planner.layout import stage_params


def _stage() -> StageModule:
    mod = StageModule(TINY, layers=(0, TINY.num_layers), first=True, last=True, tp=1, tp_rank=0, group=None)
    dims = {p.name: p.shard_dim for p in stage_params(TINY, (0, TINY.num_layers), True, True)}
    mod.load_logical(logical_init(TINY, 0, dims), dims)
    return mod


def _loss(mod: StageModule, tokens: torch.Tensor) -> torch.Tensor:
    return mod.loss(mod(tokens[:, :-1]), tokens[:, 1:]).mean()


def _count_hooks(mod: StageModule) -> dict[str, int]:
    counts = dict.fromkeys((n for n, _ in mod.named_parameters()), 0)
    for n, p in mod.named_parameters():
        p.register_post_accumulate_grad_hook(lambda _p, n=n: counts.__setitem__(n, counts[n] + 1))
    return counts


def test_deferred_weight_grads_equal_plain_backward_and_fire_hooks_once_per_micro_batch() -> None:
    gen = torch.Generator().manual_seed(0)
    micro = [torch.randint(0, TINY.vocab_size, (2, TINY.seq_len + 1), generator=gen) for _ in range(2)]
    plain, split = _stage(), _stage()
    for t in micro:
        _loss(plain, t).backward()
    counts = _count_hooks(split)
    store = WeightGradStore()
    assert install(split, store) == 7 * TINY.num_layers + 1  # q k v o gate up down per block, and the head
    for j, t in enumerate(micro):
        with store.deferring(j):
            _loss(split, t).backward()
    linear = {n for n, m in split.named_modules() if hasattr(m, "wgrad_store")}
    deferred = {n for n, p in split.named_parameters() if n.rsplit(".", 1)[0] in linear}
    # after the B ops: norms and the embedding have both micro-batches' gradients, linears none
    assert all(split.get_parameter(n).grad is None for n in deferred) and store.pending() == [0, 1]
    assert all(counts[n] == 2 for n in counts if n not in deferred)
    for j in (1, 0):  # W ops in any order
        store.run(j)
    assert counts == dict.fromkeys(counts, 2) and store.pending() == []
    for n, p in plain.named_parameters():
        assert_close(split.get_parameter(n).grad, p.grad, rtol=1e-6, atol=1e-7, msg=n)


def test_deferred_grads_under_autocast_match_f_linear() -> None:
    """bf16 autocast (CPU's here, CUDA's on the GPU suite): the operands are cast as F.linear's are,
    and the deferred dW reaches the fp32 weight as the plain path's does."""
    x0 = torch.randn(2, 5, 8)
    w = torch.nn.Parameter(torch.randn(6, 8))
    grads = []
    for store in (None, WeightGradStore()):
        x, w.grad = x0.clone().requires_grad_(), None
        with torch.autocast("cpu", dtype=torch.bfloat16):
            y = store_linear(x, w, store)
        assert y.dtype == torch.bfloat16
        with store.deferring(0) if store is not None else contextlib.nullcontext():
            y.float().square().sum().backward()
        if store is not None:
            store.run(0)
        assert w.grad is not None and w.grad.dtype == torch.float32 and x.grad is not None
        grads.append((x.grad, w.grad))
    assert_close(grads[1][0], grads[0][0], rtol=0, atol=0)
    assert_close(grads[1][1], grads[0][1], rtol=0, atol=0)


def test_store_linear_is_f_linear_and_backward_needs_a_deferral() -> None:
    x = torch.randn(3, 5, 4, requires_grad=True)
    w = torch.nn.Parameter(torch.randn(6, 4))
    store = WeightGradStore()
    y = store_linear(x, w, store)
    assert_close(y, torch.nn.functional.linear(x, w))
    with pytest.raises(RuntimeError, match=r"inside store\.deferring"):
        y.sum().backward()
    with store.deferring(0), pytest.raises(RuntimeError, match="already being deferred"):
        with store.deferring(1):
            pass


def test_deferring_linear_multiplies_with_the_cast_once_copy_instead_of_a_cast_per_micro_batch() -> None:
    """Under autocast the weight operand saved for the backward is the stage's cast-once copy (one per
    step, as 1F1B's linears keep) rather than a fresh cast per micro-batch; the results are bit-equal."""
    x0, w = torch.randn(2, 5, 8), torch.nn.Parameter(torch.randn(6, 8))
    lowp = w.detach().to(torch.bfloat16)
    results = []
    for copy in (None, lowp):
        store, saved = WeightGradStore(), []
        x, w.grad = x0.clone().requires_grad_(), None
        with torch.autograd.graph.saved_tensors_hooks(lambda t, saved=saved: saved.append(t) or t, lambda t: t):
            with torch.autocast("cpu", dtype=torch.bfloat16):
                y = store_linear(x, w, store, copy)
        with store.deferring(0):
            y.float().square().sum().backward()
        store.run(0)
        weight_operands = [t for t in saved if t.shape == w.shape]
        assert len(weight_operands) == 1
        assert (weight_operands[0].data_ptr() == lowp.data_ptr()) == (copy is not None)
        results.append((y, x.grad, w.grad))
    for a, b in zip(*results):
        assert_close(a, b, rtol=0, atol=0)
