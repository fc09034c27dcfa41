"""``hexiscale train``: train a plan, one process per device (run it under torchrun or
``hexiscale launch``; a lone process is rank 0 of 1). torch is imported only when it runs.

A seed user's line (``--hetero_configs ... --model-size ... --run-iter ...``, see
:mod:`planner.seed_layout`) typed without a launcher around it (no ``WORLD_SIZE`` in the
environment) starts the plan's ranks on this machine itself, as ``hexiscale launch --local`` would.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

from executor.train.config import TrainConfig
from hexiscale.cli.train_args import add_train_arguments, train_argv, train_config
from hexiscale.launch.own_address import own_address
from planner.plan import save_plan


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser("train", help="train a plan (one process per device; see 'hexiscale launch')",
                       description="Train a plan (or seed-style flags) under torchrun or 'hexiscale launch'. "
                       "Exit codes: 0 ok, 1 user error, 3 rank failure, 4 out of memory.")
    add_train_arguments(p)
    p.set_defaults(func=run)


def _seed_environment(args: argparse.Namespace) -> None:
    """The seed's --master_addr/--master_port/--current_device, where the launcher set nothing."""
    if args.master_addr:
        os.environ.setdefault("MASTER_ADDR", args.master_addr)
    if args.master_port is not None:
        os.environ.setdefault("MASTER_PORT", str(args.master_port))
    if args.current_device is not None:
        os.environ.setdefault("LOCAL_RANK", str(args.current_device))


def _launch_here(config: TrainConfig, master_addr: str, master_port: int | None) -> int | None:
    """Start the seed layout's ranks on this machine (None: a one-rank plan runs in this process);
    their store listens on ``master_addr`` (this machine's, checked) and ``master_port``."""
    plan = config.layout.seed_layout.plan(config.layout.cluster)
    if plan.world_size == 1:
        return None
    from executor.model.devices import cuda_device_count
    from hexiscale.launch.local import run_local

    device = config.run.device
    if device == "auto":
        device = "cuda" if cuda_device_count() >= plan.world_size else "cpu"
    for note in config.layout.seed_layout.notes():
        print(f"hexiscale train: {note}", file=sys.stderr, flush=True)
    print(f"hexiscale train: no launcher around this process: starting the plan's {plan.world_size} ranks here "
          f"(as 'hexiscale launch --local'), {config.run.steps} steps", file=sys.stderr, flush=True)
    with tempfile.TemporaryDirectory(prefix="hexiscale-seed-") as tmp:
        path = Path(tmp) / "plan.json"
        save_plan(plan, path)
        return run_local(str(path), plan.world_size, train_argv(config), device=device, run_id="seed-flags",
                         store_port=master_port or 0, store_addr=master_addr)


def run(args: argparse.Namespace) -> int:
    config = train_config(args)
    _seed_environment(args)
    if config.layout.seed_layout.given() and not config.layout.plan and "WORLD_SIZE" not in os.environ:
        addr = own_address(args.master_addr, "--master_addr") if args.master_addr else "127.0.0.1"
        code = _launch_here(config, addr, args.master_port)
        if code is not None:
            return code
    import torch

    from executor.train.entry import run_training

    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", torch.get_num_threads())))
    return run_training(config)
