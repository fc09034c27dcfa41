"""Weight gradients accumulated inside the weight-gradient GEMM (executor.model.cast_once.hand_over_grads),
under CPU bf16 autocast (the GPU path's numerics), through the schedule interpreter:

* with the fp32 GEMM (``out_dtype``, emulated here: CPU builds lack it, so a dispatch mode computes
  ``mm.dtype`` and ``addmm.dtype`` in fp32 and counts the ops) no separate ``add_`` lands in a
  linear's gradient: micro-batches 2..M add inside their GEMM, and the gradients equal those of
  the plain path (``.grad`` accumulated by autograd) bit for bit;
* a schedule that keeps micro-batches in flight (GPipe) leaves accumulation to autograd;
* compiled blocks (``aot_eager``) trace the handed-over sums without a graph break and train
  exactly like eager: with the bf16 product, and with the fp32 GEMM (CUDA's ``out_dtype`` kernels
  registered for CPU here, so Dynamo traces the very calls it traces on a GPU; on torch 2.11 a
  bare ``torch.addmm(..., out_dtype=...)`` fails in fake-tensor tracing, see
  executor.model.fp32_addmm)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import torch
from exec_jobs import TINY, global_batches, make_plan
from torch._dynamo.utils import counters
from torch.utils._python_dispatch import TorchDispatchMode

from executor.model import cast_once, fast_path
from executor.model.init import logical_init
from executor.model.llama import StageModule
from executor.parallel.p2p import StageComm
from executor.parallel.schedules import MicroBatch, run_schedule
from executor.parallel.tp_layers import ColumnParallelLinear, RowParallelLinear
from planner.layout import build_topology, stage_params

aten = torch.ops.aten
MICRO = 3


class Fp32Gemm(TorchDispatchMode):
    """CUDA's ``out_dtype`` GEMMs on CPU (fp32 products of the bf16 operands), counting every
    in-place add by the data pointer it writes."""

    def __init__(self) -> None:
        super().__init__()
        self.adds: list[int] = []
        self.fused = 0

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        if func is aten.mm.dtype:
            return torch.mm(args[0].float(), args[1].float())
        if func is aten.addmm.dtype:
            self.fused += 1
            return args[0] + torch.mm(args[1].float(), args[2].float())
        if func is aten.add_.Tensor:
            self.adds.append(args[0].data_ptr())
        return func(*args, **kwargs)


@pytest.fixture
def cuda_gemms_on_cpu() -> Iterator[list[int]]:
    """CUDA's ``mm.dtype`` and ``addmm.dtype`` kernels emulated on CPU (fp32 products of the bf16
    operands, as in :class:`Fp32Gemm`), below the dispatcher where compiled graphs reach them too;
    yields a list that grows by one per ``addmm.dtype`` call (a sum added inside a GEMM)."""
    fused: list[int] = []

    def mm(a: torch.Tensor, b: torch.Tensor, out_dtype: torch.dtype) -> torch.Tensor:
        with torch.autocast("cpu", enabled=False):  # a kernel: autocast is above it
            return torch.mm(a.to(out_dtype), b.to(out_dtype))

    def addmm(acc: torch.Tensor, a: torch.Tensor, b: torch.Tensor, out_dtype: torch.dtype, *,
              beta: float = 1, alpha: float = 1) -> torch.Tensor:
        assert beta == 1 and alpha == 1
        fused.append(1)
        return acc + mm(a, b, out_dtype)

    lib = torch.library.Library("aten", "IMPL")
    lib.impl("mm.dtype", mm, "CPU")
    lib.impl("addmm.dtype", addmm, "CPU")
    cast_once.fp32_wgrad_supported.cache_clear()
    try:
        yield fused
    finally:
        lib._destroy()
        cast_once.fp32_wgrad_supported.cache_clear()


def _stage() -> StageModule:
    layers = (0, TINY.num_layers)
    stage = StageModule(TINY, layers=layers, first=True, last=True, tp=1, tp_rank=0, group=None)
    dims = {p.name: p.shard_dim for p in stage_params(TINY, layers, True, True)}
    stage.load_logical(logical_init(TINY, 0, dims), dims)
    stage.cast_once = True
    return stage


def _linear_weights(stage: StageModule) -> list[torch.nn.Parameter]:
    return [m.weight for m in stage.modules() if isinstance(m, (ColumnParallelLinear, RowParallelLinear))]


def _run(stage: StageModule, schedule: str) -> dict[str, torch.Tensor]:
    """One step's forward and backward of MICRO micro-batches through the schedule interpreter."""
    plan = make_plan(TINY, [(2 * MICRO, MICRO, schedule, [(1, TINY.num_layers)])])
    topo = build_topology(plan)
    comm = StageComm(topo.stage_of(0), 0, None, device=torch.device("cpu"))
    tokens = global_batches(TINY, 2 * MICRO, 1, seed=4)[0]
    micro = [MicroBatch(inputs=t[:, :-1], labels=t[:, 1:]) for t in tokens.split(2)]
    run_schedule(schedule, module=stage, comm=comm, micro=micro, loss_scale=1e-3, n_stages=1,
                 autocast=lambda: torch.autocast("cpu", dtype=torch.bfloat16))
    return {n: p.grad.clone() for n, p in stage.named_parameters() if p.grad is not None}


