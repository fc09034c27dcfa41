"""Command-line arguments of ``hexiscale train`` and the :class:`TrainConfig` they make; no torch here."""

from __future__ import annotations

import argparse

from executor.train_config import TrainConfig
from planner.errors import SpecError
from planner.seed_layout import SeedLayout, add_seed_flag_arguments

DEFAULT_STEPS = 10
# TrainConfig field -> its flag, for train_argv (plan, device and the seed layout travel otherwise)
FLAGS = {"cluster": "--cluster", "steps": "--steps", "data": "--data", "seed": "--seed", "lr": "--lr",
         "min_lr": "--min-lr", "warmup": "--warmup", "weight_decay": "--weight-decay", "clip": "--clip",
         "checkpoint_dir": "--checkpoint-dir", "save_every": "--save-every", "async_save": "--async-save",
         "resume": "--resume",
         "log_jsonl": "--log-jsonl", "log_every": "--log-every", "tensorboard": "--tensorboard", "trace": "--trace",
         "trace_steps": "--trace-steps", "heartbeat": "--heartbeat", "dead_after": "--dead-after",
         "hang_after": "--hang-after", "startup_timeout": "--startup-timeout", "pg_timeout": "--pg-timeout",
         "step_tokens": "--step-tokens", "lengths": "--lengths", "assign": "--assign", "stop_at": "--stop-at",
         "on_nonfinite": "--on-nonfinite", "compile": "--compile", "recompute": "--recompute", "zero": "--zero",
         "dtype": "--dtype"}
NOT_FLAGS = ("plan", "device", "seed_layout")


def add_train_arguments(p: argparse.ArgumentParser) -> None:
    layout = p.add_argument_group("layout (a plan file, or the seed-style flags with --cluster and --model)")
    layout.add_argument("--plan", help="plan file (JSON), or a strategy pool ('hexiscale plan --lengths -o'): "
                        "mixed-length data with hot switching")
    layout.add_argument("--cluster", help="cluster file: checks the plan's devices, gives MFU peaks; "
                        "needed with seed-style flags and with a strategy pool")
    layout.add_argument("--model", help="model preset or config.json (seed-style flags)")
    layout.add_argument("--seq-len", type=int, dest="seq_len", help="sequence length (seed-style flags)")
    layout.add_argument("--recompute", choices=("none", "selective", "full"),
                        help="activation recomputation (default none; with a plan file: replaces its "
                        "options.recompute)")
    layout.add_argument("--zero", type=int, choices=(0, 1),
                        help="ZeRO stage (default 0; with a plan file: replaces its options.zero)")
    layout.add_argument("--dtype", choices=("fp32", "bf16", "fp16"),
                        help="compute dtype (default bf16; with a plan file: replaces its options.dtype)")
    add_seed_flag_arguments(layout)

    run = p.add_argument_group("training")
    run.add_argument("--steps", type=int, help="train until this many optimizer steps are done (counting steps "
                     "before a resume; default 10, or the seed's --run-iter // --accum-iter)")
    run.add_argument("--stop-at", type=int, default=None, dest="stop_at", help="stop (and save) after this step; "
                     "the learning-rate schedule still spans --steps (a job run in parts, e.g. a restart)")
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
    run.add_argument("--compile", action="store_true",
                     help="compile every transformer block (and a TP-1 last stage's loss) with torch.compile: "
                          "CUDA only (a CPU run stays eager and says so); the first step compiles")

    mixed = p.add_argument_group("mixed-length data (--plan is a strategy pool; --data: documents cut to the "
                                 "context)")
    mixed.add_argument("--step-tokens", type=int, dest="step_tokens", help="tokens of a step's global batch")
    mixed.add_argument("--lengths", metavar="HISTOGRAM", help="without --data: synthetic sequences with these "
                       "lengths (hexiscale.lengths/1 file, or synthetic:commoncrawl|github)")
    mixed.add_argument("--assign", default="cost", choices=("cost", "threshold"),
                       help="sequences to strategies: by estimated cost, or by the strategies' length buckets")

    ck = p.add_argument_group("checkpoints and logs")
    ck.add_argument("--checkpoint-dir", help="write checkpoints here (DIR/step-NNNNNN, DIR/latest)")
    ck.add_argument("--save-every", type=int, default=0, help="save every N steps (and at the end); 0: at the end")
    ck.add_argument("--async-save", action="store_true", dest="async_save",
                    help="write checkpoints in the background while training goes on (completed at the next "
                    "save or the end)")
    ck.add_argument("--resume", help="checkpoint directory, or a --checkpoint-dir (its latest checkpoint); "
                    "any plan of the same model")
    ck.add_argument("--log-jsonl", help="rank 0 appends one JSON record per step here")
    ck.add_argument("--log-every", type=int, default=1, help="print every N steps")
    ck.add_argument("--tensorboard", metavar="DIR", help="rank 0 also writes the per-step metrics as TensorBoard "
                    "scalars to DIR (needs the tensorboard package)")
    ck.add_argument("--trace", metavar="FILE", help="record per-micro-batch events of a few steps on every rank; "
                    "rank 0 writes them to FILE ('hexiscale show FILE --plot DIR' draws them)")
    ck.add_argument("--trace-steps", type=int, default=3, help="steps --trace records, after the run's first")
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
    layout = SeedLayout.from_args(args)
    seed_steps = layout.steps()
    if seed_steps is not None and args.steps is not None:
        raise SpecError("--run-iter", "given together with --steps", "use one of them")
    return TrainConfig(
        plan=args.plan, cluster=args.cluster, seed_layout=layout,
        steps=args.steps if args.steps is not None else seed_steps if seed_steps is not None else DEFAULT_STEPS,
        stop_at=args.stop_at,
        data=args.data, seed=args.seed, lr=args.lr, min_lr=args.min_lr, warmup=args.warmup,
        weight_decay=args.weight_decay, clip=args.clip, device=args.device, checkpoint_dir=args.checkpoint_dir,
        save_every=args.save_every, async_save=args.async_save, resume=args.resume, log_jsonl=args.log_jsonl,
        log_every=args.log_every, tensorboard=args.tensorboard, trace=args.trace, trace_steps=args.trace_steps,
        on_nonfinite=args.on_nonfinite, compile=args.compile, recompute=args.recompute, zero=args.zero,
        dtype=args.dtype,
        heartbeat=args.heartbeat, dead_after=args.dead_after, hang_after=args.hang_after,
        startup_timeout=args.startup_timeout, pg_timeout=args.pg_timeout, step_tokens=args.step_tokens,
        lengths=args.lengths, assign=args.assign)


def train_argv(config: TrainConfig) -> list[str]:
    """The ``hexiscale train`` arguments that make ``config`` again, less ``--plan``, ``--device``
    and the seed layout (for a launcher that adds its own plan file and device)."""
    out: list[str] = []
    for name, flag in FLAGS.items():
        value = getattr(config, name)
        if isinstance(value, bool):
            out += [flag] if value else []
        elif value is not None:
            out += [flag, repr(value) if isinstance(value, float) else str(value)]
    return out
