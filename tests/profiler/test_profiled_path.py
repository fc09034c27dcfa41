"""What is profiled is what is run: under autocast the engine's linears multiply with cast-once copies
(:class:`executor.model.cast_once.CastOnceLinear`, a Python autograd function) and the profiler's layer
must run them too, not ``F.linear`` under autocast's casts (their Python host time shows wherever a
step is launch-bound: TP shards, packed rows). CPU autocast stands in for the GPU's here;
``tests/gpu/test_profiled_path_gpu.py`` checks the timed rows."""

from __future__ import annotations

import torch

from executor.model.llama import Block, rope_tables
from executor.profiler import compute
from planner.cost.measured_tables import _stage_bytes
from planner.layout import layer_numel
from planner.model import PRESETS


def _grad_fns(t: torch.Tensor) -> set[str]:
    seen, todo, out = set(), [t.grad_fn], set()
    while todo:
        fn = todo.pop()
        if fn is None or fn in seen:
            continue
        seen.add(fn)
        out.add(type(fn).__name__)
        todo.extend(f for f, _ in fn.next_functions)
    return out


def test_the_profiled_layer_runs_the_engines_cast_once_linears() -> None:
    model = PRESETS["tiny"]
    block = compute.prepare(Block(model, tp=1, group=None, recompute="none", device=None), "bf16",
                            torch.device("cpu"))
    cos, sin = rope_tables(model.seq_len, model.head_dim, model.rope_theta, torch.device("cpu"), None)
    x = torch.randn(1, model.seq_len, model.hidden_size, requires_grad=True)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        bare = block(x, cos, sin)
        fresh = compute.engine_copies(block, "bf16")
        fresh()
        fresh()  # later calls only check the copies' stamp, as a stage's per-layer refresh does
        engine = block(x, cos, sin)
    assert "CastOnceLinearBackward" not in _grad_fns(bare)
    assert "CastOnceLinearBackward" in _grad_fns(engine)
    assert block.attn.wq.weight_lp is not None and block.attn.wq.weight_lp.dtype == torch.bfloat16
    engine.sum().backward()
    assert block.mlp.w_down.weight.grad is not None and block.mlp.w_down.weight.grad.dtype == torch.float32
    assert compute.uses_autocast("bf16", torch.device("cuda", 0)) and not compute.uses_autocast(
        "bf16", torch.device("cpu")) and not compute.uses_autocast("fp32", torch.device("cuda", 0))


def test_cast_once_rows_hold_no_weight_casts() -> None:
    """A forward under cast-once allocates no autocast weight casts (the copies were made before), so
    the activation reading of such a row takes none out; an autocast row still loses one set per chain."""
    model = PRESETS["llama-1.3b"]
    row = {"micro_batch": 2, "seq_len": 2048, "tp": 2, "recompute": "none", "chain": 4, "activation_bytes": 4e8}
    casts = 2 * layer_numel(model)[0] / 2 / 4  # bf16 bytes of the shard's matmul weights, once per chain
    assert _stage_bytes("layer", {**row, "cast_once": True}, model, "bf16") - _stage_bytes(
        "layer", row, model, "bf16") == casts
