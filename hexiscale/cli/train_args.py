"""Command-line arguments of ``hexiscale train`` and the :class:`TrainConfig` they make; no torch here."""

from __future__ import annotations

import argparse

from executor.train_config import TrainConfig
from planner.seed_flags import SeedLayout, add_seed_flag_arguments


def add_train_arguments(p: argparse.ArgumentParser) -> None:
    layout = p.add_argument_group("layout (a plan file, or the seed-style flags with --cluster and --model)")
    layout.add_argument("--plan", help="plan file (JSON)")
    layout.add_argument("--cluster", help="cluster file: checks the plan's devices, gives MFU peaks; "
                        "needed with seed-style flags")
    layout.add_argument("--model", help="model preset or config.json (seed-style flags)")
    layout.add_argument("--seq-len", type=int, dest="seq_len", help="sequence length (seed-style flags)")
    layout.add_argument("--recompute", default="none", choices=("none", "selective", "full"))
    layout.add_argument("--zero", type=int, default=0, choices=(0, 1))
    layout.add_argument("--dtype", default="bf16", choices=("fp32", "bf16", "fp16"),
                        help="compute dtype for seed-style flags (a plan file carries its own)")
    add_seed_flag_arguments(layout)

    run = p.add_argument_group("training")
    run.add_argument("--steps", type=int, default=10, help="train until this many optimizer steps are done "
                     "(counting steps before a resume)")
    data = run.add_mutually_exclusive_group()
    data.add_argument("--data", help="token file (PATH, PATH.bin or PATH.idx; see 'hexiscale data')")
    data.add_argument("--synthetic", action="store_true", help="synthetic tokens (the default)")
    run.add_argument("--seed", type=int, default=0, help="model init and data order seed")
    run.add_argument("--lr", type=float, default=3e-4)
    run.add_argument("--min-lr", type=float, default=None, help="final LR of the cosine (default lr/10)")
    run.add_argument("--warmup", type=int, default=None, help="warm-up steps (default min(100, steps/10))")
    run.add_argument("--weight-decay", type=float, default=0.1)
    run.add_argument("--clip", type=float, default=1.0, help="max global gradient norm (<= 0: no clipping)")
    run.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"),
                     help="auto: cuda:LOCAL_RANK when CUDA is available (NCCL), else CPU (gloo)")

    ck = p.add_argument_group("checkpoints and logs")
    ck.add_argument("--checkpoint-dir", help="write checkpoints here (DIR/step-NNNNNN, DIR/latest)")
    ck.add_argument("--save-every", type=int, default=0, help="save every N steps (and at the end); 0: at the end")
    ck.add_argument("--resume", help="checkpoint directory, or a --checkpoint-dir (its latest checkpoint); "
                    "any plan of the same model")
    ck.add_argument("--log-jsonl", help="rank 0 appends one JSON record per step here")
    ck.add_argument("--log-every", type=int, default=1, help="print every N steps")
    run.add_argument("--on-nonfinite", default="stop", choices=("stop", "skip"), dest="on_nonfinite",
                     help="a NaN/Inf loss or gradient norm: stop the job before the update (default), or skip "
                          "the step (weights unchanged; 10 in a row stop the job)")

    ops = p.add_argument_group("failure handling")
    ops.add_argument("--heartbeat", type=float, default=1.0, help="heartbeat interval, seconds")
    ops.add_argument("--dead-after", type=float, default=30.0,
                     help="a rank silent this long is dead; the job stops (seconds)")
    ops.add_argument("--hang-after", type=float, default=1800.0,
                     help="no step finished this long: the job is hung and stops (seconds)")
    ops.add_argument("--startup-timeout", type=float, default=600.0,
                     help="how long ranks wait for each other at start-up and pre-flight (seconds)")
    ops.add_argument("--pg-timeout", type=float, default=None,
                     help="process-group collective timeout, seconds (default: --hang-after + 300, so the "
                          "watchdog names a stuck rank before NCCL aborts a waiting one)")


def train_config(args: argparse.Namespace) -> TrainConfig:
    """The typed config of parsed ``hexiscale train`` arguments."""
    return TrainConfig(
        plan=args.plan, cluster=args.cluster, seed_layout=SeedLayout.from_args(args), steps=args.steps,
        data=args.data, seed=args.seed, lr=args.lr, min_lr=args.min_lr, warmup=args.warmup,
        weight_decay=args.weight_decay, clip=args.clip, device=args.device, checkpoint_dir=args.checkpoint_dir,
        save_every=args.save_every, resume=args.resume, log_jsonl=args.log_jsonl, log_every=args.log_every,
        on_nonfinite=args.on_nonfinite,
        heartbeat=args.heartbeat, dead_after=args.dead_after, hang_after=args.hang_after,
        startup_timeout=args.startup_timeout, pg_timeout=args.pg_timeout)
