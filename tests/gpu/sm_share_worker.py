"""One GPU process of the SM-share sweep (``tests/gpu/test_sm_shares.py``): a few bf16 training steps
of a Llama model through the Engine on one NCCL rank, under whatever MPS share
(``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE``) the parent set, printing one JSON line of what it saw.

``--diagnose`` also hooks every module's forward output and every gradient reaching a module's
inputs and names the first that is not finite (forward order, then backward order), so a failing
share says which operation produced the first NaN/Inf. ``--poison`` fills the CUDA caching
allocator's free memory with NaN before the model is built: a kernel that reads memory nothing
wrote then turns NaN at every share.

    python -m tests.gpu.sm_share_worker --model llama-1.3b --seq-len 2048 --batch 16 --micro 4
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import sys
import time
from typing import Any

import torch
import torch.distributed as dist
from torch import nn


def _finite(t: Any) -> bool:
    return not isinstance(t, torch.Tensor) or not t.is_floating_point() or bool(torch.isfinite(t).all())


class FirstNonFinite:
    """Records the first module output (forward) and the first input gradient (backward) that is
    not finite, in the order they happen."""

    def __init__(self, root: nn.Module) -> None:
        self.forward: str | None = None
        self.backward: str | None = None
        for name, mod in root.named_modules():
            mod.register_forward_hook(self._fwd(name or "<stage>"))
            mod.register_full_backward_hook(self._bwd(name or "<stage>"))

    def _fwd(self, name: str) -> Any:
        def hook(_m: nn.Module, inputs: Any, out: Any) -> None:
            outs = out if isinstance(out, tuple) else (out,)
            if self.forward is None and not all(_finite(o) for o in outs):
                ins = "finite" if all(_finite(i) for i in inputs) else "NOT finite"
                self.forward = f"{name} ({type(_m).__name__}; its inputs {ins})"
        return hook

    def _bwd(self, name: str) -> Any:
        def hook(_m: nn.Module, grad_in: Any, grad_out: Any) -> None:
            if self.backward is None and not all(_finite(g) for g in grad_in if g is not None):
                outs = "finite" if all(_finite(g) for g in grad_out if g is not None) else "NOT finite"
                self.backward = f"{name} ({type(_m).__name__}; gradient of its output {outs})"
        return hook


def _poison_cache() -> None:
    """Fill the caching allocator with NaN-filled blocks, then free them (they stay cached)."""
    free, _ = torch.cuda.mem_get_info()
    blocks, size = [], 1 << 30
    while free > 6 * size:
        blocks.append(torch.full((size // 4,), float("nan"), device="cuda"))
        free -= size
    for n in (256 << 20, 64 << 20, 8 << 20, 1 << 20, 64 << 10):
        blocks += [torch.full((n // 4,), float("nan"), device="cuda") for _ in range(8)]
    torch.cuda.synchronize()
    del blocks


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="llama-1.3b")
    ap.add_argument("--layers", type=int, default=0, help="keep the first N layers (0: all)")
    ap.add_argument("--seq-len", type=int, default=2048)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--micro", type=int, default=4)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--compile", action="store_true")
    ap.add_argument("--diagnose", action="store_true")
    ap.add_argument("--poison", action="store_true")
    ap.add_argument("--attention", default="", help="force one SDPA backend: cudnn, flash, efficient, math")
    ap.add_argument("--blas", default="", help="torch.backends.cuda.preferred_blas_library: cublas or cublaslt")
    ap.add_argument("--cpu", action="store_true", help="gloo on the CPU (a smoke test of this program)")
    args = ap.parse_args(argv)

    from executor.job.spawn import free_port
    from executor.model import fast_path
    from executor.parallel.groups import ProcessGroups
    from executor.train.engine import Engine
    from executor.train.optim import OptimConfig
    from planner.hf_config import resolve_model
    from planner.layout import build_topology
    from planner.plan import Pipeline, Plan, PlanOptions, Stage

    device = torch.device("cpu") if args.cpu else torch.device("cuda", 0)
    if not args.cpu:
        torch.cuda.set_device(0)
    sms = None if args.cpu else torch.cuda.get_device_properties(0).multi_processor_count
    out: dict[str, Any] = {"share": os.environ.get("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", "100"),
                           "sms": sms, "torch": torch.__version__,
                           "cudnn": torch.backends.cudnn.version(), "args": vars(args)}
    if args.blas:
        torch.backends.cuda.preferred_blas_library(args.blas)
    out["blas"] = None if args.cpu else str(torch.backends.cuda.preferred_blas_library())
    if args.poison:
        _poison_cache()
    if args.attention:
        from torch.nn.attention import SDPBackend
        one = {"cudnn": SDPBackend.CUDNN_ATTENTION, "flash": SDPBackend.FLASH_ATTENTION,
               "efficient": SDPBackend.EFFICIENT_ATTENTION, "math": SDPBackend.MATH}[args.attention]
        fast_path.attention_backends = lambda *a, **k: (one,)  # type: ignore[assignment]
    dist.init_process_group("gloo" if args.cpu else "nccl", init_method=f"tcp://127.0.0.1:{free_port()}",
                            rank=0, world_size=1, device_id=None if args.cpu else device)
    spec = resolve_model(args.model)
    spec = dataclasses.replace(spec, seq_len=args.seq_len,
                               num_layers=args.layers or spec.num_layers)
    pipe = Pipeline(batch_size=args.batch, micro_batches=args.micro,
                    stages=(Stage(("g:0",), 1, (0, spec.num_layers)),))
    plan = Plan(model=spec, global_batch_size=args.batch, pipelines=(pipe,), options=PlanOptions(dtype="bf16"))
    topo = build_topology(plan)
    t0 = time.perf_counter()
    engine = Engine(plan, topo, ProcessGroups.create(topo), device=device,
                    optim=OptimConfig(lr=3e-4, warmup_steps=1, fused=not args.cpu), seed=0)
    out["build_s"] = round(time.perf_counter() - t0, 1)
    if not args.cpu:  # what executor.model.gemm_check settled on
        out["blas_after"] = str(torch.backends.cuda.preferred_blas_library())
        get = getattr(torch._C, "_get_sm_carveout_experimental", None)
        out["sm_carveout"] = get() if get else None
    out["params_finite"] = all(_finite(p) for p in engine.module.parameters())
    if args.compile:
        fast_path.compile_blocks(engine.module, head=True)
    probe = FirstNonFinite(engine.module) if args.diagnose else None
    gen = torch.Generator().manual_seed(7)
    losses, norms = [], []
    for _ in range(args.steps):
        tokens = torch.randint(0, spec.vocab_size, (args.batch, args.seq_len + 1), generator=gen)
        try:
            st = engine.train_step(tokens)
        except Exception as exc:  # noqa: BLE001 - the non-finite guard's stop is a finding here
            out["error"] = str(exc)[:300]
            break
        losses.append(st.loss)
        norms.append(st.grad_norm)
        if not (math.isfinite(st.loss) and math.isfinite(st.grad_norm)):
            break
    finite = "error" not in out and all(math.isfinite(x) for x in losses + norms)
    out.update(losses=losses, grad_norms=norms, finite=finite)
    if probe is not None:
        out.update(first_nonfinite_forward=probe.forward, first_nonfinite_backward=probe.backward)
    print("SMSHARE " + json.dumps(out), flush=True)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
