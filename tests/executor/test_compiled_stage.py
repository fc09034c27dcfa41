"""What compile_blocks compiles covers the element-wise work between the matrix products, the
issue-33 paths included: under CPU bf16 autocast (the GPU path's numerics), every block and the
last stage's head_loss (final norm, LM head, chunked cross-entropy) trace into graphs with no
graph break through the cast-once projections, and train exactly like eager (``aot_eager``: the
same graphs as Inductor's, without generating kernels, so it runs in seconds on CPU)."""

from __future__ import annotations

import torch
from torch._dynamo.utils import counters

from executor.model import fast_path
from executor.model.init import logical_init
from executor.model.llama import StageModule
from planner.layout import stage_params
from planner.model import PRESETS

MODEL = PRESETS["tiny"]


def _stage() -> StageModule:
    layers = (0, MODEL.num_layers)
    stage = StageModule(MODEL, layers=layers, first=True, last=True, tp=1, tp_rank=0, group=None)
    dims = {p.name: p.shard_dim for p in stage_params(MODEL, layers, True, True)}
    stage.load_logical(logical_init(MODEL, 0, dims), dims)
    stage.cast_once = stage.chunked_loss = True
    return stage


def _grads(stage: StageModule, tok: torch.Tensor) -> dict[str, torch.Tensor]:
    for _ in range(2):  # two micro-batches: the second reuses the cast-once copies
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = stage.loss(stage(tok[:, :-1]), tok[:, 1:]).mean()
        loss.backward()
    return {n: p.grad for n, p in stage.named_parameters() if p.grad is not None}


def test_compiled_blocks_and_head_have_no_graph_break_and_match_eager() -> None:
    torch._dynamo.reset()
    counters.clear()
    eager, compiled = _stage(), _stage()
    assert fast_path.compile_blocks(compiled, force=True, backend="aot_eager") == MODEL.num_layers
    tok = torch.randint(0, MODEL.vocab_size, (2, MODEL.seq_len + 1), generator=torch.Generator().manual_seed(5))
    ge, gc = _grads(eager, tok), _grads(compiled, tok)
    assert dict(counters["graph_break"]) == {}
    assert counters["stats"]["unique_graphs"] == 2  # one block graph for every block, one head graph
    assert ge.keys() == gc.keys() and len(ge) == len(list(eager.parameters()))
    for n in ge:
        torch.testing.assert_close(gc[n], ge[n], rtol=0, atol=0, msg=n)