def _by_hand(stage: StageModule) -> dict[str, torch.Tensor]:
    """The same micro-batches, each backward accumulated by autograd (no runner, no hand-over)."""
    tokens = global_batches(TINY, 2 * MICRO, 1, seed=4)[0]
    for t in tokens.split(2):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = stage.loss(stage(t[:, :-1]), t[:, 1:]).sum() * 1e-3
        loss.backward()
    return {n: p.grad.clone() for n, p in stage.named_parameters() if p.grad is not None}


def _grad_adds(mode: Fp32Gemm, stage: StageModule) -> int:
    ptrs = {w.grad.data_ptr() for w in _linear_weights(stage) if w.grad is not None}
    return sum(p in ptrs for p in mode.adds)


def test_no_separate_add_into_linear_gradients_and_same_bits(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cast_once, "fp32_wgrad_supported", lambda _device: True)
    stage, ref = _stage(), _stage()
    with Fp32Gemm() as mode:
        got = _run(stage, "1f1b")
    with Fp32Gemm() as ref_mode:
        want = _by_hand(ref)
    n = len(_linear_weights(stage))
    assert _grad_adds(ref_mode, ref) == (MICRO - 1) * n  # autograd's add per weight and later micro-batch
    assert _grad_adds(mode, stage) == 0 and mode.fused == (MICRO - 1) * n
    assert got.keys() == want.keys()
    for name in want:
        assert torch.equal(got[name], want[name]), name
    assert all(m.grad_acc is None for m in stage.modules() if hasattr(m, "grad_acc"))


def test_micro_batches_in_flight_leave_accumulation_to_autograd(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cast_once, "fp32_wgrad_supported", lambda _device: True)
    stage = _stage()
    with Fp32Gemm() as mode:
        _run(stage, "gpipe")
    assert mode.fused == 0 and _grad_adds(mode, stage) == (MICRO - 1) * len(_linear_weights(stage))


def test_compiled_blocks_take_the_sums_without_graph_break() -> None:
    torch._dynamo.reset()
    counters.clear()
    eager, compiled = _stage(), _stage()
    fast_path.compile_blocks(compiled, force=True, backend="aot_eager")
    ge, gc = _run(eager, "1f1b"), _run(compiled, "1f1b")
    assert dict(counters["graph_break"]) == {}
    assert counters["stats"]["unique_graphs"] == 4  # block and head, each without and with the sums
    assert ge.keys() == gc.keys()
    for name in ge:
        assert torch.equal(gc[name], ge[name]), name


def test_compiled_blocks_add_the_sums_inside_the_fp32_gemm(cuda_gemms_on_cpu: list[int]) -> None:
    torch._dynamo.reset()
    counters.clear()
    eager, compiled = _stage(), _stage()
    fast_path.compile_blocks(compiled, force=True, backend="aot_eager")
    ge = _run(eager, "1f1b")
    assert all(m.fp32_wgrad for m in eager.modules() if hasattr(m, "fp32_wgrad"))
    n_fused = len(cuda_gemms_on_cpu)
    assert n_fused == (MICRO - 1) * len(_linear_weights(eager))
    gc = _run(compiled, "1f1b")
    assert dict(counters["graph_break"]) == {}
    assert len(cuda_gemms_on_cpu) == 2 * n_fused
    assert ge.keys() == gc.keys()
    for name in ge:
        assert torch.equal(gc[name], ge[name]), name
