"""A process that joins a running job pays its one-off first-use costs before it reports ready, so
that the switch it joins in (:mod:`executor.switch.elastic_switch`) does not.

What a fresh process pays the first time it trains, and on 4x H200 inside the joiner's engine build
(2.5 s with no warm-up; 1.2 s after a warm-up that built an optimizer and ran an 8x8 matmul and its
backward; 0.19-0.25 s on the staying ranks, whose process had trained already):

* the first optimizer a process builds imports torch's compiler stack (2 s on the CI machine);
* building a stage's attention runs the SDPA backend probe of
  :func:`executor.model.fast_path.attention_backends` (cached per device and head size; loads cuDNN);
* with CUDA's lazy module loading (torch turns it on unless ``CUDA_MODULE_LOADING`` says
  otherwise) each kernel's first launch loads it: the stage's bf16 autocast matmuls and their
  backward, SDPA, ``rms_norm``, RoPE, SiLU, the cross-entropy's reductions, the global norm
  (``_foreach_norm``), the clipping (``_foreach_mul_``) and the AdamW step (fused on CUDA);
* the library handles (cuBLAS, cuDNN), and the caching allocator's first large segments: the
  engine built before the switch holds the rank's new state (:class:`executor.state.state_pieces.NewState`),
  and the switch's receive buffers held it once more while it arrived (now only its strided
  pieces: the rest is received straight into the engine, :mod:`executor.switch.state_move`); a
  fresh process gets them from the device.

:func:`warm_up` runs each of these once: it allocates (and frees) one buffer of twice the rank's
state in the plan (:func:`planner.state_layout.rank_states`; the engine's state and, at most, a
joiner's receive buffers holding all of it live together), then builds this device's stage of the plan it joins with
one transformer block (the stage's own first/last role, TP shard shapes and recompute mode; a
stage's blocks all have the same shapes), fills the parameters with a constant, runs one forward
and backward of a micro-batch of the plan's largest shape under the plan's autocast, then the
engine's update: global norm, clipping, one AdamW step with the engine's settings
(:func:`executor.train.optim.for_device`); then the switch's own copies (``_foreach_copy_`` of
strided views, as the joiner unpacks its state). The TP collectives are off (``group=None``: the process has no
group yet), so the shapes are a TP rank's but nothing is communicated; token ids stay in the local
vocabulary slice.

Nothing leaks into the job: torch's random number generators (CPU and this device's) are restored
(:func:`torch.random.fork_rng`), and the module, its gradients and optimizer are freed on return.
Their memory stays cached by the allocator, for the engine's first large allocations to reuse; the
allocator returns free cached segments to the device before it reports out-of-memory, so the cache
cannot make a plan that fits fail. A warm-up that fails only logs why: the first step then pays.
"""

from __future__ import annotations

import logging
import time

import torch

from executor.model import fast_path
from executor.model.llama import StageModule
from executor.train.engine import compute_dtype
from executor.train.optim import OptimConfig, build_optimizer, clip_coefficient, for_device, lr_at, set_lr
from planner.layout import build_topology
from planner.plan import Plan
from planner.state_layout import rank_states

log = logging.getLogger("hexiscale.executor")


def warm_up(plan: Plan, device_id: str, device: torch.device, optim: OptimConfig) -> float | None:
    """One training step of one block of ``device_id``'s stage of ``plan`` on ``device``, then
    nothing of it kept but what the process caches (module docstring). Returns the seconds it
    took, or None if it failed (logged)."""
    t0 = time.perf_counter()
    cuda = [device.index if device.index is not None else torch.cuda.current_device()] if device.type == "cuda" else []
    try:
        with torch.random.fork_rng(devices=cuda, device_type=device.type), torch.enable_grad():
            _step(plan, device_id, device, optim)
    except Exception as exc:  # noqa: BLE001 - the warm-up only saves time; the job must not depend on it
        log.warning("warm-up failed on %s (%s: %s); its first step pays the one-off costs",
                    device_id, type(exc).__name__, exc)
        return None
    return time.perf_counter() - t0


def _step(plan: Plan, device_id: str, device: torch.device, optim: OptimConfig) -> None:
    m = plan.model
    rank = plan.devices.index(device_id)
    state_bytes = sum(h.numel for h in rank_states(plan)[rank].holdings) * 4
    torch.empty(2 * state_bytes, dtype=torch.uint8, device=device)  # freed at once, kept by the allocator
    stage = build_topology(plan).stage_of(rank)
    start, end = stage.layers
    module = StageModule(m, layers=(start, min(start + 1, end)), first=stage.is_first, last=stage.is_last,
                         tp=stage.tp, tp_rank=stage.ranks.index(rank), group=None, device=device,
                         recompute=plan.options.recompute, residual=plan.options.residual_dtype)
    params = list(module.named_parameters())
    with torch.no_grad():
        for _, p in params:
            p.fill_(0.02)
    rows, seq = max(plan.pipelines[stage.pipeline].micro_batch_sizes()), m.seq_len
    ids = torch.zeros(rows, seq, dtype=torch.long, device=device)  # in every TP rank's vocabulary slice
    x = ids if stage.is_first else torch.zeros(rows, seq, m.hidden_size, device=device, requires_grad=True)
    dtype = compute_dtype(plan.options.dtype, device)
    with torch.autocast(device.type, dtype=dtype, enabled=dtype is not None):
        out = module(x)
        if stage.is_last:
            out = module.loss(out, ids)
    (out.float().sum() / out.numel()).backward()
    grads = [p.grad for _, p in params if p.grad is not None]
    norm = torch.stack(torch._foreach_norm(grads)).float().pow(2).sum().sqrt()  # type: ignore[arg-type]
    torch._foreach_mul_(grads, clip_coefficient(norm, optim.grad_clip))  # type: ignore[arg-type]
    opt = build_optimizer(params, for_device(optim, device))
    set_lr(opt, lr_at(0, optim))
    opt.step()
    _switch_copies(device)
    float(norm)  # the engine's host read of the step's values; also waits for the device


def _switch_copies(device: torch.device) -> None:
    """The kernels of the switch's own copies, whose first launch loads them: ``_foreach_copy_`` of
    strided views into the new state and out of received buffers (:mod:`executor.switch.state_move`)."""
    grid = torch.zeros(8, 8, device=device)
    torch._foreach_copy_([grid[:, :4], grid[4:]], [torch.ones(8, 4, device=device), torch.ones(4, 8, device=device)])
    fast_path.synchronize(device)
