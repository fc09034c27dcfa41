"""The activation-memory formula against what the executor's layer really saves for its backward:
count the bytes of every tensor autograd saves while one ``executor.model.llama.Block`` runs forward
(parameters and buffers excluded: they are resident anyway), in fp32 and under bf16 autocast
(CPU autocast casts like CUDA autocast), for every recompute mode and TP shard shape."""

from __future__ import annotations

import pytest

from planner.cost.memory import head_activation_bytes, layer_activation_bytes
from planner.cost.params import CostParams
from planner.model import ModelSpec

torch = pytest.importorskip("torch")

MODEL = ModelSpec("t", 2, 256, 704, 8, 4, 512, 128)
CPU_EXECUTOR = CostParams(fused_rms_norm=False)  # these counts run on CPU: torch's RMSNorm composite


def _bytes_saved_for_backward(run, resident: list, autocast: bool) -> int:  # type: ignore[no-untyped-def]
    """Bytes of every distinct storage autograd saves while ``run()`` goes forward, ``resident``
    tensors (parameters, buffers, RoPE tables) excluded."""
    skip = {t.untyped_storage().data_ptr() for t in resident}
    seen: dict[int, int] = {}

    def pack(t):  # type: ignore[no-untyped-def]
        ptr = t.untyped_storage().data_ptr()
        if ptr not in skip:
            seen[ptr] = t.untyped_storage().nbytes()
        return t

    ctx = torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast)
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t), ctx:
        run()
    return sum(seen.values())


def _saved_bytes(tp: int, micro_batch: int, recompute: str, autocast: bool) -> int:
    from executor.model.llama import Block, rope_tables

    block = Block(MODEL, tp=tp, group=None, recompute=recompute, device=None)
    cos, sin = rope_tables(MODEL.seq_len, MODEL.head_dim, MODEL.rope_theta)
    x = torch.randn(micro_batch, MODEL.seq_len, MODEL.hidden_size, requires_grad=True)
    return _bytes_saved_for_backward(lambda: block(x, cos, sin), [*block.parameters(), cos, sin], autocast)


@pytest.mark.parametrize("recompute", ["none", "selective", "full"])
@pytest.mark.parametrize("tp", [1, 2])
@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_layer_activation_formula_matches_the_executor(recompute: str, tp: int, dtype: str) -> None:
    got = _saved_bytes(tp, 2, recompute, autocast=dtype == "bf16")
    want = layer_activation_bytes(MODEL, 2, tp, dtype, recompute, params=CPU_EXECUTOR)
    if dtype == "bf16" and recompute != "full":  # the bf16 weight casts, counted per micro-batch in flight
        want += (MODEL.layer_params() - 2 * MODEL.hidden_size) / tp * 2
    assert got == pytest.approx(want, rel=1e-9)


@pytest.mark.parametrize("tp", [1, 2])
@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_head_activation_formula_matches_the_executor(tp: int, dtype: str) -> None:
    from executor.model.llama import StageModule

    stage = StageModule(MODEL, layers=(0, 0), first=False, last=True, tp=tp, tp_rank=0, group=None)
    hidden = torch.randn(2, MODEL.seq_len, MODEL.hidden_size, requires_grad=True)
    labels = torch.randint(0, MODEL.vocab_size, (2, MODEL.seq_len))
    got = _bytes_saved_for_backward(lambda: stage.loss(hidden, labels).sum(),
                                    [*stage.parameters(), *stage.buffers()], dtype == "bf16")
    want = head_activation_bytes(MODEL, 2, tp, dtype, params=CPU_EXECUTOR)
    if dtype == "bf16":  # the bf16 cast of the LM head, per micro-batch in flight
        want += MODEL.vocab_size * MODEL.hidden_size / tp * 2
    assert got == pytest.approx(want, rel=1e-9)
