"""Does a bf16 residual stream (``options.residual_dtype``) train as well as the fp32 one?

The same model, initialisation and batches of real text, trained twice on one GPU with compiled
blocks (the peers' setting): residual fp32, then bf16. Prints the mean loss over each window of
steps for both and the relative gap; writes JSON with device, versions and date. The text is the
running Python's standard library sources (every ``*.py`` file, sorted), read as bytes: tokens
are bytes, so no tokenizer or download is needed, and every machine with the same Python has the
same corpus.

    python -m benchmarks.executor.residual_quality --out $OUT            # one GPU, ~2 minutes
    .venv/bin/python -m benchmarks.executor.residual_quality --cpu-smoke  # tiny, CPU, gloo
"""

from __future__ import annotations

import argparse
import json
import statistics
import sysconfig
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from benchmarks.executor.run_meta import run_versions
from executor.job.spawn import free_port
from planner.model import ModelSpec
from planner.plan import Pipeline, Plan, PlanOptions, Stage

RESIDUALS = ("fp32", "bf16")


def corpus_bytes(limit: int, root: Path | None = None) -> np.ndarray:
    """Up to ``limit`` bytes of the standard library's sources (sorted paths, concatenated)."""
    root = root or Path(sysconfig.get_paths()["stdlib"])
    chunks, total = [], 0
    for path in sorted(root.rglob("*.py")):
        if "site-packages" in path.parts or "test" in path.parts:
            continue
        data = path.read_bytes()
        chunks.append(np.frombuffer(data, dtype=np.uint8))
        total += len(data)
        if total >= limit:
            break
    if not chunks:
        raise SystemExit(f"no *.py files under {root}")
    return np.concatenate(chunks)[:limit]


def batches(stream: np.ndarray, *, steps: int, batch: int, seq: int, seed: int) -> torch.Tensor:
    """``[steps, batch, seq + 1]`` token rows cut at seeded random offsets of ``stream``."""
    rng = np.random.default_rng(seed)
    starts = rng.integers(0, len(stream) - seq - 1, size=(steps, batch))
    rows = stream[starts[..., None] + np.arange(seq + 1)]
    return torch.from_numpy(rows.astype(np.int64))


def train(model: ModelSpec, residual: str, data: torch.Tensor, *, cuda: bool, lr: float) -> list[float]:
    """Losses of ``len(data)`` steps of one stage on this process's device."""
    from executor.model import fast_path
    from executor.parallel.groups import ProcessGroups
    from executor.train.engine import Engine
    from executor.train.optim import OptimConfig
    from planner.layout import build_topology

    batch = data.shape[1]
    dtype = "bf16" if cuda else "fp32"
    pipe = Pipeline(batch, 1, (Stage(("g:0",), 1, (0, model.num_layers)),))
    plan = Plan(model, batch, (pipe,), PlanOptions(dtype=dtype, residual_dtype=residual if cuda else "fp32"))
    topo = build_topology(plan)
    device = torch.device("cuda", 0) if cuda else torch.device("cpu")
    engine = Engine(plan, topo, ProcessGroups.create(topo), device=device, seed=0,
                    optim=OptimConfig(lr=lr, min_lr=lr / 10, warmup_steps=max(1, len(data) // 10),
                                      total_steps=len(data)))
    if cuda:
        fast_path.compile_blocks(engine.module)
    return [engine.train_step(rows.pin_memory() if cuda else rows).loss for rows in data]


def windows(losses: list[float], n: int) -> list[float]:
    return [statistics.fmean(losses[i:i + n]) for i in range(0, len(losses), n)]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--layers", type=int, default=24)
    ap.add_argument("--hidden", type=int, default=1024)
    ap.add_argument("--seq", type=int, default=1024)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--window", type=int, default=50, help="steps per reported mean")
    ap.add_argument("--out", default="benchmarks/results")
    ap.add_argument("--cpu-smoke", action="store_true", help="tiny model, 4 steps, CPU")
    args = ap.parse_args(argv)
    cuda = torch.cuda.is_available() and not args.cpu_smoke
    if not cuda and not args.cpu_smoke:
        ap.error("no CUDA device: use --cpu-smoke")
    if args.cpu_smoke:
        args.steps, args.layers, args.hidden, args.seq, args.batch, args.window = 4, 2, 64, 32, 2, 2
    heads = max(1, args.hidden // 64)
    model = ModelSpec("byte-lm", num_layers=args.layers, hidden_size=args.hidden,
                      ffn_hidden_size=(8 * args.hidden // 3 + 127) // 128 * 128, num_heads=heads,
                      num_kv_heads=heads, vocab_size=256, seq_len=args.seq)
    data = batches(corpus_bytes(64 << 20), steps=args.steps, batch=args.batch, seq=args.seq, seed=0)
    if cuda:
        torch.cuda.set_device(0)
    dist.init_process_group("nccl" if cuda else "gloo", init_method=f"tcp://127.0.0.1:{free_port()}",
                            rank=0, world_size=1)
    try:
        runs = {r: train(model, r, data, cuda=cuda, lr=args.lr) for r in RESIDUALS}
    finally:
        dist.destroy_process_group()
    means = {r: windows(v, args.window) for r, v in runs.items()}
    print(f"{'steps':>11}  {'fp32 residual':>14}  {'bf16 residual':>14}  {'gap':>8}")
    for i, (a, b) in enumerate(zip(means["fp32"], means["bf16"])):
        lo, hi = i * args.window, min((i + 1) * args.window, args.steps) - 1
        print(f"{lo:>5}-{hi:<5}  {a:>14.4f}  {b:>14.4f}  {100 * (b - a) / a:>+7.2f}%")
    gap = (means["bf16"][-1] - means["fp32"][-1]) / means["fp32"][-1]
    print(f"last window: bf16 residual {100 * gap:+.2f} % against fp32")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    meta: dict[str, Any] = {"benchmark": "residual_quality", **run_versions(cuda), "model": model.to_dict(),
                            "steps": args.steps, "batch": args.batch, "lr": args.lr, "window": args.window,
                            "corpus": "python stdlib *.py bytes (sorted, tests excluded)"}
    stamp = meta["date"].replace("-", "").replace(":", "")
    path = out / f"residual_quality_{'cpu-smoke' if args.cpu_smoke else 'gpu'}_{stamp}.json"
    path.write_text(json.dumps({**meta, "losses": runs, "window_means": means, "last_window_gap": gap}, indent=1))
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
