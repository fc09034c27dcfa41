"""Compute measurements with the executor's own modules (what is profiled is what is run).

A TP-``t`` shard is simulated on one device by building the module with ``tp=t`` and no process group:
:class:`executor.parallel.tp_layers.ColumnParallelLinear` then holds ``out/t`` rows, ``RowParallelLinear`` ``in/t``
columns, attention ``heads/t`` query heads and ``kv_heads/t`` KV heads — exactly one rank's shapes — and
the TP collectives are skipped (they are measured separately, in :mod:`executor.profiler.comm`).
:func:`measure_layer` with a real TP ``group`` runs the same shard on one rank of ``t`` with its
all-reduces (:mod:`executor.profiler.live_tp` starts the ranks).

Per point the profiler records:

* layer: forward and backward seconds of one ``Block`` on one micro-batch ``[b, s, h]`` (parameter
  gradients accumulate as in training), the host's seconds to issue each (``forward_host_s``,
  ``backward_host_s``: a row whose host time reaches its time is launch-bound), the activation bytes
  the forward leaves alive for the backward (``allocated after forward - allocated before``), and the
  peak bytes above the parameters during forward + backward;
* embedding: the (vocab-sharded) embedding forward and its backward;
* head: final RMSNorm + LM head + vocab-parallel cross-entropy forward, and backward;
* optimizer: one AdamW step (fused on CUDA) over ``n`` layers' worth of fp32 parameters, ``seconds`` the
  larger of its device and host times (``device_s``, ``host_s``: the device's is host-free on CUDA);

Precision follows the engine: fp32 parameters (the master weights) with the forward under
``torch.autocast`` to the compute dtype on GPUs, fp32 on the CPU; the residual stream between layers
stays fp32 (a bf16 branch added to an fp32 residual); under autocast the linears run the engine's
cast-once path (:func:`engine_copies`; rows marked ``cast_once``).
* ceilings: a large bf16 GEMM's FLOP/s and a large device copy's bytes/s (read + write).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import replace
from functools import partial
from typing import Any, TypeVar

import torch
import torch.distributed as dist
from torch import nn

from executor.model.cast_once import WeightCopies
from executor.model.llama import Block, StageModule
from executor.parallel.tp_layers import ColumnParallelLinear, RowParallelLinear
from executor.profiler.timing import phase_times, synchronize, time_call
from executor.train.optim import OptimConfig, build_optimizer
from planner.model import ModelSpec

M = TypeVar("M", bound=nn.Module)
TORCH_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
TIME_KEYS = ("forward_s", "backward_s", "forward_host_s", "backward_host_s")  # a row's times (device, host)


def prepare(module: M, dtype: str, device: torch.device) -> M:
    """Put a module on ``device`` the way :class:`executor.train.engine.Engine` runs it: fp32 parameters (they
    are the master weights), random values (never zeros: zeros can run faster than real data)."""
    module.to(device=device, dtype=torch.float32)
    with torch.no_grad():
        for p in module.parameters():
            if p.dim() > 1:
                p.normal_(0.0, 0.02)
    return module


def engine_copies(module: nn.Module, dtype: str) -> Callable[[], None]:
    """What the engine does before each layer's forward under autocast, for ``module``'s linears: make
    their cast-once weight copies current (:mod:`executor.model.cast_once`; the first call copies, each
    later one checks the copies' stamp, as a stage does per layer and micro-batch). Returned as the
    call to make before every application of the module.

    Why: the :class:`~executor.train.engine.Engine` turns cast-once on, so every linear of a training
    step runs :class:`~executor.model.cast_once.CastOnceLinear` (a Python autograd function, forward
    and backward) on the step's one bf16 copy; a bare module runs ``F.linear`` under autocast's
    per-region casts instead. Timed that way, a layer misses the host time of 7 Python functions
    forward and backward (on a CPU under autocast, ~20 % of a small layer's host time), which a step
    pays wherever it is launch-bound (TP shards, packed rows). The engine runs cast-once since
    2026-11-27 01:25 UTC: the 4x H100 rows and step times of 01:15 were both the autocast path."""
    linears = [m for m in module.modules() if isinstance(m, (ColumnParallelLinear, RowParallelLinear))]
    copies, target = WeightCopies(), TORCH_DTYPES[dtype]
    return lambda: copies.refresh("profiled", linears, target)


def uses_autocast(dtype: str, device: torch.device) -> bool:
    """Whether the engine runs ``dtype`` on ``device`` under autocast (accelerators, bf16/fp16)."""
    return device.type != "cpu" and dtype != "fp32"


def autocast(dtype: str, device: torch.device) -> contextlib.AbstractContextManager[Any]:
    """The engine's precision: ``torch.autocast`` to bf16/fp16 on accelerators, plain fp32 on the CPU."""
    if not uses_autocast(dtype, device):
        return contextlib.nullcontext()
    return torch.autocast(device.type, dtype=TORCH_DTYPES[dtype])


def _rope(model: ModelSpec, seq_len: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    from executor.model.llama import rope_tables

    return rope_tables(seq_len, model.head_dim, model.rope_theta, device, model.rope_scaling)


def _mem(device: torch.device) -> int:
    return torch.cuda.memory_allocated(device) if device.type == "cuda" else 0


def _measure_fwd_bwd(fwd_fn: Callable[[], torch.Tensor], params: list[torch.Tensor], device: torch.device,
                     dtype: str, warmup: int, repeats: int,
                     before: Callable[[], object] | None = None) -> dict[str, Any]:
    """Time ``fwd_fn()`` (under the engine's autocast) then ``out.backward(grad)``; measure activation and
    peak memory of one pass. ``before`` runs ahead of every repetition, outside the timed region.
    ``forward_host_s``/``backward_host_s``: the host's seconds to issue each pass
    (:func:`executor.profiler.timing.phase_times`; near ``forward_s``/``backward_s``: launch-bound)."""
    state: dict[str, Any] = {}

    def forward() -> torch.Tensor:
        with autocast(dtype, device):
            return fwd_fn()


    def step(mark: Callable[[int], None]) -> None:
        if before is not None:
            before()
        mark(0)
        out = forward()
        mark(1)
        grad = state.get("grad")
        if grad is None or grad.shape != out.shape:
            grad = state["grad"] = torch.randn_like(out)
        out.backward(grad)
        mark(2)

    times = phase_times(step, 2, device, warmup, repeats)
    result: dict[str, Any] = {"forward_s": times.device_s[0], "backward_s": times.device_s[1],
                              "forward_host_s": times.host_s[0], "backward_host_s": times.host_s[1]}
    if device.type == "cuda":
        synchronize(device)
        base = _mem(device)
        torch.cuda.reset_peak_memory_stats(device)
        out = forward()
        synchronize(device)
        result["activation_bytes"] = _mem(device) - base - out.numel() * out.element_size()
        out.backward(torch.randn_like(out))
        synchronize(device)
        result["peak_bytes"] = torch.cuda.max_memory_allocated(device) - base
        del out
    for p in params:
        p.grad = None
    return result


def measure_layer(model: ModelSpec, *, micro_batch: int, seq_len: int, tp: int, recompute: str, dtype: str,
                  device: torch.device, warmup: int, repeats: int, chain: int = 1, group: Any = None,
                  compiled: bool = False) -> dict[str, Any]:
    """One transformer layer (``Block``) on a TP-``tp`` shard, one micro-batch (``compiled``: the block
    ``torch.compile``'d as :func:`executor.model.fast_path.compile_blocks` does; the warm-up compiles it).

    ``group`` (a TP process group of ``tp`` ranks, every rank calling this with the same arguments):
    the shard runs with its real all-reduces, and every repetition starts with a one-element
    all-reduce on the group, so the ranks start each timed region together (this rank's figures;
    :mod:`executor.profiler.live_tp` keeps the slowest rank's).

    With ``chain = k > 1`` the block runs ``k`` times back to back (forward through all, then backward
    through all) and every figure is divided by ``k``: as inside a stage, the host queues the next
    layer's kernels while the device runs the current one, so the launch latency at the start of a
    timed region (the device idles until the first kernels arrive) is paid once per ``k`` layers
    instead of once per layer. Small, launch-bound shapes are otherwise over-estimated. The memory
    figures come from the chain too (``activation_bytes`` divided by ``k``): ``k`` layers' saved tensors,
    the inputs of all but the first, and ONE set of autocast weight casts (cached within the region);
    :mod:`planner.cost.measured` undoes that with the row's ``chain``."""
    spec = replace(model, seq_len=max(model.seq_len, seq_len))
    block = prepare(Block(spec, tp=tp, group=group, recompute=recompute, device=None), dtype, device)
    if compiled:
        block.compile(dynamic=False)
    cos, sin = _rope(spec, seq_len, device)
    x = torch.randn(micro_batch, seq_len, model.hidden_size, device=device, requires_grad=True)  # fp32 residual
    # the ranks start each repetition together (on the device too: the all-reduce precedes mark 0)
    before = None if group is None else partial(dist.all_reduce, torch.zeros(1, device=device), group=group)
    fresh = engine_copies(block, dtype) if uses_autocast(dtype, device) else (lambda: None)

    def forward() -> torch.Tensor:
        y = x
        for _ in range(chain):
            fresh()  # as the stage does before each layer (outside a compiled block)
            y = block(y, cos, sin)
        return y

    res = _measure_fwd_bwd(forward, [*block.parameters(), x], device, dtype, warmup, repeats, before)
    for key in (*TIME_KEYS, "activation_bytes"):
        if key in res:
            res[key] = res[key] / chain
    res["chain"] = chain
    if uses_autocast(dtype, device):
        res["cast_once"] = True  # no autocast weight casts among the activation bytes (planner.cost.measured)
    return res


def measure_embedding(model: ModelSpec, *, micro_batch: int, seq_len: int, tp: int, dtype: str,
                      device: torch.device, warmup: int, repeats: int) -> dict[str, Any]:
    """Vocab-parallel embedding of one TP rank (ids drawn inside its vocabulary slice)."""
    spec = replace(model, seq_len=max(model.seq_len, seq_len))
    stage = prepare(StageModule(spec, layers=(0, 0), first=True, last=False, tp=tp, tp_rank=0, group=None),
                    dtype, device)
    ids = torch.randint(0, model.vocab_size // tp, (micro_batch, seq_len), device=device)
    return _measure_fwd_bwd(lambda: stage(ids), list(stage.parameters()), device, dtype, warmup, repeats)


def measure_head(model: ModelSpec, *, micro_batch: int, seq_len: int, tp: int, dtype: str,
                 device: torch.device, warmup: int, repeats: int) -> dict[str, Any]:
    """Final norm + vocab-parallel LM head + cross-entropy of one TP rank (loss summed to a scalar)."""
    spec = replace(model, seq_len=max(model.seq_len, seq_len))
    stage = prepare(StageModule(spec, layers=(0, 0), first=False, last=True, tp=tp, tp_rank=0, group=None),
                    dtype, device)
    stage.cast_once = uses_autocast(dtype, device)  # as the engine runs the head (loss() refreshes the copy)
    hidden = torch.randn(micro_batch, seq_len, model.hidden_size, device=device, requires_grad=True)
    labels = torch.randint(0, model.vocab_size, (micro_batch, seq_len), device=device)
    scale = 1.0 / (micro_batch * seq_len)
    res = _measure_fwd_bwd(lambda: stage.loss(hidden, labels).sum() * scale, [*stage.parameters(), hidden],
                           device, dtype, warmup, repeats)
    if stage.cast_once:
        res["cast_once"] = True  # the head's copy was made in the warm-up, not in the measured forward
    return res


def measure_optimizer(model: ModelSpec, *, layers: int, tp: int, device: torch.device, warmup: int,
                      repeats: int) -> dict[str, Any]:
    """One AdamW step over ``layers`` layers of a TP-``tp`` shard (fp32 master weights and gradients)."""
    blocks = nn.ModuleList(Block(model, tp=tp, group=None, recompute="none", device=None) for _ in range(layers))
    blocks.to(device=device, dtype=torch.float32)
    named = list(blocks.named_parameters())
    for _, p in named:
        p.grad = torch.randn_like(p) * 1e-3
    opt = build_optimizer(named, OptimConfig(fused=True if device.type == "cuda" else None))

    def step(mark: Callable[[int], None]) -> None:
        mark(0)
        opt.step()
        mark(1)

    times = phase_times(step, 1, device, warmup, repeats)  # a step pays max(device, host), as for a pass
    return {"seconds": max(times.device_s[0], times.host_s[0]), "device_s": times.device_s[0],
            "host_s": times.host_s[0], "num_params": sum(p.numel() for _, p in named), "num_tensors": len(named)}


def measure_ceilings(device: torch.device, dtype: str, *, gemm_dim: int, copy_mib: int, warmup: int,
                     repeats: int) -> dict[str, Any]:
    """A square GEMM's FLOP/s in ``dtype`` and a device copy's bytes/s (read + write), on random data."""
    dt = TORCH_DTYPES[dtype]
    a = torch.randn(gemm_dim, gemm_dim, device=device, dtype=dt)
    b = torch.randn(gemm_dim, gemm_dim, device=device, dtype=dt)
    t_gemm = time_call(lambda: a @ b, device, warmup, repeats)
    n = copy_mib * 2**20 // 4
    src = torch.randn(n, device=device)
    dst = torch.empty_like(src)
    t_copy = time_call(lambda: dst.copy_(src), device, warmup, repeats)
    return {"gemm_dim": gemm_dim, "gemm_tflops": 2.0 * gemm_dim**3 / t_gemm / 1e12,
            "copy_bytes": 2 * n * 4, "copy_GBps": 2 * n * 4 / t_copy / 1e9}
