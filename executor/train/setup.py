"""Helpers of ``executor.train.entry``: the plan from the arguments, optimizer settings, the process
group, checkpoint directories and the classification of errors into exit codes."""

from __future__ import annotations

import errno
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from executor.job.env import RankEnv
from executor.job.watchdog import EXIT_OOM, EXIT_RANK_FAILURE, EXIT_USER_ERROR
from executor.model.gemm_check import GemmCheckError
from executor.train.config import TrainConfig
from executor.train.flag_modes import apply_option_flags, check_flags
from executor.train.nonfinite import NonFiniteStep
from executor.train.optim import OptimConfig
from planner.cluster import ClusterSpec, load_cluster
from planner.errors import SpecError
from planner.plan import Plan
from planner.validate import validate
from planner.varlen.pool import StrategyPool, load_plan_or_pool


def resolve_plan(args: TrainConfig, *, elastic: bool = False, say: Callable[[str], None] | None = None,
                 ) -> tuple[Plan, ClusterSpec | None, StrategyPool | None]:
    """``--plan`` (checked against ``--cluster`` when given) or the seed-style flags; a strategy
    pool as ``--plan`` gives its home plan (which numbers the ranks) and the pool. The flags are
    checked against the mode (``elastic``, else pool or plan; :mod:`executor.train.flag_modes`), and the
    plan-option flags rewrite a plan's options (``say`` gets the line that says so)."""
    cluster = load_cluster(args.layout.cluster) if args.layout.cluster else None
    pool = None
    if args.layout.plan:
        check_flags(args, "elastic" if elastic else "plan", seed_only=True)  # before reading the file
        plan, pool = load_plan_or_pool(args.layout.plan)
    else:
        if args.layout.seed_layout.hetero_configs is None:
            raise SpecError("--plan", "missing", "pass --plan PLAN.json, or the seed-style flags (with --model "
                            "or --model-size, and --cluster unless every device is on this machine)")
        plan = args.layout.seed_layout.plan(args.layout.cluster)
    check_flags(args, ("elastic_pool" if pool is not None else "elastic") if elastic
                else "pool" if pool is not None else "plan")
    if pool is not None and cluster is None:
        raise SpecError("--cluster", "missing", "a strategy pool's dispatch needs the cluster file it was planned for")
    if pool is None and not elastic:  # elastic: every epoch's plan is the supervisor's (--compile acts per epoch)
        plan, line = apply_option_flags(plan, args)
        if line is not None and say is not None:
            say(line)
    if cluster is not None:
        for i, st in enumerate(pool.strategies if pool is not None else ()):
            try:
                validate(st.plan, cluster)
            except SpecError as exc:
                raise SpecError(f"strategies[{i}].plan" + (f".{exc.path}" if exc.path else ""), exc.message,
                                exc.hint, args.layout.plan) from None
        validate(plan, cluster)
    return plan, cluster, pool


def check_world(plan: Plan, renv: RankEnv) -> None:
    if renv.world_size != plan.world_size:
        n = renv.world_size
        started = f"{n} processes were started" if n != 1 else "1 process was started"
        raise SpecError("WORLD_SIZE", f"{started}, the plan has "
                        f"{plan.world_size} ranks (one per device)",
                        f"start {plan.world_size} processes, e.g. with 'hexiscale launch'")


def optim_config(args: TrainConfig) -> OptimConfig:
    steps = max(1, args.run.steps)
    warmup = args.optim.warmup if args.optim.warmup is not None else min(100, steps // 10)
    min_lr = args.optim.min_lr if args.optim.min_lr is not None else args.optim.lr / 10
    try:
        return OptimConfig(lr=args.optim.lr, min_lr=min_lr, warmup_steps=warmup, total_steps=steps,
                           weight_decay=args.optim.weight_decay, grad_clip=args.optim.clip)
    except ValueError as exc:
        raise SpecError("--lr", str(exc), "check --lr, --min-lr, --warmup and --steps") from None


def pg_timeout(args: TrainConfig) -> float:
    """The process group's timeout: it must exceed ``--hang-after`` (see :mod:`executor.job.watchdog`;
    :class:`TrainConfig` checks a given one)."""
    return args.faults.hang_after + 300.0 if args.faults.pg_timeout is None else args.faults.pg_timeout


def init_process_group(renv: RankEnv, store: Any, device: torch.device, timeout_s: float) -> str:
    """The default process group on a prefix of our store, with our (plan) rank numbering.

    On CUDA the group is bound to this rank's device (``device_id``): NCCL then creates its
    communicator now, and every ``new_group`` is split off it eagerly (:mod:`executor.parallel.groups`)."""
    backend = "nccl" if device.type == "cuda" else "gloo"
    if device.type == "cuda":
        torch.cuda.set_device(device)
    dist.init_process_group(backend, store=dist.PrefixStore(f"{renv.prefix}/pg", store), rank=renv.rank,
                            world_size=renv.world_size, timeout=timedelta(seconds=timeout_s),
                            device_id=device if device.type == "cuda" else None)
    return backend


def is_host_oom(exc: BaseException) -> bool:
    """CPU allocation failures: Python's/numpy's ``MemoryError`` and torch's CPU allocator error
    (a ``RuntimeError``, not ``torch.OutOfMemoryError``, which is CUDA's)."""
    if isinstance(exc, MemoryError):
        return True
    text = str(exc)
    return isinstance(exc, RuntimeError) and ("DefaultCPUAllocator" in text or "can't allocate memory" in text)


def classify(exc: BaseException) -> tuple[str, int, bool]:
    """(reason, exit code, may be a symptom of another rank's failure)."""
    if isinstance(exc, SpecError):
        return str(exc), EXIT_USER_ERROR, False
    if isinstance(exc, (NonFiniteStep, GemmCheckError)):
        return str(exc), EXIT_RANK_FAILURE, False
    if isinstance(exc, torch.OutOfMemoryError):
        return f"out of memory: {exc}".splitlines()[0], EXIT_OOM, False
    if is_host_oom(exc):
        return f"out of host memory: {type(exc).__name__}: {exc}".splitlines()[0][:300], EXIT_OOM, False
    if isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT):  # e.g. a checkpoint's pieces
        return (f"the disk is full: cannot write {exc.filename or 'a file'} ({exc.strerror}); the checkpoints "
                "completed before are kept (free space, then continue with --resume)", EXIT_RANK_FAILURE, False)
    text = f"{type(exc).__name__}: {exc}".splitlines()[0][:300]
    comm_words = ("gloo", "nccl", "connection", "socket", "timed out", "timeout", "peer", "broken pipe")
    comm = isinstance(exc, dist.DistError) or any(w in str(exc).lower() for w in comm_words)
    return text, EXIT_RANK_FAILURE, comm
