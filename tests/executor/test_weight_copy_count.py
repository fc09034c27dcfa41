"""The compute-dtype weight copies a stage keeps with several micro-batches in flight, counted on
CPU under bf16 autocast with the engine's cast-once weights (``module.cast_once = True``, as
:class:`executor.train.engine.Engine` sets it; the GPU path's numerics), against
:func:`planner.cost.memory.stage_memory`: ONE copy of the stage's matmul weights, whatever the number
of micro-batches in flight, and every other live byte the model's per-micro-batch activations."""

from __future__ import annotations

import pytest
import torch
from exec_jobs import TINY
from live_storage import LiveStorage

from executor.model.cast_once import HasLowpWeight
from executor.model.init import logical_init
from executor.model.llama import StageModule
from executor.parallel.tp_layers import ColumnParallelLinear, RowParallelLinear
from planner.cost.memory import MemoryBreakdown, stage_memory
from planner.cost.params import CostParams
from planner.layout import stage_params

CPU_EXECUTOR = CostParams(fused_rms_norm=False)  # torch's RMSNorm composite on CPU
MICRO_BATCH = 2


def _in_flight_bytes(first: bool, recompute: str, in_flight: int) -> tuple[int, int]:
    """(every storage alive after ``in_flight`` forwards, held for their backward; of which the
    linears' bf16 copies), each forward in its own autocast region as the schedule's runner does."""
    layers = (0, TINY.num_layers)
    mod = StageModule(TINY, layers=layers, first=first, last=False, tp=1, tp_rank=0, group=None,
                      recompute=recompute)
    dims = {p.name: p.shard_dim for p in stage_params(TINY, layers, first, False)}
    mod.load_logical(logical_init(TINY, 0, dims), dims)
    mod.cast_once = True
    gen = torch.Generator().manual_seed(0)
    held = []
    # the module's own storages are older than the mode, which counts a view of them (the RoPE
    # tables' slices) as new: taken off below
    old = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in [*mod.parameters(), *mod.buffers()]}
    with LiveStorage() as live:
        for _ in range(in_flight):
            if first:
                x = torch.randint(0, TINY.vocab_size, (MICRO_BATCH, TINY.seq_len), generator=gen)
            else:
                x = torch.randn(MICRO_BATCH, TINY.seq_len, TINY.hidden_size, generator=gen, requires_grad=True)
            with torch.autocast("cpu", dtype=torch.bfloat16):
                held.append((x, mod(x)))
        linears: list[HasLowpWeight] = [m for m in mod.modules() if isinstance(m, (ColumnParallelLinear,
                                                                                   RowParallelLinear))]
        copies = {lp.untyped_storage().data_ptr(): lp.untyped_storage().nbytes()
                  for m in linears if (lp := m.weight_lp) is not None}
        seen_old = sum(n for p, n in old.items() if p in live._seen)
        return live.live - seen_old, sum(copies.values())


def _model(first: bool, recompute: str, in_flight: int) -> MemoryBreakdown:
    return stage_memory(TINY, layers=TINY.num_layers, tp=1, first=first, last=False, micro_batch=MICRO_BATCH,
                        in_flight=in_flight, dtype="bf16", recompute=recompute, params=CPU_EXECUTOR)


@pytest.mark.parametrize("in_flight", [2, 3, 4])
@pytest.mark.parametrize(("first", "recompute"), [(False, "none"), (True, "none"), (False, "selective")])
def test_one_weight_copy_per_stage_whatever_is_in_flight(first: bool, recompute: str, in_flight: int) -> None:
    live, copies = _in_flight_bytes(first, recompute, in_flight)
    want = _model(first, recompute, in_flight)
    assert copies > 0 and copies == want.weight_copies
    assert live == want.activations + want.weight_copies


def test_full_recompute_keeps_the_copies_and_the_layer_inputs() -> None:
    """The checkpointed layers save no copy of their own: the stage's one copy and each layer's input."""
    live, copies = _in_flight_bytes(False, "full", 3)
    want = _model(False, "full", 1)
    layer_inputs = 3 * (TINY.num_layers + 1) * MICRO_BATCH * TINY.seq_len * TINY.hidden_size * 4  # + the output
    assert copies == want.weight_copies
    assert live == layer_inputs + copies
