"""The step path of issue 33 on one CUDA GPU (skipped without one), eager and compiled blocks,
bf16 with the cast-once copies, 2 micro-batches per step through the Engine on one NCCL rank:

* weight gradients accumulated inside the weight-gradient GEMM (executor.model.cast_once.hand_over_grads)
  remove one ``aten::add_`` per linear weight and later micro-batch, and train like autograd's
  accumulation (same sums: fp32 rounding apart);
* the fused AdamW queued before the host read (Engine.apply_gradients, gated by ``found_inf``)
  leaves weights and AdamW state untouched on a non-finite step, which stops at that step.
CPU twins: tests/executor/test_gemm_accumulation.py, tests/executor/test_engine_host_read.py."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from executor.model import fast_path
from planner.model import ModelSpec
from planner.plan import Pipeline, Plan, PlanOptions, Stage

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

MODEL = ModelSpec("gpu-step", num_layers=2, hidden_size=256, ffn_hidden_size=512, num_heads=4, num_kv_heads=2,
                  vocab_size=512, seq_len=128)
MICRO = 2



def _engine(compiled: bool, **kw: Any) -> Any:
    from executor.parallel.groups import ProcessGroups
    from executor.train.engine import Engine
    from executor.train.optim import OptimConfig
    from planner.layout import build_topology

    pipe = Pipeline(batch_size=2 * MICRO, micro_batches=MICRO, stages=(Stage(("g:0",), 1, (0, MODEL.num_layers)),))
    plan = Plan(model=MODEL, global_batch_size=2 * MICRO, pipelines=(pipe,), options=PlanOptions(dtype="bf16"))
    topo = build_topology(plan)
    eng = Engine(plan, topo, ProcessGroups.create(topo), device=torch.device("cuda", 0),
                 optim=OptimConfig(lr=3e-3, warmup_steps=1, fused=True), seed=0, **kw)
    if compiled:
        fast_path.compile_blocks(eng.module)
    return eng


def _tokens(seed: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(0, MODEL.vocab_size, (2 * MICRO, MODEL.seq_len + 1), generator=gen).pin_memory()


def _add_calls(eng: Any, tokens: torch.Tensor) -> int:
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        eng.train_step(tokens)
    return sum(e.count for e in prof.key_averages() if e.key == "aten::add_")


@pytest.mark.usefixtures("nccl_rank")
@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
def test_gemm_accumulation_drops_the_adds_and_trains_alike(compiled: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    fused = _engine(compiled)
    n_linear = sum(1 for m in fused.module.modules() if hasattr(m, "grad_acc"))
    batches = [_tokens(k) for k in range(4)]
    fused.train_step(batches[0])  # warm-up (compilation)
    adds = _add_calls(fused, batches[1])
    new = [fused.train_step(t).loss for t in batches[2:]]
    monkeypatch.setattr("executor.model.llama.hand_over_grads", lambda _layers: None)
    plain = _engine(compiled)
    plain.train_step(batches[0])
    plain_adds = _add_calls(plain, batches[1])
    old = [plain.train_step(t).loss for t in batches[2:]]
    assert plain_adds - adds == (MICRO - 1) * n_linear, (plain_adds, adds)
    torch.testing.assert_close(torch.tensor(new), torch.tensor(old), rtol=1e-3, atol=1e-3)


@pytest.mark.usefixtures("nccl_rank")
def test_nonfinite_step_stops_with_the_queued_update_gated() -> None:
    from executor.train.nonfinite import NonFiniteStep

    eng = _engine(False)
    eng.train_step(_tokens(0))
    before = [p.detach().clone() for p in eng.params.values()]
    moments = [t.clone() for st in eng.optimizer.state.values() for t in st.values()]
    handle = next(iter(eng.params.values())).register_hook(lambda g: g * float("nan"))
    with pytest.raises(NonFiniteStep):
        eng.train_step(_tokens(1))
    handle.remove()
    assert all(torch.equal(a, p) for a, p in zip(before, eng.params.values()))
    assert all(torch.equal(a, b) for a, b in zip(moments, [t for st in eng.optimizer.state.values()
                                                          for t in st.values()]))
