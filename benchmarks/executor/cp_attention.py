"""One CP rank's attention at long context, on one GPU, kernel against kernel (issue 35).

For every CP rank ``r`` of ``--cp`` at ``--seq-len`` tokens (llama-1.3b's 16 heads of 128 by
default): the rank's queries (chunks ``r`` and ``2cp-1-r``) over the gathered K/V, forward and
backward, with

* ``blockwise/<kernel>``: the executor's path (:mod:`executor.parallel.cp_blockwise`): pieces on
  a flash kernel that returns the log-sum-exp, merged; ``cuda-flash`` and ``cuda-cudnn`` kernels;
* ``masked``: the old path, one SDPA call per chunk under the lower-right causal mask;
* ``dense``: causal attention over the whole sequence on the dense path's kernel
  (:func:`executor.model.fast_path.causal_attention`), divided by ``cp``: a perfectly balanced
  rank's share of the same work.

The all-gather and reduce-scatter are not in these times (no communication: K/V are made whole
here). Each variant is checked against the dense path's rows (output, dQ) and, summed over the
ranks, its dK/dV. The table gives the slowest rank's milliseconds, its TFLOP/s (the causal
``S²/2`` pairs' forward and backward FLOPs, ``/cp``), and that as a share of the dense share: what
``cp_attention_efficiency`` is relative to the dense kernel.

    python -m benchmarks.executor.cp_attention [--seq-len 65536 --cp 4 --kernels cuda-flash,cuda-cudnn]

Expected time: under a minute on one H100.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

import torch

from benchmarks.executor.run_meta import run_versions


def _variants(kernels: list[str]) -> dict[str, Any]:
    """name -> fn(q_local, kv [2,b,H,S,d], dout_local, cp, r) -> (out, dq, dkv) of one rank."""
    from executor.model import fast_path
    from executor.parallel.attention_pieces import KERNELS
    from executor.parallel.context_parallel import masked_local
    from executor.parallel.cp_blockwise import local_backward, local_forward

    out: dict[str, Any] = {}
    for name in kernels:
        kernel = KERNELS[name]

        def blockwise(q: torch.Tensor, kv: torch.Tensor, dout: torch.Tensor, cp: int, r: int,
                      kernel: Any = kernel) -> tuple[torch.Tensor, ...]:
            o, lse, aux = local_forward(q, kv, cp, r, kernel)
            dq, dkv = local_backward(dout, q, kv, o, lse, aux, cp, r, kernel)
            return o, dq, dkv
        out[f"blockwise/{name}"] = blockwise

    def masked(q: torch.Tensor, kv: torch.Tensor, dout: torch.Tensor, cp: int, r: int) -> tuple[torch.Tensor, ...]:
        from torch.nn.attention.bias import causal_lower_right

        q = q.detach().requires_grad_(True)
        kv = kv.detach().requires_grad_(True)
        backends = fast_path.attention_backends(q.device, q.shape[-1])
        o = masked_local(q, kv, cp, r, backends, lambda a, b: causal_lower_right(b - a, b))
        dq, dkv = torch.autograd.grad(o, (q, kv), dout)
        return o, dq, dkv
    out["masked"] = masked
    return out


def run(args: argparse.Namespace) -> dict[str, Any]:
    from executor.model import fast_path
    from executor.parallel.context_parallel import split_sequence
    from executor.profiler.timing import time_call

    dev = torch.device("cuda")
    torch.manual_seed(0)
    b, h, d, seq, cp = 1, args.heads, args.head_dim, args.seq_len, args.cp
    q, k, v, dout = (torch.randn(b, h, seq, d, device=dev, dtype=torch.bfloat16) for _ in range(4))
    backends = fast_path.attention_backends(dev, d)

    def dense() -> tuple[torch.Tensor, ...]:
        qq, kk, vv = (t.detach().requires_grad_(True) for t in (q, k, v))
        o = fast_path.causal_attention(qq, kk, vv, backends)
        return (o, *torch.autograd.grad(o, (qq, kk, vv), dout))

    ref_o, ref_dq, ref_dk, ref_dv = dense()
    dense_s = time_call(dense, dev, 1, args.repeats)
    flops = 4 * b * h * d * seq * seq / 2 * (1 + 2.5)  # causal pairs; backward 2.5x the forward
    rows: list[dict[str, Any]] = [{"variant": "dense / cp", "slowest_rank_ms": dense_s / cp * 1e3,
                                   "tflops": flops / cp / (dense_s / cp) / 1e12, "of_dense": 1.0, "max_err": 0.0}]
    kv = torch.stack([k, v])
    for name, fn in _variants(args.kernels.split(",")).items():
        try:
            per_rank, err = [], 0.0
            dkv_sum = torch.zeros(kv.shape, dtype=torch.float32, device=dev)
            for r in range(cp):
                ql, dl = split_sequence(q, cp, r, -2), split_sequence(dout, cp, r, -2)
                o, dq, dkv = fn(ql, kv, dl, cp, r)
                err = max(err, (o.float() - split_sequence(ref_o, cp, r, -2).float()).abs().max().item(),
                          (dq.float() - split_sequence(ref_dq, cp, r, -2).float()).abs().max().item())
                dkv_sum += dkv.float()
                del o, dq, dkv
                def once(ql: torch.Tensor = ql, dl: torch.Tensor = dl, r: int = r, fn: Any = fn) -> None:
                    fn(ql, kv, dl, cp, r)
                per_rank.append(time_call(once, dev, 1, args.repeats))
            err = max(err, (dkv_sum[0] - ref_dk.float()).abs().max().item(),
                      (dkv_sum[1] - ref_dv.float()).abs().max().item())
            slow = max(per_rank)
            rows.append({"variant": name, "slowest_rank_ms": slow * 1e3, "per_rank_ms": [t * 1e3 for t in per_rank],
                         "tflops": flops / cp / slow / 1e12, "of_dense": dense_s / cp / slow, "max_err": err})
        except Exception as exc:  # noqa: BLE001 - a kernel this build lacks is a row, not a crash
            rows.append({"variant": name, "error": f"{type(exc).__name__}: {exc}"[:300]})
        torch.cuda.empty_cache()
    ref_scale = max(ref_o.abs().max().item(), ref_dq.abs().max().item(), ref_dk.abs().max().item())
    from executor.parallel.attention_pieces import cuda_kernel

    return {**run_versions(True), "seq_len": seq, "cp": cp, "heads": h, "head_dim": d,
            "executor_kernel": cuda_kernel(dev, d).name,
            "dense_backends": [str(x) for x in backends], "reference_max_abs": ref_scale, "rows": rows}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seq-len", type=int, default=65536)
    ap.add_argument("--cp", type=int, default=4)
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--kernels", default="cuda-flash,cuda-cudnn",
                    help="piece kernels (executor.parallel.attention_pieces)")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--out", default="benchmarks/results")
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("cp_attention: needs a CUDA GPU (it times CUDA kernels)", file=sys.stderr)
        return 2
    res = run(args)
    print(f"| variant | slowest rank ms | TFLOP/s | of dense | max abs err (ref max {res['reference_max_abs']:.3g}) |")
    print("|---|---:|---:|---:|---:|")
    for r in res["rows"]:
        if "error" in r:
            print(f"| {r['variant']} | error: {r['error']} | | | |")
        else:
            print(f"| {r['variant']} | {r['slowest_rank_ms']:.2f} | {r['tflops']:.0f} | {r['of_dense']:.2f} "
                  f"| {r['max_err']:.3g} |")
    path = Path(args.out) / f"cp_attention_{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(res, indent=1))
    print(f"the executor's CP kernel here: {res['executor_kernel']}; wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
