"""The TP all-reduces the cost model charges, against the ones the executor's layers issue:
record every ``dist.all_reduce`` (count and bytes) of a TP-2 layer, embedding and head run on CPU
with a stand-in process group, forward and backward, under bf16 autocast and in fp32."""

from __future__ import annotations

import pytest

from planner.cost.stage import tp_collectives
from planner.model import ModelSpec

torch = pytest.importorskip("torch")

MODEL = ModelSpec("t", 2, 256, 704, 8, 4, 512, 128)


def _recorded(monkeypatch: pytest.MonkeyPatch, run_forward, dtype: str) -> tuple[list[float], list[float]]:  # type: ignore[no-untyped-def]
    import executor.parallel.tp_layers as tpl

    calls: list[float] = []
    monkeypatch.setattr(tpl.dist, "all_reduce", lambda t, **kw: calls.append(float(t.numel() * t.element_size())))
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=dtype == "bf16"):
        out = run_forward()
    fwd = list(calls)
    calls.clear()
    out.float().sum().backward()
    return sorted(fwd), sorted(calls)


@pytest.mark.parametrize("recompute", ["none", "full"])
@pytest.mark.parametrize("dtype", ["bf16", "fp32"])
def test_layer_all_reduces(monkeypatch: pytest.MonkeyPatch, dtype: str, recompute: str) -> None:
    from executor.model.llama import Block, rope_tables

    block = Block(MODEL, tp=2, group=object(), recompute=recompute, device=None)
    cos, sin = rope_tables(MODEL.seq_len, MODEL.head_dim, MODEL.rope_theta)
    x = torch.randn(2, MODEL.seq_len, MODEL.hidden_size, requires_grad=True)
    got = _recorded(monkeypatch, lambda: block(x, cos, sin), dtype)
    fwd, bwd = tp_collectives(MODEL, layers=1, first=False, last=False, micro_batch=2, dtype=dtype,
                              recompute=recompute)
    assert got == (sorted(fwd), sorted(bwd))


@pytest.mark.parametrize("dtype", ["bf16", "fp32"])
def test_embedding_and_head_all_reduces(monkeypatch: pytest.MonkeyPatch, dtype: str) -> None:
    from executor.model.llama import StageModule

    group = object()
    first = StageModule(MODEL, layers=(0, 0), first=True, last=False, tp=2, tp_rank=0, group=group)
    ids = torch.randint(0, MODEL.vocab_size, (2, MODEL.seq_len))
    for p in first.parameters():
        torch.nn.init.normal_(p)
    got_first = _recorded(monkeypatch, lambda: first(ids), dtype)
    assert got_first == tuple(map(sorted, tp_collectives(MODEL, layers=0, first=True, last=False, micro_batch=2,
                                                         dtype=dtype, recompute="none")))
    last = StageModule(MODEL, layers=(0, 0), first=False, last=True, tp=2, tp_rank=0, group=group)
    for p in last.parameters():
        torch.nn.init.normal_(p, std=0.02)
    hidden = torch.randn(2, MODEL.seq_len, MODEL.hidden_size, requires_grad=True)
    labels = torch.randint(0, MODEL.vocab_size, (2, MODEL.seq_len))
    got_last = _recorded(monkeypatch, lambda: last.loss(hidden, labels), dtype)
    assert got_last == tuple(map(sorted, tp_collectives(MODEL, layers=0, first=False, last=True, micro_batch=2,
                                                        dtype=dtype, recompute="none")))
